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
    # Said in the run's log when the trainer is built, not on import: importing a library
    # must not write to stdout (collect's CSV, a test reading a child's first line).
    DAELTrainer.replaced_builtins = tuple(replaced)
    for name, cls in OWN_BACKBONES.items():
        if name not in BACKBONE_REGISTRY.registered_names():
            BACKBONE_REGISTRY._do_register(name, _own_factory(cls))  # keyed by our name
    register_datasets()
    _make_timm_names_lazy()
    _safe_dassl_checkpoints()
    _registered = True


def _safe_dassl_checkpoints() -> None:
    """Dassl's own checkpoint functions, for every trainer it runs (its baselines too), made
    safe: loads always ``weights_only=True`` through the plugin's loader, whatever the installed
    torch (Dassl calls plain ``torch.load``, which runs pickled code before torch 2.6), and saves
    atomic through :mod:`dael_plugin.atomic`. Same arguments, same files."""
    import dassl.engine.trainer as dassl_trainer
    import dassl.utils as dassl_utils
    import dassl.utils.torchtools as torchtools

    for module in (torchtools, dassl_trainer, dassl_utils):
        module.load_checkpoint = load_dassl_checkpoint
        module.save_checkpoint = save_dassl_checkpoint


def load_dassl_checkpoint(fpath):
    """Dassl's ``load_checkpoint``, weights-only (one line naming the file when refused)."""
    import torch

    from .. import checkpoint as ckpt

    if fpath is None:
        raise ValueError("File path is None")
    state = ckpt.load_checkpoint(fpath, map_location=None if torch.cuda.is_available() else "cpu")
    if isinstance(state.get("scheduler"), dict):
        state["scheduler"] = ckpt.restore_counters(state["scheduler"])
    return state


def save_dassl_checkpoint(state, save_dir, is_best=False, remove_module_from_keys=True, model_name=""):
    """Dassl's ``save_checkpoint``: ``model.pth.tar-N`` (or ``model_name``), the ``checkpoint``
    marker and ``model-best.pth.tar``, each written atomically."""
    import os.path as osp
    from collections import OrderedDict

    from .. import checkpoint as ckpt
    from ..atomic import save_torch, write_text

    if remove_module_from_keys:
        state["state_dict"] = OrderedDict((k[7:] if k.startswith("module.") else k, v)
                                          for k, v in state["state_dict"].items())
    if isinstance(state.get("scheduler"), dict):
        state["scheduler"] = ckpt.counters_to_dicts(state["scheduler"])
    fpath = osp.join(save_dir, model_name or f"model.pth.tar-{state['epoch']}")
    save_torch(fpath, state)
    print(f"Checkpoint saved to {fpath}")
    write_text(osp.join(save_dir, "checkpoint"), f"{osp.basename(fpath)}\n")
    if is_best:
        best = osp.join(osp.dirname(fpath), "model-best.pth.tar")
        save_torch(best, state)
        print(f'Best checkpoint saved to "{best}"')


class _TimmAwareNames(list):
    """Dassl's ``check_availability`` asks ``name in registered_names()``: any
    ``timm_<model>`` that timm knows is available, without listing them all."""

    def __contains__(self, name) -> bool:
        return list.__contains__(self, name) or _timm_known(name)


class _TimmAwareMap(dict):
    """The registry's name -> factory map; ``timm_<model>`` factories are made on first use."""

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name) or _timm_known(name)

    def __getitem__(self, name):
        if not dict.__contains__(self, name) and _timm_known(name):
            dict.__setitem__(self, name, _timm_factory(name, ""))
        return dict.__getitem__(self, name)

    def get(self, name, default=None):
        return self[name] if name in self else default


def _timm_known(name) -> bool:
    if not isinstance(name, str) or not name.startswith(TIMM_PREFIX):
        return False
    import timm

    return timm.is_model(timm_model_name(name).split(".")[0])


def _make_timm_names_lazy() -> None:
    """After ``import dael_plugin``, Dassl's own ``build_backbone("timm_<model>")``
    works from any script, for every model timm has."""
    import types

    if not isinstance(BACKBONE_REGISTRY._obj_map, _TimmAwareMap):
        BACKBONE_REGISTRY._obj_map = _TimmAwareMap(BACKBONE_REGISTRY._obj_map)
        BACKBONE_REGISTRY.registered_names = types.MethodType(
            lambda self: _TimmAwareNames(self._obj_map.keys()), BACKBONE_REGISTRY
        )


def _timm_factory(name: str, weights_file: str):
    def factory(pretrained=True, **kwargs):
        kwargs.pop("verbose", None)
        return TimmBackbone(timm_model_name(name), pretrained=pretrained,
                            weights_file=kwargs.pop("weights_file", weights_file))

    factory.__name__ = name
    return factory


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
    BACKBONE_REGISTRY._do_register(name, _timm_factory(name, weights_file), force=True)


def prepare_cfg(cfg) -> None:
    """Per-run registration that depends on the config (a timm backbone)."""
    register()
    register_timm_backbone(cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.get("WEIGHTS", ""))


__all__ = ["DAELTrainer", "prepare_cfg", "register", "register_timm_backbone"]
