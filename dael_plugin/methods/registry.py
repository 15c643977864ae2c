"""The one registry of the built-in engine's methods, by ``--trainer`` name.

Each method is a file of ``dael_plugin/methods/`` that registers its class with :func:`register`
(``dael_plugin.methods`` imports them all); a method of your own registers the same way from a
file named by ``--plugin`` or listed under the ``dael_plugin.methods`` entry points
(tools/plugins.py). Nothing else in the package lists method names.
"""

from __future__ import annotations

from typing import Dict, Optional

from yacs.config import CfgNode as CN

from dael_plugin.config.keys import add_method_node
from dael_plugin.engine.trainer import BuiltinTrainer
from dael_plugin.errors import DAELConfigError

TRAINERS: Dict[str, type] = {}


def trainer_names() -> list:
    """Every ``--trainer`` the built-in engine runs."""
    return sorted(TRAINERS)


def register(name: str, config: Optional[dict] = None):
    """Make a trainer class ``--trainer NAME`` on the built-in engine (a class decorator). A name
    already taken is refused: a second class would silently replace the first. ``config``: the
    method's own keys and their defaults, as ``TRAINER.<NAME>`` (Dassl's convention; YAML files,
    the command line and sweep grids set them, and an unknown key is refused as any other)."""

    def add(cls):
        if name in TRAINERS and TRAINERS[name] is not cls:
            raise DAELConfigError(f"a built-in trainer named {name!r} exists; pick another")
        if not (isinstance(cls, type) and issubclass(cls, BuiltinTrainer)):
            raise DAELConfigError(f"{cls!r} is not a BuiltinTrainer subclass; derive it from SingleClassifier")
        if config is not None:
            add_method_node(name, config)
        TRAINERS[name] = cls
        return cls

    return add


def trainer_class(name: str) -> type:
    """The built-in trainer class of ``--trainer NAME``."""
    if name not in TRAINERS:
        raise DAELConfigError(
            f"trainer {name!r} is not available on the built-in engine (it has {trainer_names()}); "
            "a trainer of your own: --plugin MODULE, the module that registers it (docs/internals.md)"
        )
    return TRAINERS[name]


def method_setting(name: str) -> str:
    """ "DA" or "DG" of a trainer's runs, from its class's ``uses_target`` (a name the built-in engine
    does not know: "DA"), for a run folder without results.json; a run's own record says it."""
    try:
        cls = trainer_class(name)
    except DAELConfigError:
        return "DA"
    return "DA" if cls.uses_target else "DG"


def build_trainer(
    cfg: CN, eval_each_epoch: bool = False, eval_only: bool = False, splits=None, backbones=None
) -> BuiltinTrainer:
    """The trainer of ``cfg.TRAINER.NAME``, built (its data read, or ``splits`` taken; its model made,
    its backbone by ``backbones`` where given: BuiltinTrainer's arguments)."""
    cls = trainer_class(cfg.TRAINER.NAME)
    return cls(cfg, eval_each_epoch=eval_each_epoch, eval_only=eval_only, splits=splits, backbones=backbones)
