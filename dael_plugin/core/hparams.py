"""DAEL hyper-parameters and design-choice switches, as plain numbers and strings.

Every default is the paper's choice; the alternatives are the ablations of
the paper's Analysis section (Sec. 4.3, Table 3 and the augmentation study).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

CHOICES = {
    # Table 3c: target of L_cr is the expert's weak-view prediction or the true label.
    "cr_target": ("expert", "label"),
    # Table 3a / gradient analysis: ensemble of non-experts, or each non-expert alone.
    "cr_mode": ("collaborative", "individual"),
    # Table 3b: K domain experts, or one classifier shared by all domains.
    "classifier": ("experts", "single"),
    # Table 3d: pseudo-label from the most confident expert, or from the ensemble.
    "pseudo_label": ("expert", "ensemble"),
    # Footnote to Eq. 2: MSE was chosen over KL divergence.
    "cr_loss": ("mse", "kl"),
    # Sec. 4.3 "Augmentation strategy": (target view, prediction view).
    "views": ("weak_strong", "strong_weak", "strong_strong"),
    # Fig. 4 ablation: which terms of Eq. 4 are on.
    "losses": ("ce_cr_u", "ce_cr", "ce"),
}


@dataclass(frozen=True)
class DAELHparams:
    """Hyper-parameters of Eq. 4 and the design switches of Sec. 4.3."""

    weight_u: float = 0.5
    conf_thre: float = 0.95
    cr_target: str = "expert"
    cr_mode: str = "collaborative"
    classifier: str = "experts"
    pseudo_label: str = "expert"
    cr_loss: str = "mse"
    views: str = "weak_strong"
    losses: str = "ce_cr_u"
    # Category shift (core/category_shift.py): experts over their domains' classes, the per-class
    # ensemble, L_cr on shared classes. Off: the paper's DAEL, on the union of classes.
    class_masks: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name in CHOICES:
                value = getattr(self, f.name)
                if value not in CHOICES[f.name]:
                    raise ValueError(f"{f.name.upper()} must be one of {list(CHOICES[f.name])}, got {value!r}")
        if not 0.0 <= self.conf_thre <= 1.0:
            raise ValueError(f"CONF_THRE must be in [0, 1], got {self.conf_thre}")
        if self.weight_u < 0:
            raise ValueError(f"WEIGHT_U must be >= 0, got {self.weight_u}")
        if self.class_masks and (self.cr_mode != "collaborative" or self.classifier != "experts"):
            raise ValueError(
                "CLASS_MASKS True masks each domain expert's classes and compares an expert with the others' "
                "per-class mean: it needs CLASSIFIER experts and CR_MODE collaborative"
            )

    @property
    def use_cr(self) -> bool:
        return self.losses in ("ce_cr", "ce_cr_u")

    @property
    def use_u(self) -> bool:
        return self.losses == "ce_cr_u"

    @property
    def num_views(self) -> int:
        """Views the data loader must produce: weak, strong (and a 2nd strong)."""
        return 3 if self.views == "strong_strong" else 2

    @property
    def view_indices(self) -> tuple[int, int]:
        """Indices (target view, prediction view) into (weak, strong, strong2)."""
        return {"weak_strong": (0, 1), "strong_weak": (1, 0), "strong_strong": (1, 2)}[self.views]
