"""Registration into Dassl's registries (trainer, datasets, backbones).

Importing ``dael_plugin`` calls :func:`register` when Dassl is importable.
"""
from __future__ import annotations

import logging

from dassl.engine import TRAINER_REGISTRY
from dassl.modeling.backbone import BACKBONE_REGISTRY

from ..backbones import OWN_BACKBONES, TIMM_PREFIX, TimmBackbone, timm_model_name
from .datasets import register_datasets
from .trainer import DAELTrainer

log = logging.getLogger("dael_plugin")
TRAINER_NAMES = ("DAEL", "DAELDG")
_registered = False


def register() -> None:
    """Register the DAEL trainer as DAEL and DAELDG, replacing Dassl's built-ins."""
    global _registered
    if _registered:
        return
    replaced = [n for n in TRAINER_NAMES if n in TRAINER_REGISTRY.registered_names()]
    for name in TRAINER_NAMES:
        TRAINER_REGISTRY._do_register(name, DAELTrainer, force=True)
    if replaced:
        print(f"dael_plugin: replaced Dassl's built-in trainer(s) {replaced} with dael_plugin.DAELTrainer")
    for name, cls in OWN_BACKBONES.items():
        if name not in BACKBONE_REGISTRY.registered_names():
            BACKBONE_REGISTRY._do_register(name, _own_factory(cls))  # keyed by our name
    register_datasets()
    _registered = True


def _own_factory(cls):
    def factory(pretrained=False, **kwargs):
        return cls()

    factory.__name__ = getattr(cls, "__name__", "backbone")
    return factory


def register_timm_backbone(name: str, weights_file: str = "") -> None:
    """Make ``timm_<model>`` buildable by Dassl's ``build_backbone``.

    Dassl passes only ``pretrained`` to a factory, so the timm model name and
    the local weights file are carried by the registered closure.
    """
    if not name.startswith(TIMM_PREFIX):
        return

    def factory(pretrained=True, **kwargs):
        return TimmBackbone(timm_model_name(name), pretrained=pretrained, weights_file=weights_file)

    factory.__name__ = name
    BACKBONE_REGISTRY._do_register(name, factory, force=True)


def prepare_cfg(cfg) -> None:
    """Per-run registration that depends on the config (a timm backbone)."""
    register()
    register_timm_backbone(cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.WEIGHTS)


__all__ = ["DAELTrainer", "prepare_cfg", "register", "register_timm_backbone"]
