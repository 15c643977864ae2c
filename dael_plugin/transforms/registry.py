"""Every transform name, in Dassl's pipeline order, with its builders side by side.

Dassl's ``build_transform`` applies the names it is given in a fixed order,
whatever their order in the config. That order is written once, here, as
:data:`REGISTRY`; :func:`dael_plugin.transforms.host.build_train_transform`
and :class:`dael_plugin.transforms.device.DeviceViews` both walk it. Each
entry has up to two builders, both taking a :class:`Context`:

- ``host``: the loader's operation on PIL images (or tensors after
  ``ToTensor``), on both engines. For Dassl's names it is Dassl's own
  operation, with Dassl's arguments and random streams: a class of
  :mod:`dael_plugin.transforms.dassl_pil`, or the torchvision class Dassl
  itself uses for that name. ``tv_*`` names are torchvision's policies;
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

from dael_plugin.transforms import dassl_pil as D
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
    device: Optional[Callable[[Context], Any]] = None
    after_to_tensor: bool = False


def _tv_rand(c: Context) -> List[Callable]:
    n, m = tv_randaugment_params(c.node)
    return [T.RandAugment(num_ops=n, magnitude=m, interpolation=c.interp)]


def _tv_rand_device(c: Context) -> O.RandAugmentBatch:
    n, m = tv_randaugment_params(c.node)
    return O.RandAugmentBatch(O.TV_LIST, n, 1.0, O._tv(m))


# Dassl's order (dassl/data/transforms/transforms.py, _build_transform_train), with the
# torchvision policies after Dassl's RandAugment family. Each Dassl name's host builder is
# Dassl's own operation with Dassl's arguments: its class in dassl_pil, or the torchvision class
# Dassl itself builds for that name.
REGISTRY: Tuple[Transform, ...] = (
    Transform(
        "random_translation",
        host=lambda c: [D.Random2DTranslation(c.size[0], c.size[1])],
        device=lambda c: O.Leading(translation=True),
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
    Transform("imagenet_policy", host=lambda c: [D.ImageNetPolicy()]),
    Transform("cifar10_policy", host=lambda c: [D.CIFAR10Policy()]),
    Transform("svhn_policy", host=lambda c: [D.SVHNPolicy()]),
    Transform(
        "randaugment",
        host=lambda c: [D.RandAugment(c.inp.RANDAUGMENT_N, c.inp.RANDAUGMENT_M)],
        device=lambda c: O.RandAugmentBatch(
            O.DASSL_LIST, int(c.inp.RANDAUGMENT_N), 1.0, O._dassl_fixed(int(c.inp.RANDAUGMENT_M))
        ),
    ),
    Transform(
        "randaugment_fixmatch",
        host=lambda c: [D.RandAugmentFixMatch(c.inp.RANDAUGMENT_N)],
        device=lambda c: O.RandAugmentBatch(O.FIXMATCH, int(c.inp.RANDAUGMENT_N), 1.0, O._dassl_uniform),
    ),
    Transform(
        "randaugment2",
        host=lambda c: [D.RandAugment2(c.inp.RANDAUGMENT_N)],
        device=lambda c: O.RandAugmentBatch(O.DASSL_LIST2, int(c.inp.RANDAUGMENT_N), 0.6, O._dassl_uniform),
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
        host=lambda c: [D.Cutout(c.inp.CUTOUT_N, c.inp.CUTOUT_LEN)],
        device=lambda c: lambda x, n=int(c.inp.CUTOUT_N), le=int(c.inp.CUTOUT_LEN): O._cutout(x, n, le),
        after_to_tensor=True,
    ),
    Transform(
        "normalize",
        host=lambda c: [T.Normalize(mean=c.inp.PIXEL_MEAN, std=c.inp.PIXEL_STD)],
        device=lambda c: "normalize",
        after_to_tensor=True,
    ),
    Transform("gaussian_noise", host=lambda c: [D.GaussianNoise(c.inp.GN_MEAN, c.inp.GN_STD)], after_to_tensor=True),
    Transform("instance_norm", host=lambda c: [D.InstanceNormalization()], after_to_tensor=True),
    Transform("center_crop"),  # Dassl's test-time name; nothing in a training pipeline
)

BY_NAME = {t.name: t for t in REGISTRY}
EXTRA_NAMES = ("tv_randaugment", "tv_trivialaugment", "tv_autoaugment")
DASSL_NAMES = tuple(t.name for t in REGISTRY if t.name not in EXTRA_NAMES)
DEVICE_NAMES = tuple(t.name for t in REGISTRY if t.device is not None)


def selected(choices: Iterable[str]) -> List[Transform]:
    """The registry's entries for ``choices``, in Dassl's order."""
    chosen = set(choices)
    return [t for t in REGISTRY if t.name in chosen]
