"""Every transform name, in Dassl's pipeline order, with its builders side by side.

Dassl's ``build_transform`` applies the names it is given in a fixed order,
whatever their order in the config. That order is written once, here, as
:data:`REGISTRY`; :func:`dael_plugin.transforms.host.build_train_transform`
and :class:`dael_plugin.transforms.device.DeviceViews` both walk it. Each
entry has up to three builders, all taking a :class:`Context`:

- ``host``: torchvision operations on PIL images (or tensors after
  ``ToTensor``), used without Dassl;
- ``dassl``: Dassl's own operation, used for that name when Dassl is installed
  (names without one use ``host`` either way);
- ``device``: a batched operation on the training device
  (:mod:`dael_plugin.transforms.ops`), or :class:`~dael_plugin.transforms.ops.Leading`
  for the leading geometric operations, which the device makes one warp.

A name whose ``host`` is None adds nothing to a training pipeline
(``center_crop`` is a test-time name in Dassl).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, Optional, Tuple

import torchvision.transforms as T
from torchvision.transforms import InterpolationMode

from dael_plugin.transforms import ops as O

# torchvision RandAugment's defaults for ``tv_randaugment`` (the config table reads them from here).
TV_RANDAUGMENT_N, TV_RANDAUGMENT_M = 2, 9

INTERPOLATION = {
    "bilinear": InterpolationMode.BILINEAR,
    "bicubic": InterpolationMode.BICUBIC,
    "nearest": InterpolationMode.NEAREST,
}


def tv_randaugment_params(node: Any) -> Tuple[int, int]:
    """``(TV_RANDAUGMENT_N, TV_RANDAUGMENT_M)`` of a trainer node; the defaults where the node
    lacks them (Dassl's own tools/train.py never adds the plugin's keys)."""
    node = node if node is not None else {}
    return int(node.get("TV_RANDAUGMENT_N", TV_RANDAUGMENT_N)), int(node.get("TV_RANDAUGMENT_M", TV_RANDAUGMENT_M))


@dataclass(frozen=True)
class Context:
    """What a builder may read: Dassl's ``INPUT`` node and the ``TRAINER.<NAME>`` node."""

    inp: Any
    node: Any = None

    @property
    def size(self) -> Tuple[int, int]:
        return tuple(int(s) for s in self.inp.SIZE)

    @property
    def interp(self) -> InterpolationMode:
        return INTERPOLATION[self.inp.INTERPOLATION]


Builder = Callable[[Context], List[Callable]]


@dataclass(frozen=True)
class Transform:
    name: str
    host: Optional[Builder] = None
    dassl: Optional[Builder] = None
    device: Optional[Callable[[Context], Any]] = None
    after_to_tensor: bool = False
    equivalent: str = ""  # what the name becomes without Dassl, where that is not the same operation
    dassl_only: bool = False  # no torchvision counterpart: refused without Dassl


def _dt():
    from dassl.data.transforms import transforms as dt

    return dt


def _ra():
    from dassl.data.transforms import randaugment as ra

    return ra


def _aa():
    from dassl.data.transforms import autoaugment as aa

    return aa


class _GaussianNoise:
    """Add N(mean, std) to a tensor image (torchvision has one from 0.19 on; this runs on any)."""

    def __init__(self, mean: float, std: float) -> None:
        self.mean, self.std = mean, std

    def __call__(self, img):
        import torch

        return img + torch.randn(img.size()) * self.std + self.mean


def _translation_tv(c: Context) -> List[Callable]:
    big = tuple(int(round(s * 1.125)) for s in c.size)
    return [T.RandomApply([T.Resize(big, interpolation=c.interp), T.RandomCrop(c.size)], p=0.5)]


def _cutout_tv(c: Context) -> List[Callable]:
    size, length = c.size, c.inp.CUTOUT_LEN
    area = min(float(length * length) / float(size[0] * size[1]), 1.0)
    return [T.RandomErasing(p=1.0, scale=(area, area), ratio=(1.0, 1.0), value=0) for _ in range(c.inp.CUTOUT_N)]


def _policy(policy: T.AutoAugmentPolicy, dassl_class: str) -> dict:
    return {
        "host": lambda c: [T.AutoAugment(policy)],
        "dassl": lambda c: [getattr(_aa(), dassl_class)()],
        "equivalent": f"AutoAugment({policy.name})",
    }


def _tv_rand(c: Context) -> List[Callable]:
    n, m = tv_randaugment_params(c.node)
    return [T.RandAugment(num_ops=n, magnitude=m, interpolation=c.interp)]


def _tv_rand_device(c: Context) -> O.RandAugmentBatch:
    n, m = tv_randaugment_params(c.node)
    return O.RandAugmentBatch(O.TV_LIST, n, 1.0, O._tv(m))


