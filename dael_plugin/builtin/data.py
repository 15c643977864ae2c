"""Data loaders of the built-in engine (torch DataLoader over folder items)."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, RandomSampler

from ..data.folders import Item
from .sampler import DomainBalancedBatchSampler

Transform = Callable[[Image.Image], torch.Tensor]


class ImageList(Dataset):
    """Items as Dassl-style dicts: ``img``, ``img2``, ... (one per transform), ``label``, ``domain``."""

    def __init__(self, items: Sequence[Item], transforms: Union[Transform, List[Transform]]) -> None:
        self.items = list(items)
        self.transforms = transforms if isinstance(transforms, (list, tuple)) else [transforms]
        self._cache: Dict[int, Image.Image] = {}

    def __len__(self) -> int:
        return len(self.items)

    def _image(self, idx: int) -> Image.Image:
        img = self._cache.get(idx)
        if img is None:
            with Image.open(self.items[idx].impath) as f:
                img = f.convert("RGB")
            if img.width * img.height <= 64 * 64:  # small images: keep decoded in this worker
                self._cache[idx] = img
        return img

    def __getitem__(self, idx: int) -> dict:
        item = self.items[idx]
        img = self._image(idx)
        out = {"label": item.label, "domain": item.domain, "index": idx}
        for k, tfm in enumerate(self.transforms):
            out["img" if k == 0 else f"img{k + 1}"] = tfm(img)
        return out


def _loader(dataset, num_workers: int, pin: bool, **kwargs) -> DataLoader:
    return DataLoader(
        dataset,
        num_workers=num_workers,
        pin_memory=pin,
        persistent_workers=num_workers > 0,
        **kwargs,
    )


def train_loader(
    items: Sequence[Item],
    transforms,
    batch_size: int,
    num_workers: int,
    pin: bool,
    seed: int,
    domain_balanced: bool,
    n_domain: int = 0,
    generator: Optional[torch.Generator] = None,
) -> DataLoader:
    ds = ImageList(items, transforms)
    if domain_balanced:
        sampler = DomainBalancedBatchSampler([i.domain for i in items], batch_size, n_domain, seed)
        return _loader(ds, num_workers, pin, batch_sampler=sampler)
    drop = len(ds) >= batch_size
    return _loader(ds, num_workers, pin, batch_size=batch_size, drop_last=drop,
                   sampler=RandomSampler(ds, generator=generator))


def test_loader(items: Sequence[Item], transform, batch_size: int, num_workers: int, pin: bool) -> DataLoader:
    return _loader(ImageList(items, transform), num_workers, pin, batch_size=batch_size, shuffle=False)
