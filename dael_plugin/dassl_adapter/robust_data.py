"""Dassl's ``DatasetWrapper`` with unreadable images named and replaced.

In training, an image that cannot be decoded is replaced by a readable
image of the same domain; in evaluation the sample is flagged ``valid=False``
and the DAEL trainer leaves it out. Each sample carries ``bad_path`` ("" when
fine) so the trainer can log and count the bad files.
"""
from __future__ import annotations

import random

from dassl.data.data_manager import DatasetWrapper
from PIL import Image

from ..data.images import ReplacingReader


class RobustDatasetWrapper(DatasetWrapper):
    def __init__(self, cfg, data_source, transform=None, is_train=False):
        super().__init__(cfg, data_source, transform=transform, is_train=is_train)
        self.reader = ReplacingReader([d.impath for d in data_source], [d.domain for d in data_source])

    def __getitem__(self, idx):
        # Dassl's workers seed Python's random from the restored torch RNG, so resume stays exact.
        idx, img0, bad_path = self.reader.read(int(idx), self.is_train, lambda m: m[random.randrange(len(m))])
        item = self.data_source[idx]
        out = {"label": item.label, "domain": item.domain, "impath": item.impath, "index": idx,
               "bad_path": bad_path, "valid": img0 is not None}
        if img0 is None:
            img0 = Image.new("RGB", (8, 8))
        tfms = self.transform if isinstance(self.transform, (list, tuple)) else [self.transform]
        for i, tfm in enumerate(tfms):
            out["img" if i == 0 else f"img{i + 1}"] = self._transform_image(tfm, img0) if tfm is not None else img0
        if self.return_img0:
            out["img0"] = self.to_tensor(img0)
        return out
