"""Data loaders: the built-in engine's (torch DataLoader over folder items), and the seeded
training loader both engines build their training loaders with (:func:`seeded_loader`).

Training draws are ``(index, draw_seed)`` pairs (see :mod:`..data.sampling`): the
random augmentations of a draw are seeded from its ``draw_seed`` alone.

An image that cannot be decoded is reported by path. In training it is
replaced by a readable image of the same domain, chosen from the draw's
seed; in evaluation it is left out of the counts. Each batch carries the
paths it could not read (``bad_path``) so the trainer can log and count them.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms as T

from dael_plugin.data.images import ReplacingReader
from dael_plugin.data.items import Item
from dael_plugin.data.sampling import (
    DrawPicker,
    SeededRandomBatchSampler,
    held_rng,
    seeded_draw,
    source_batch_sampler,
)
from dael_plugin.errors import DAELConfigError

Transform = Callable[[Image.Image], torch.Tensor]


# Transforms that draw nothing: a pipeline of only these gives an image the same view every epoch.
_FIXED_STEPS = (T.Resize, T.CenterCrop, T.ToTensor, T.PILToTensor, T.Normalize)
# What one dataset object may keep of such views in one process (each loader worker holds its own):
# the embedded set's 2,880 source images as normalised 32x32 floats take 35 MB.
VIEW_CACHE_BYTES = 128 << 20


def draws_nothing(transform: Callable) -> bool:
    """Whether ``transform`` is a torchvision ``Compose`` of resizes, centre crops, to-tensor and
    normalisation only (the weak view ``["normalize"]``, the test view, the uint8 image of
    ``AUG_ON_DEVICE``). Anything else, Dassl's operations included, counts as drawing."""
    return isinstance(transform, T.Compose) and all(type(t) in _FIXED_STEPS for t in transform.transforms)


class ImageList(Dataset):
    """Items as Dassl-style dicts: ``img``, ``img2``, ... (one per transform), ``label``, ``domain``.

    A view whose transform draws nothing (:func:`draws_nothing`) is kept per image once made, for
    images the reader keeps decoded (small ones), up to :data:`VIEW_CACHE_BYTES` per process: later
    epochs and evaluations skip the resize and the conversion to a tensor. It is the same tensor
    the transform makes, and such transforms draw no random number, so a run is unchanged bit for bit."""

    def __init__(self, items: Sequence[Item], transforms: Union[Transform, List[Transform]], replace_bad: bool) -> None:
        self.items = list(items)
        self.transforms = transforms if isinstance(transforms, (list, tuple)) else [transforms]
        self.replace_bad = replace_bad
        self.reader = ReplacingReader([i.impath for i in self.items], [i.domain for i in self.items])
        self._fixed = [draws_nothing(t) for t in self.transforms]
        self._views: dict = {}
        self._view_bytes = 0

    def __len__(self) -> int:
        return len(self.items)

    def _view(self, k: int, idx: int, img: Image.Image) -> torch.Tensor:
        if not self._fixed[k]:
            return self.transforms[k](img)
        view = self._views.get((k, idx))
        if view is None:
            view = self.transforms[k](img)
            size = view.numel() * view.element_size()
            if self.reader.keeps(img) and self._view_bytes + size <= VIEW_CACHE_BYTES:
                self._views[(k, idx)] = view
                self._view_bytes += size
        return view

    def __getitem__(self, key: Union[int, Tuple[int, int]]) -> dict:
        idx, seed = key if isinstance(key, tuple) else (key, int(key))
        idx, img, bad_path = self.reader.read(int(idx), self.replace_bad, DrawPicker(int(seed)))
        item = self.items[idx]
        valid = img is not None
        out = {"label": item.label, "domain": item.domain, "index": idx, "bad_path": bad_path, "valid": valid}
        if not valid:  # evaluation: a placeholder the test loop leaves out
            img = Image.new("RGB", (8, 8))
        with seeded_draw(int(seed)):
            for k, tfm in enumerate(self.transforms):
                try:
                    out["img" if k == 0 else f"img{k + 1}"] = self._view(k, idx, img) if valid else tfm(img)
                except ValueError as exc:  # torchvision's crops of an image smaller than the crop
                    raise DAELConfigError(
                        f"{item.impath} ({img.size[0]}x{img.size[1]}): the transforms cannot take it ({exc}); "
                        "random_crop and center_crop do not resize first: set INPUT.SIZE to the images' size, or "
                        "put random_resized_crop in INPUT.TRANSFORMS"
                    ) from None
        return out

    def __getitems__(self, keys: Sequence) -> List[dict]:
        # The loader's batched fetch: the random states are saved and put back once a batch, not
        # once a draw.
        with held_rng():
            return [self[k] for k in keys]


def seeded_loader(dataset, batches, num_workers: int, pin: bool, seed: int) -> DataLoader:
    """A training loader over ``dataset`` drawing ``batches`` (:func:`train_batches`), with
    long-lived workers: each draw is seeded from (seed, epoch, position), so nothing depends on a
    worker's random state, and a resumed run draws what the uninterrupted one would have."""
    return _loader(dataset, num_workers, pin, seed, batch_sampler=batches)


def train_batches(
    domains: Sequence[int], batch_size: int, seed: int, sampler: str = "", n_domain: int = 0, names: Sequence[str] = ()
):
    """The batch sampler of a source loader, by ``DATALOADER.TRAIN_X.SAMPLER`` ``sampler``
    (:func:`~dael_plugin.data.sampling.source_batch_sampler`; ``domains``: each image's), or with
    ``sampler`` empty a target loader's (shuffled batches on stream 1). ``names``: the domains'."""
    if sampler:
        return source_batch_sampler(sampler, domains, batch_size, n_domain, seed, names)
    return SeededRandomBatchSampler(len(domains), batch_size, seed, stream=1)


def _loader(dataset, num_workers: int, pin: bool, seed: int, **kwargs) -> DataLoader:
    # A private generator: creating loader iterators never consumes the global
    # torch RNG, which the model's own randomness (dropout) uses.
    return DataLoader(
        dataset,
        num_workers=num_workers,
        pin_memory=pin,
        persistent_workers=num_workers > 0,  # workers and their decoded-image caches live across epochs
        prefetch_factor=4 if num_workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )


def train_loader(
    items: Sequence[Item],
    transforms: Union[Callable, Sequence[Callable]],
    batch_size: int,
    num_workers: int,
    pin: bool,
    seed: int,
    sampler: str = "",
    n_domain: int = 0,
    names: Sequence[str] = (),
) -> DataLoader:
    """A source loader by ``DATALOADER.TRAIN_X.SAMPLER`` ``sampler``, or with ``sampler`` empty
    the target loader (:func:`train_batches`); ``names``: the source domains', where each is one."""
    batches = train_batches([i.domain for i in items], batch_size, seed, sampler, n_domain, names)
    return seeded_loader(ImageList(items, transforms, replace_bad=True), batches, num_workers, pin, seed)


def test_loader(
    items: Sequence[Item],
    transform: Callable,
    batch_size: int,
    num_workers: int,
    pin: bool,
    indices: Optional[Sequence[int]] = None,
) -> DataLoader:
    """The test set in order, or only the positions ``indices`` (a process's shard)."""
    return _loader(
        ImageList(items, transform, replace_bad=False),
        num_workers,
        pin,
        0,
        batch_size=batch_size,
        shuffle=False,
        sampler=indices,
    )
