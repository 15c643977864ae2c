"""The built-in engine's methods, one file each, every one registered by importing this package:
DAEL and DAELDG, SourceOnly and Vanilla, and Dassl's baselines (M3SDA, MME, MCD, DANN, SE, ADDA,
AdaBN, CDAC; CrossGrad, DomainMix, DDAIG) and semi-supervised trainers (EntMin, FixMatch,
MeanTeacher, MixMatch, SupBaseline), each step for step as Dassl's own.

A method of your own: derive from :class:`SingleClassifier` (or :class:`DasslBaseline` for
several optimisers), write its ``update`` and register it (docs/internals.md).
"""

from dael_plugin.methods import (  # noqa: F401 (each registers its methods)
    adabn,
    adda,
    cdac,
    crossgrad,
    dael,
    dann,
    ddaig,
    domain_mix,
    m3sda,
    mcd,
    mme,
    se,
    semi_supervised,
    source_only,
)
from dael_plugin.methods.dassl_baseline import DasslBaseline
from dael_plugin.methods.registry import TRAINERS, build_trainer, method_setting, register, trainer_class, trainer_names
from dael_plugin.methods.single_classifier import SingleClassifier

__all__ = [
    "TRAINERS",
    "DasslBaseline",
    "SingleClassifier",
    "build_trainer",
    "method_setting",
    "register",
    "trainer_class",
    "trainer_names",
]
