"""DAEL hyper-parameters and design-choice switches, as plain numbers and strings.

Every default is the paper's choice; the alternatives are the ablations of
the paper's Analysis section (Sec. 4.3, Table 3 and the augmentation study).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Tuple

CHOICES = {
    # Table 3c: target of L_cr is the expert's weak-view prediction or the true label.
    "cr_target": ("expert", "label"),
    # Table 3a / gradient analysis: ensemble of non-experts, or each non-expert alone.
    "cr_mode": ("collaborative", "individual"),
    # Table 3b: K domain experts, or one classifier shared by all domains.
    "classifier": ("experts", "single"),
    # Table 3d: pseudo-label from the most confident expert, or from the ensemble; under category
    # shift, the class every expert that knows it is confident of ("agree"), and with part "other"
    # also every expert that lacks it says "not mine" ("corroborate"; core/category_shift.agreed_labels).
    "pseudo_label": ("expert", "ensemble", "agree", "corroborate"),
    # Footnote to Eq. 2: MSE was chosen over KL divergence.
    "cr_loss": ("mse", "kl"),
    # Sec. 4.3 "Augmentation strategy": (target view, prediction view).
    "views": ("weak_strong", "strong_weak", "strong_strong"),
    # Fig. 4 ablation: which terms of Eq. 4 are on.
    "losses": ("ce_cr_u", "ce_cr", "ce"),
}

# The pseudo-labellers that read which experts know each class (core/category_shift.agreed_labels).
AGREEING = ("agree", "corroborate")
# Category shift (core/category_shift.py): the parts of the design, each a switch on its own;
# "all" is the first four. "other" is the alternative to "experts" (core/category_shift.py).
CLASS_MASK_PARTS = ("experts", "ensemble", "cr", "pseudo_label", "other")
ALL_CLASS_MASK_PARTS = CLASS_MASK_PARTS[:4]
MAX_WEIGHT = 1e4  # a loss weight past this is a typo (the paper's are 0.5 to 1)


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
    # Category shift (core/category_shift.py): which parts of the design are on (CLASS_MASK_PARTS,
    # or "all"). (): the paper's DAEL, on the union of the classes.
    class_masks: Tuple[str, ...] = ()
    # The weight of part "other"'s loss (core/category_shift.other_loss), beside L_ce's 1.
    weight_other: float = 1.0
    # L_u with each kept pseudo-class weighted alike (core/losses.balanced_u_loss).
    u_balance: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name in CHOICES:
                value = getattr(self, f.name)
                if value not in CHOICES[f.name]:
                    raise ValueError(f"{f.name.upper()} must be one of {list(CHOICES[f.name])}, got {value!r}")
        if not 0.0 <= self.conf_thre <= 1.0:
            raise ValueError(f"CONF_THRE must be in [0, 1], got {self.conf_thre}")
        for name, w in (("WEIGHT_U", self.weight_u), ("WEIGHT_OTHER", self.weight_other)):
            # NaN passes "< 0", and 1e300 overflows the loss: the run would stop later, blaming the rate
            if not (isinstance(w, (int, float)) and math.isfinite(w) and 0.0 <= w <= MAX_WEIGHT):
                raise ValueError(f"{name} must be a number from 0 to {MAX_WEIGHT:g}, got {w}")
        parts = tuple(str(p) for p in self.class_masks)
        if "all" in parts:
            if len(parts) > 1:
                raise ValueError(f"CLASS_MASKS: 'all' stands alone, got {list(parts)}")
            parts = ALL_CLASS_MASK_PARTS
        unknown = [p for p in parts if p not in CLASS_MASK_PARTS]
        if unknown or len(set(parts)) != len(parts):
            raise ValueError(
                f"CLASS_MASKS must list parts of {list(CLASS_MASK_PARTS)} at most once each (or be ['all']), "
                f"got {list(self.class_masks)}"
            )
        object.__setattr__(self, "class_masks", tuple(p for p in CLASS_MASK_PARTS if p in parts))
        if self.class_masks and self.classifier != "experts":
            raise ValueError(
                f"CLASS_MASKS {list(self.class_masks)} masks each domain expert's classes: it needs CLASSIFIER experts"
            )
        if "experts" in self.class_masks and "other" in self.class_masks:
            raise ValueError(
                "CLASS_MASKS 'other' trains each expert's mass on the classes its domain lacks as an 'other' answer, "
                "and 'experts' masks that mass away: list one of the two"
            )
        if self.weight_other != 1.0 and "other" not in self.class_masks:
            raise ValueError(
                f"WEIGHT_OTHER {self.weight_other} weighs the loss of CLASS_MASKS part 'other', which is off "
                f"(CLASS_MASKS {list(self.class_masks)}): add 'other' or leave WEIGHT_OTHER at 1.0"
            )
        if self.pseudo_label == "corroborate" and "other" not in self.class_masks:
            raise ValueError(
                "PSEUDO_LABEL corroborate asks the experts that lack a class to say 'not mine', which they learn "
                f"only with CLASS_MASKS part 'other' (CLASS_MASKS {list(self.class_masks)}): add 'other', or use "
                "PSEUDO_LABEL agree"
            )
        if not isinstance(self.u_balance, bool):
            raise ValueError(f"U_BALANCE must be True or False, got {self.u_balance!r}")
        if self.u_balance and self.losses != "ce_cr_u":
            raise ValueError(
                f"U_BALANCE True balances L_u, which LOSSES {self.losses} leaves out: use ce_cr_u or drop it"
            )
        if "cr" in self.class_masks and self.cr_mode != "collaborative":
            raise ValueError(
                "CLASS_MASKS 'cr' compares an expert with the others' per-class mean: it needs CR_MODE collaborative"
            )

    @property
    def reads_class_table(self) -> bool:
        """Whether the run needs each source's classes: a part of ``CLASS_MASKS`` is on, or the
        pseudo-label rule asks the experts that know a class (``agree``, ``corroborate``)."""
        return bool(self.class_masks) or self.pseudo_label in AGREEING

    def masks(self, part: str) -> bool:
        """Whether this part of the category-shift design (:data:`CLASS_MASK_PARTS`) is on."""
        assert part in CLASS_MASK_PARTS, part
        return part in self.class_masks

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
