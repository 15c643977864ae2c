"""Dassl's ``DatasetWrapper`` with unreadable images named and replaced.

In training, an image that cannot be decoded is replaced by a readable
image of the same domain; in evaluation the sample is flagged ``valid=False``
and the DAEL trainer leaves it out. Each sample carries ``bad_path`` ("" when
fine) so the trainer can log and count the bad files.
"""
from __future__ import annotations

import random

import numpy as np
from dassl.data.data_manager import DatasetWrapper
from PIL import Image

from ..data.images import MAX_REPLACEMENTS, decode
from ..errors import DAELConfigError


class RobustDatasetWrapper(DatasetWrapper):
    def __init__(self, cfg, data_source, transform=None, is_train=False):
        super().__init__(cfg, data_source, transform=transform, is_train=is_train)
        domains = np.asarray([d.domain for d in data_source], dtype=np.int64)
        self._by_domain = {int(d): np.flatnonzero(domains == d) for d in np.unique(domains)} if len(domains) else {}
        self._bad = set()

    def _readable(self, idx: int):
        bad_path = ""
        for _ in range(MAX_REPLACEMENTS + 1):
            if idx not in self._bad:
                try:
                    return idx, decode(self.data_source[idx].impath), bad_path
                except Exception:  # any decoder failure: truncated, empty, not an image
                    self._bad.add(idx)
            bad_path = bad_path or self.data_source[idx].impath
            if not self.is_train:
                return idx, None, bad_path
            members = self._by_domain[self.data_source[idx].domain]
            idx = int(members[random.randrange(len(members))])  # workers' random is seeded by torch
        raise DAELConfigError(f"could not find a readable image after {MAX_REPLACEMENTS} tries "
                              f"(first unreadable: {bad_path}); run with --check-data to list every bad file")

    def __getitem__(self, idx):
        idx, img0, bad_path = self._readable(int(idx))
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
