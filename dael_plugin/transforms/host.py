"""Weak and strong views a(.) and A(.) (paper Sec. 3), by Dassl's transform names.

Every name Dassl's ``build_transform`` accepts builds Dassl's own operation, on both engines
(:mod:`dael_plugin.transforms.dassl_pil`, tested bit for bit against Dassl's code), so one config
gives the same views with or without Dassl. torchvision's policies keep names of their own:
``tv_randaugment``, ``tv_trivialaugment``, ``tv_autoaugment``.

The pipeline order is fixed (as in Dassl), whatever the order of the names.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence

import torchvision.transforms as T
from yacs.config import CfgNode as CN

from dael_plugin.errors import DAELConfigError
from dael_plugin.transforms.dassl_pil import InstanceNormalization
from dael_plugin.transforms.registry import (
    BY_NAME,
    DASSL_NAMES,
    EXTRA_NAMES,
    INTERPOLATION,
    TV_RANDAUGMENT_M,
    TV_RANDAUGMENT_N,
    Context,
    selected,
    tv_randaugment_params,
)

__all__ = [
    "DASSL_NAMES",
    "EXTRA_NAMES",
    "INTERPOLATION",
    "TV_RANDAUGMENT_M",
    "TV_RANDAUGMENT_N",
    "build_loader_uint8",
    "build_test_transform",
    "build_train_transform",
    "build_train_views",
    "build_views",
    "check_transform_names",
    "check_transform_values",
    "tv_randaugment_params",
]


def check_transform_names(choices: Sequence[str], key: str) -> None:
    """One line for a name that is not in the registry."""
    for name in choices:
        if name not in BY_NAME:
            raise DAELConfigError(f"{key} has unknown transform {name!r}; choose from {sorted(BY_NAME)}")


def check_transform_values(cfg: CN) -> None:
    """The INPUT values the transforms read, before any data is read (both engines build the same
    operations by name): ``PIXEL_MEAN`` / ``PIXEL_STD`` of 1 or 3 numbers, the std above 0 (else the
    first batch stops in a traceback), and the weak and strong transforms built, so torchvision's
    refusal of a value (a negative ``INPUT.COLORJITTER_B``) is one line. Names the registry lacks are
    left to the trainer (Dassl's own, or a check that names them)."""
    import math

    for key in ("PIXEL_MEAN", "PIXEL_STD"):
        v = list(cfg.INPUT[key])
        ok = len(v) in (1, 3) and all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)
        if not ok or (key == "PIXEL_STD" and min(v) <= 0):
            what = "above 0" if key == "PIXEL_STD" else "finite"
            raise DAELConfigError(f"INPUT.{key}={v} is invalid: 1 number or 3 (one per RGB channel), each {what}")
    node = cfg.TRAINER.get(str(cfg.TRAINER.NAME).upper())
    lists = [("INPUT.TRANSFORMS", cfg.INPUT.TRANSFORMS, None)]
    if isinstance(node, CN) and "STRONG_TRANSFORMS" in node:
        lists.append((f"TRAINER.{str(cfg.TRAINER.NAME).upper()}.STRONG_TRANSFORMS", node.STRONG_TRANSFORMS, node))
    for key, choices, dassl_node in lists:
        if all(name in BY_NAME for name in choices):
            try:
                build_train_transform(cfg, choices, dassl_node)
            except (ValueError, TypeError) as exc:
                raise DAELConfigError(f"{key} {list(choices)}: {exc} (check the INPUT keys it reads)") from None


def build_train_transform(cfg: Any, choices: Sequence[str], dassl_node: Any = None) -> Callable:
    """A training transform from names, in Dassl's fixed order (:data:`~dael_plugin.transforms.registry.REGISTRY`),
    as Dassl's ``_build_transform_train`` composes it.

    Args:
        cfg: a config with Dassl's ``INPUT`` node.
        choices: transform names (Dassl's, plus ``EXTRA_NAMES``).
        dassl_node: the ``TRAINER.DAEL*`` node, for the torchvision knobs.
    """
    choices = list(choices)
    ctx = Context(cfg.INPUT, dassl_node)
    tfm: List[Callable] = []
    if "random_crop" not in choices and "random_resized_crop" not in choices:
        tfm.append(T.Resize(ctx.size, interpolation=ctx.interp))
    to_tensor = False
    for t in selected(choices):
        if t.after_to_tensor and not to_tensor:
            tfm.append(T.ToTensor())
            to_tensor = True
        if t.host is not None:
            tfm.extend(t.host(ctx))
    if not to_tensor:
        tfm.append(T.ToTensor())
    return T.Compose(tfm)


def build_test_transform(cfg: CN) -> Callable:
    """Dassl's test transform: resize the short side, centre crop, normalise, instance-normalise."""
    inp = cfg.INPUT
    size = tuple(inp.SIZE)
    tfm = [
        T.Resize(max(size), interpolation=INTERPOLATION[inp.INTERPOLATION]),
        T.CenterCrop(size),
        T.ToTensor(),
    ]
    if "normalize" in inp.TRANSFORMS:
        tfm.append(T.Normalize(mean=inp.PIXEL_MEAN, std=inp.PIXEL_STD))
    if "instance_norm" in inp.TRANSFORMS:
        tfm.append(InstanceNormalization())
    return T.Compose(tfm)


def build_views(cfg, strong_choices: Sequence[str], num_views: int, dassl_node=None) -> List[Callable]:
    """[weak, strong(, strong)] training transforms: weak is INPUT.TRANSFORMS."""
    weak = build_train_transform(cfg, cfg.INPUT.TRANSFORMS, dassl_node)
    strong = build_train_transform(cfg, strong_choices, dassl_node)
    return [weak] + [strong] * (num_views - 1)


def build_loader_uint8(cfg: CN) -> Callable:
    """The loader's only work under ``AUG_ON_DEVICE``: decode (done by the
    reader) and resize to ``INPUT.SIZE``, as uint8 ``(C, H, W)`` tensors; the
    views are made on the device (:mod:`dael_plugin.transforms.device`)."""
    inp = cfg.INPUT
    return T.Compose([T.Resize(tuple(inp.SIZE), interpolation=INTERPOLATION[inp.INTERPOLATION]), T.PILToTensor()])


def build_train_views(cfg: CN, node, num_views: int, on_device: bool) -> List[Callable]:
    """The loader's transforms for a DAEL training batch: every view, or with
    ``on_device`` one uint8 image the device turns into the views."""
    if on_device:
        return [build_loader_uint8(cfg)]
    return build_views(cfg, node.STRONG_TRANSFORMS, num_views, node)
