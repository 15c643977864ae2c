"""Dassl's ``DatasetWrapper`` with unreadable images named and replaced, and per-draw seeding.

In training, an image that cannot be decoded is replaced by a readable
image of the same domain; in evaluation the sample is flagged ``valid=False``
and the DAEL trainer leaves it out. Each sample carries ``bad_path`` ("" when
fine) so the trainer can log and count the bad files.

A training key is an ``(index, draw_seed)`` pair from the plugin's samplers
(:mod:`dael_plugin.data.sampling`): the draw's augmentations and replacement
are seeded from ``draw_seed`` alone, so long-lived workers need no reseeding
and resume is exact. A plain index (evaluation, or Dassl's own samplers) reads
as Dassl does.
"""

from __future__ import annotations

import contextlib
import random

from dassl.data.data_manager import DatasetWrapper
from PIL import Image
from yacs.config import CfgNode as CN

from dael_plugin.data.images import ReplacingReader
from dael_plugin.data.sampling import DrawPicker, held_rng, seeded_draw


class RobustDatasetWrapper(DatasetWrapper):
    def __init__(self, cfg: CN, data_source, transform=None, is_train=False):
        super().__init__(cfg, data_source, transform=transform, is_train=is_train)
        self.reader = ReplacingReader([d.impath for d in data_source], [d.domain for d in data_source])

    def __getitem__(self, key):
        if isinstance(key, (tuple, list)):
            idx, seed = int(key[0]), int(key[1])
            pick, draw = DrawPicker(seed), seeded_draw(seed)
        else:
            idx, pick, draw = int(key), (lambda m: m[random.randrange(len(m))]), contextlib.nullcontext()
        idx, img0, bad_path = self.reader.read(idx, self.is_train, pick)
        item = self.data_source[idx]
        out = {
            "label": item.label,
            "domain": item.domain,
            "impath": item.impath,
            "index": idx,
            "bad_path": bad_path,
            "valid": img0 is not None,
        }
        if img0 is None:
            img0 = Image.new("RGB", (8, 8))
        tfms = self.transform if isinstance(self.transform, (list, tuple)) else [self.transform]
        with draw:
            for i, tfm in enumerate(tfms):
                out["img" if i == 0 else f"img{i + 1}"] = self._transform_image(tfm, img0) if tfm is not None else img0
        if self.return_img0:
            out["img0"] = self.to_tensor(img0)
        return out

    def __getitems__(self, keys):
        # torch's batched fetch. Seeded draws (index, seed) put the random states back: hold them
        # once a batch. Dassl's plain indices draw from the global streams, which must advance.
        if not all(isinstance(k, (tuple, list)) for k in keys):
            return [self[k] for k in keys]
        with held_rng():
            return [self[k] for k in keys]
