"""Weak and strong views made on the training device, in batch (``TRAINER.DAEL.AUG_ON_DEVICE``).

The loader workers then only decode and resize to uint8 tensors; every
random operation runs here on the whole batch, with its own random draw
*per sample* (which operation, whether it applies, its magnitude, where it
crops or cuts out), as Dassl's per-image PIL transforms do, and the two views
are drawn independently. Nothing loops over samples, reads a value back to
the host, or turns a Python value into a device tensor inside a step: every
table (operation magnitudes, affine bases, normalisation constants) is made
on the device when the views are built, and an operation a sample did not
draw is computed and discarded by ``torch.where``.

Launches are kept few, because at DAEL's shapes a GPU step is launch-bound:

- an affine map is six coefficients per sample, made from per-operation
  tables with a few batched operations (never written element by element),
  and turned into ``grid_sample``'s ``theta`` with one ``addmm``;
- the leading geometric operations of a pipeline (Dassl's random translation,
  pad-and-crop and flip) are one affine map and one ``grid_sample``;
- each RandAugment slot draws for every sample which operation, whether it
  applies, and its magnitude from one table; all geometric draws of the slot
  are one ``grid_sample``;
- ``DAELStep`` makes the views of the source and target batches in one call.

``scripts/bench.py --launches`` prints the launches per batch. With
``COMPILE`` on, the pipeline is compiled with the step's mode (its shapes are
static), so inductor fuses its element-wise work.

Supported names: ``random_flip``, ``random_crop``, ``random_translation``,
``cutout``, ``normalize`` and the RandAugment family ``randaugment``,
``randaugment2``, ``randaugment_fixmatch``, ``tv_randaugment`` with Dassl's
or torchvision's operation lists and magnitude rules. Other names are
refused in one line. Pixel results differ slightly from PIL's (bilinear
resampling of float images instead of PIL's integer arithmetic).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from yacs.config import CfgNode as CN

from dael_plugin.errors import DAELConfigError
from dael_plugin.transforms import ops as O
from dael_plugin.transforms.registry import DEVICE_NAMES, Context, selected

__all__ = ["DEVICE_NAMES", "DeviceViews", "check_device_names"]


def check_device_names(choices: Sequence[str], key: str) -> None:
    bad = [c for c in choices if c not in DEVICE_NAMES]
    if bad:
        raise DAELConfigError(
            f"{key} has {bad}, which AUG_ON_DEVICE cannot make on the device (it makes "
            f"{list(DEVICE_NAMES)}); drop them or set AUG_ON_DEVICE False"
        )


def device_pipeline(choices: Sequence[str], inp: Any, node: Any) -> List[Callable]:
    """The batched operations of ``choices``, in the registry's (Dassl's) order; consecutive
    leading geometric operations become one warp; ``normalize`` is left to the caller."""
    ctx = Context(inp, node)
    ops: List[Callable] = []
    leading: List[O.Leading] = []
    for t in selected(choices):
        piece = t.device(ctx) if t.device is not None else None
        if isinstance(piece, O.Leading):
            leading.append(piece)
            continue
        if leading:
            ops.append(O.leading_op(leading))
            leading = []
        if callable(piece):
            ops.append(piece)
    if leading:
        ops.append(O.leading_op(leading))
    return ops


class DeviceViews:
    """``views(uint8 (B, C, H, W)) -> [weak, strong(, strong)]`` float views, normalised.

    ``device`` and ``size``: where and at which ``(H, W)`` the views are made; every constant
    is made there when the views are built."""

    def __init__(
        self,
        weak: Sequence[str],
        strong: Sequence[str],
        num_views: int,
        inp: CN,
        node: CN,
        device: Optional[torch.device | str] = None,
        size: Optional[Tuple[int, int]] = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.size = tuple(int(s) for s in (size or getattr(inp, "SIZE", None) or ())) or None
        self.weak = self._pipeline(weak, inp, node)
        self.strong = self._pipeline(strong, inp, node)
        self.num_views = num_views
        mean = torch.tensor(inp.PIXEL_MEAN, dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(inp.PIXEL_STD, dtype=torch.float32).view(1, -1, 1, 1)
        # (x / 255 - mean) / std in one multiply-add, from uint8 (scale255) or from [0, 1] (scale1)
        self.scale255 = {
            True: (1 / (255 * std)).to(self.device),
            False: torch.full((1, 1, 1, 1), 1 / 255).to(self.device),
        }
        self.scale1 = (1 / std).to(self.device)
        self.shift = {True: (-mean / std).to(self.device), False: torch.zeros(1, 1, 1, 1).to(self.device)}
        self.normalize = ("normalize" in weak, "normalize" in strong)
        if self.size is not None:
            for op in self.weak + self.strong:
                if isinstance(op, O.RandAugmentBatch):
                    op.prepare(*self.size, self.device)
            O.geometry(*self.size, self.device)

    def _pipeline(self, choices: Sequence[str], inp: CN, node: CN) -> List[Callable]:
        return device_pipeline(choices, inp, node)

    def _run(self, ops, images: torch.Tensor, normalize: bool) -> torch.Tensor:
        if not ops:  # straight from uint8 to the normalised view, one kernel
            return torch.addcmul(self.shift[normalize], images, self.scale255[normalize])
        x = images * (1 / 255)
        for op in ops:
            x = op(x)
        if normalize:
            x = torch.addcmul(self.shift[True], x, self.scale1)
        return x

    def __call__(self, images: torch.Tensor) -> List[torch.Tensor]:
        if images.dtype != torch.uint8:
            raise ValueError(f"AUG_ON_DEVICE expects uint8 images from the loader, got {images.dtype}")
        views = [self._run(self.weak, images, self.normalize[0])]
        views += [self._run(self.strong, images, self.normalize[1]) for _ in range(self.num_views - 1)]
        return views
