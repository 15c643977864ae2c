"""Registration into Dassl's registries (trainer, datasets, backbones), and the thin trainer.

Importing ``dael_plugin`` has :func:`register` called once ``dassl.engine`` is imported
(``dael_plugin.dassl_hook``); importing this package registers too.
"""

from __future__ import annotations

from dassl.engine import TRAINER_REGISTRY
from yacs.config import CfgNode as CN

from dael_plugin.dassl_adapter.backbones import (
    register_own_backbones,
    register_timm_backbone,
)
from dael_plugin.dassl_adapter.checkpoints import make_dassl_checkpoints_safe
from dael_plugin.dassl_adapter.datasets import register_datasets
from dael_plugin.dassl_adapter.timm_names import make_timm_names_lazy
from dael_plugin.dassl_adapter.trainer import DAELTrainer

TRAINER_NAMES = ("DAEL", "DAELDG")
_registered = False


def register_into_dassl() -> None:
    """Register the DAEL trainer as DAEL and DAELDG, replacing Dassl's built-ins."""
    global _registered
    if _registered:
        return
    replaced = [n for n in TRAINER_NAMES if n in TRAINER_REGISTRY.registered_names()]
    for name in TRAINER_NAMES:
        # Dassl's public register keys a class by its __name__: one subclass per name, each the
        # same trainer (DAEL or DAELDG is read from cfg.TRAINER.NAME, as before)
        TRAINER_REGISTRY.register(_named(name), force=True)
    # Said in the run's log when the trainer is built, not on import: importing a library
    # must not write to stdout (collect's CSV, a test reading a child's first line).
    DAELTrainer.replaced_builtins = tuple(replaced)
    register_own_backbones()
    register_datasets()
    make_timm_names_lazy()
    make_dassl_checkpoints_safe()
    _registered = True


_NAMED: dict = {}


def _named(name: str) -> type:
    if name not in _NAMED:
        _NAMED[name] = type(
            name, (DAELTrainer,), {"__doc__": DAELTrainer.__doc__, "__module__": DAELTrainer.__module__}
        )
    return _NAMED[name]


def prepare_cfg(cfg: CN) -> None:
    """Per-run registration that depends on the config (a timm backbone), and the datasets a
    plugin registered after the first registration (register_datasets adds the missing ones)."""
    register_into_dassl()
    register_datasets()
    register_timm_backbone(
        cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.get("WEIGHTS", ""), tuple(int(v) for v in cfg.INPUT.SIZE)
    )


# Importing the adapter is using Dassl: register (``dael_plugin/__init__`` leaves it to this line
# when dassl.engine was first imported by the adapter itself).
register_into_dassl()

__all__ = ["DAELTrainer", "prepare_cfg", "register", "register_timm_backbone"]
