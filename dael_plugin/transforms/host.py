"""Weak and strong views a(.) and A(.) (paper Sec. 3), by Dassl's transform names.

Dassl's ``build_transform`` accepts only its fixed ``AVAI_CHOICES``. This
module adds torchvision's ``RandAugment`` (``tv_randaugment``),
``TrivialAugmentWide`` (``tv_trivialaugment``) and ``AutoAugment``
(``tv_autoaugment``), and builds every Dassl name too, so the same config
works with or without Dassl:

- with Dassl and only Dassl names, Dassl's own ``build_transform`` is used,
  exactly as in the reference trainer;
- with Dassl and extra names, Dassl's operations are used for Dassl's names;
- without Dassl, each Dassl name maps to its torchvision counterpart (listed
  in ``TORCHVISION_EQUIVALENTS``; ``randaugment2`` and ``cutout`` are close
  approximations, not bit-identical).

The pipeline order is fixed (as in Dassl), whatever the order of the names.
"""
from __future__ import annotations

from typing import Callable, List, Sequence

import torchvision.transforms as T
from torchvision.transforms import InterpolationMode

from dael_plugin.errors import DAELConfigError

# torchvision RandAugment's defaults for ``tv_randaugment`` (the config table reads them from here).
TV_RANDAUGMENT_N, TV_RANDAUGMENT_M = 2, 9


def tv_randaugment_params(node) -> tuple:
    """``(TV_RANDAUGMENT_N, TV_RANDAUGMENT_M)`` of a trainer node; the defaults where the node
    lacks them (Dassl's own tools/train.py never adds the plugin's keys)."""
    node = node if node is not None else {}
    return int(node.get("TV_RANDAUGMENT_N", TV_RANDAUGMENT_N)), int(node.get("TV_RANDAUGMENT_M", TV_RANDAUGMENT_M))

DASSL_NAMES = (
    "random_flip", "random_resized_crop", "normalize", "instance_norm", "random_crop",
    "random_translation", "center_crop", "cutout", "imagenet_policy", "cifar10_policy",
    "svhn_policy", "randaugment", "randaugment_fixmatch", "randaugment2",
    "gaussian_noise", "colorjitter", "randomgrayscale", "gaussian_blur",
)
EXTRA_NAMES = ("tv_randaugment", "tv_trivialaugment", "tv_autoaugment")

# What each Dassl name becomes when Dassl is not installed.
TORCHVISION_EQUIVALENTS = {
    "random_translation": "RandomApply([Resize(1.125x), RandomCrop], p=0.5)",
    "imagenet_policy": "AutoAugment(IMAGENET)",
    "cifar10_policy": "AutoAugment(CIFAR10)",
    "svhn_policy": "AutoAugment(SVHN)",
    "randaugment": "RandAugment(N, M)",
    "randaugment_fixmatch": "RandAugment(N)",
    "randaugment2": "RandAugment(N)",
    "cutout": "RandomErasing(square of CUTOUT_LEN, value=0) x CUTOUT_N",
    "gaussian_noise": "GaussianNoise (Dassl's rule: with p 0.5, add N(GN_MEAN, GN_STD) to the tensor)",
}
_BUILTIN_UNSUPPORTED = ("instance_norm",)

INTERPOLATION = {
    "bilinear": InterpolationMode.BILINEAR,
    "bicubic": InterpolationMode.BICUBIC,
    "nearest": InterpolationMode.NEAREST,
}


def check_names(choices: Sequence[str], key: str, dassl: bool) -> None:
    known = DASSL_NAMES + EXTRA_NAMES
    for name in choices:
        if name not in known:
            raise DAELConfigError(
                f"{key} has unknown transform {name!r}; choose from {sorted(known)}"
            )
        if not dassl and name in _BUILTIN_UNSUPPORTED:
            raise DAELConfigError(
                f"{key}: transform {name!r} needs Dassl; remove it or run with --engine dassl"
            )


def _dassl_ops():
    from dassl.data.transforms import autoaugment as aa
    from dassl.data.transforms import randaugment as ra
    from dassl.data.transforms import transforms as dt

    return dt, ra, aa


class _GaussianNoise:
    """Add N(mean, std) to a tensor image (torchvision has one from 0.19 on; this runs on any)."""

    def __init__(self, mean: float, std: float) -> None:
        self.mean, self.std = mean, std

    def __call__(self, img):
        import torch

        return img + torch.randn(img.size()) * self.std + self.mean


def _cutout_tv(n_holes: int, length: int, size) -> List[Callable]:
    area = float(length * length) / float(size[0] * size[1])
    area = min(area, 1.0)
    return [T.RandomErasing(p=1.0, scale=(area, area), ratio=(1.0, 1.0), value=0) for _ in range(n_holes)]


