"""Host-independent DAEL: plain PyTorch, never imports dassl."""

from dael_plugin.core.algorithm import DAEL, build_heads
from dael_plugin.core.heads import ExpertHeads
from dael_plugin.core.hparams import CHOICES, DAELHparams
from dael_plugin.core.losses import (
    consistency_loss,
    dael_losses,
    ensemble_probs,
    log_mean_probs,
    pseudo_labels,
)

__all__ = [
    "CHOICES",
    "DAEL",
    "DAELHparams",
    "ExpertHeads",
    "build_heads",
    "consistency_loss",
    "dael_losses",
    "ensemble_probs",
    "log_mean_probs",
    "pseudo_labels",
]
