"""Host-independent DAEL: plain PyTorch, never imports dassl."""
from .algorithm import DAEL, build_heads
from .heads import ExpertHeads
from .hparams import CHOICES, DAELHparams
from .losses import consistency_loss, dael_losses, ensemble_probs, log_mean_probs, pseudo_labels

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