def build_train_transform(cfg, choices: Sequence[str], dassl_node=None, use_dassl: bool = False) -> Callable:
    """A training transform from names, in Dassl's fixed order.

    Args:
        cfg: a config with Dassl's ``INPUT`` node.
        choices: transform names (Dassl's, plus ``EXTRA_NAMES``).
        dassl_node: the ``TRAINER.DAEL*`` node, for the torchvision knobs.
        use_dassl: use Dassl's operations for Dassl's names.
    """
    choices = list(choices)
    inp = cfg.INPUT
    size = tuple(inp.SIZE)
    interp = INTERPOLATION[inp.INTERPOLATION]
    if use_dassl and all(c in DASSL_NAMES for c in choices):
        from dassl.data.transforms import build_transform

        return build_transform(cfg, is_train=True, choices=choices)
    ops = _dassl_ops() if use_dassl else None
    tfm: List[Callable] = []
    if "random_crop" not in choices and "random_resized_crop" not in choices:
        tfm.append(T.Resize(size, interpolation=interp))
    if "random_translation" in choices:
        if ops:
            tfm.append(ops[0].Random2DTranslation(size[0], size[1]))
        else:
            big = (int(round(size[0] * 1.125)), int(round(size[1] * 1.125)))
            tfm.append(T.RandomApply([T.Resize(big, interpolation=interp), T.RandomCrop(size)], p=0.5))
    if "random_crop" in choices:
        tfm.append(T.RandomCrop(size, padding=inp.CROP_PADDING))
    if "random_resized_crop" in choices:
        tfm.append(T.RandomResizedCrop(size, scale=tuple(inp.RRCROP_SCALE), interpolation=interp))
    if "random_flip" in choices:
        tfm.append(T.RandomHorizontalFlip())
    for name, policy, cls in (
        ("imagenet_policy", T.AutoAugmentPolicy.IMAGENET, "ImageNetPolicy"),
        ("cifar10_policy", T.AutoAugmentPolicy.CIFAR10, "CIFAR10Policy"),
        ("svhn_policy", T.AutoAugmentPolicy.SVHN, "SVHNPolicy"),
    ):
        if name in choices:
            tfm.append(getattr(ops[2], cls)() if ops else T.AutoAugment(policy))
    n, m = inp.RANDAUGMENT_N, inp.RANDAUGMENT_M
    if "randaugment" in choices:
        tfm.append(ops[1].RandAugment(n, m) if ops else T.RandAugment(num_ops=n, magnitude=m))
    if "randaugment_fixmatch" in choices:
        tfm.append(ops[1].RandAugmentFixMatch(n) if ops else T.RandAugment(num_ops=n))
    if "randaugment2" in choices:
        tfm.append(ops[1].RandAugment2(n) if ops else T.RandAugment(num_ops=n))
    tv_n, tv_m = tv_randaugment_params(dassl_node)
    if "tv_randaugment" in choices:
        tfm.append(T.RandAugment(num_ops=tv_n, magnitude=tv_m, interpolation=interp))
    if "tv_trivialaugment" in choices:
        tfm.append(T.TrivialAugmentWide(interpolation=interp))
    if "tv_autoaugment" in choices:
        tfm.append(T.AutoAugment(T.AutoAugmentPolicy.IMAGENET, interpolation=interp))
    if "colorjitter" in choices:
        tfm.append(T.ColorJitter(inp.COLORJITTER_B, inp.COLORJITTER_C, inp.COLORJITTER_S, inp.COLORJITTER_H))
    if "randomgrayscale" in choices:
        tfm.append(T.RandomGrayscale(p=inp.RGS_P))
    if "gaussian_blur" in choices:
        tfm.append(T.RandomApply([T.GaussianBlur(inp.GB_K)], p=inp.GB_P))
    tfm.append(T.ToTensor())
    if "cutout" in choices:
        if ops:
            tfm.append(ops[0].Cutout(inp.CUTOUT_N, inp.CUTOUT_LEN))
        else:
            tfm.extend(_cutout_tv(inp.CUTOUT_N, inp.CUTOUT_LEN, size))
    if "normalize" in choices:
        tfm.append(T.Normalize(mean=inp.PIXEL_MEAN, std=inp.PIXEL_STD))
    if "gaussian_noise" in choices:
        if ops:
            tfm.append(ops[0].GaussianNoise(inp.GN_MEAN, inp.GN_STD))
        else:
            tfm.append(T.RandomApply([_GaussianNoise(inp.GN_MEAN, inp.GN_STD)], p=0.5))
    if "instance_norm" in choices and ops:
        tfm.append(ops[0].InstanceNormalization())
    return T.Compose(tfm)


def build_test_transform(cfg) -> Callable:
    """Dassl's test transform: resize the short side, centre crop, normalise."""
    inp = cfg.INPUT
    size = tuple(inp.SIZE)
    tfm = [
        T.Resize(max(size), interpolation=INTERPOLATION[inp.INTERPOLATION]),
        T.CenterCrop(size),
        T.ToTensor(),
    ]
    if "normalize" in inp.TRANSFORMS:
        tfm.append(T.Normalize(mean=inp.PIXEL_MEAN, std=inp.PIXEL_STD))
    return T.Compose(tfm)


def build_views(cfg, strong_choices: Sequence[str], num_views: int, dassl_node=None, use_dassl: bool = False) -> List[Callable]:
    """[weak, strong(, strong)] training transforms: weak is INPUT.TRANSFORMS."""
    weak = build_train_transform(cfg, cfg.INPUT.TRANSFORMS, dassl_node, use_dassl)
    strong = build_train_transform(cfg, strong_choices, dassl_node, use_dassl)
    return [weak] + [strong] * (num_views - 1)


def build_loader_uint8(cfg) -> Callable:
    """The loader's only work under ``AUG_ON_DEVICE``: decode (done by the
    reader) and resize to ``INPUT.SIZE``, as uint8 ``(C, H, W)`` tensors; the
    views are made on the device (:mod:`dael_plugin.transforms.device`)."""
    inp = cfg.INPUT
    return T.Compose([T.Resize(tuple(inp.SIZE), interpolation=INTERPOLATION[inp.INTERPOLATION]), T.PILToTensor()])


def build_train_views(cfg, node, num_views: int, use_dassl: bool, on_device: bool) -> List[Callable]:
    """The loader's transforms for a DAEL training batch: every view, or with
    ``on_device`` one uint8 image the device turns into the views."""
    if on_device:
        return [build_loader_uint8(cfg)]
    return build_views(cfg, node.STRONG_TRANSFORMS, num_views, node, use_dassl=use_dassl)