# Dassl's order (dassl/data/transforms/transforms.py, _build_transform_train), with the
# torchvision policies after Dassl's RandAugment family.
REGISTRY: Tuple[Transform, ...] = (
    Transform(
        "random_translation",
        host=_translation_tv,
        dassl=lambda c: [_dt().Random2DTranslation(c.size[0], c.size[1])],
        device=lambda c: O.Leading(translation=True),
        equivalent="RandomApply([Resize(1.125x), RandomCrop], p=0.5)",
    ),
    Transform(
        "random_crop",
        host=lambda c: [T.RandomCrop(c.size, padding=c.inp.CROP_PADDING)],
        device=lambda c: O.Leading(crop_pad=int(c.inp.CROP_PADDING)),
    ),
    Transform(
        "random_resized_crop",
        host=lambda c: [T.RandomResizedCrop(c.size, scale=tuple(c.inp.RRCROP_SCALE), interpolation=c.interp)],
    ),
    Transform("random_flip", host=lambda c: [T.RandomHorizontalFlip()], device=lambda c: O.Leading(flip=True)),
    Transform("imagenet_policy", **_policy(T.AutoAugmentPolicy.IMAGENET, "ImageNetPolicy")),
    Transform("cifar10_policy", **_policy(T.AutoAugmentPolicy.CIFAR10, "CIFAR10Policy")),
    Transform("svhn_policy", **_policy(T.AutoAugmentPolicy.SVHN, "SVHNPolicy")),
    Transform(
        "randaugment",
        host=lambda c: [T.RandAugment(num_ops=c.inp.RANDAUGMENT_N, magnitude=c.inp.RANDAUGMENT_M)],
        dassl=lambda c: [_ra().RandAugment(c.inp.RANDAUGMENT_N, c.inp.RANDAUGMENT_M)],
        device=lambda c: O.RandAugmentBatch(
            O.DASSL_LIST, int(c.inp.RANDAUGMENT_N), 1.0, O._dassl_fixed(int(c.inp.RANDAUGMENT_M))
        ),
        equivalent="RandAugment(N, M)",
    ),
    Transform(
        "randaugment_fixmatch",
        host=lambda c: [T.RandAugment(num_ops=c.inp.RANDAUGMENT_N)],
        dassl=lambda c: [_ra().RandAugmentFixMatch(c.inp.RANDAUGMENT_N)],
        device=lambda c: O.RandAugmentBatch(O.FIXMATCH, int(c.inp.RANDAUGMENT_N), 1.0, O._dassl_uniform),
        equivalent="RandAugment(N)",
    ),
    Transform(
        "randaugment2",
        host=lambda c: [T.RandAugment(num_ops=c.inp.RANDAUGMENT_N)],
        dassl=lambda c: [_ra().RandAugment2(c.inp.RANDAUGMENT_N)],
        device=lambda c: O.RandAugmentBatch(O.DASSL_LIST2, int(c.inp.RANDAUGMENT_N), 0.6, O._dassl_uniform),
        equivalent="RandAugment(N)",
    ),
    Transform("tv_randaugment", host=_tv_rand, device=_tv_rand_device),
    Transform("tv_trivialaugment", host=lambda c: [T.TrivialAugmentWide(interpolation=c.interp)]),
    Transform("tv_autoaugment", host=lambda c: [T.AutoAugment(T.AutoAugmentPolicy.IMAGENET, interpolation=c.interp)]),
    Transform(
        "colorjitter",
        host=lambda c: [
            T.ColorJitter(c.inp.COLORJITTER_B, c.inp.COLORJITTER_C, c.inp.COLORJITTER_S, c.inp.COLORJITTER_H)
        ],
    ),
    Transform("randomgrayscale", host=lambda c: [T.RandomGrayscale(p=c.inp.RGS_P)]),
    Transform("gaussian_blur", host=lambda c: [T.RandomApply([T.GaussianBlur(c.inp.GB_K)], p=c.inp.GB_P)]),
    # ---- ToTensor ----
    Transform(
        "cutout",
        host=_cutout_tv,
        dassl=lambda c: [_dt().Cutout(c.inp.CUTOUT_N, c.inp.CUTOUT_LEN)],
        device=lambda c: lambda x, n=int(c.inp.CUTOUT_N), le=int(c.inp.CUTOUT_LEN): O._cutout(x, n, le),
        after_to_tensor=True,
        equivalent="RandomErasing(square of CUTOUT_LEN, value=0) x CUTOUT_N",
    ),
    Transform(
        "normalize",
        host=lambda c: [T.Normalize(mean=c.inp.PIXEL_MEAN, std=c.inp.PIXEL_STD)],
        device=lambda c: "normalize",
        after_to_tensor=True,
    ),
    Transform(
        "gaussian_noise",
        host=lambda c: [T.RandomApply([_GaussianNoise(c.inp.GN_MEAN, c.inp.GN_STD)], p=0.5)],
        dassl=lambda c: [_dt().GaussianNoise(c.inp.GN_MEAN, c.inp.GN_STD)],
        after_to_tensor=True,
        equivalent="GaussianNoise (Dassl's rule: with p 0.5, add N(GN_MEAN, GN_STD) to the tensor)",
    ),
    Transform("instance_norm", dassl=lambda c: [_dt().InstanceNormalization()], after_to_tensor=True, dassl_only=True),
    Transform("center_crop"),  # Dassl's test-time name; nothing in a training pipeline
)

BY_NAME = {t.name: t for t in REGISTRY}
EXTRA_NAMES = ("tv_randaugment", "tv_trivialaugment", "tv_autoaugment")
DASSL_NAMES = tuple(t.name for t in REGISTRY if t.name not in EXTRA_NAMES)
DEVICE_NAMES = tuple(t.name for t in REGISTRY if t.device is not None)
TORCHVISION_EQUIVALENTS = {t.name: t.equivalent for t in REGISTRY if t.equivalent}


def selected(choices: Iterable[str]) -> List[Transform]:
    """The registry's entries for ``choices``, in Dassl's order."""
    chosen = set(choices)
    return [t for t in REGISTRY if t.name in chosen]
