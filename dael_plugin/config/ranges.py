"""The valid range of each baseline key, checked on a merged config by every engine
(``check_run_values``): a value outside it is one line before any data is read."""

from __future__ import annotations

import math

from yacs.config import CfgNode as CN

from dael_plugin.errors import DAELConfigError

# The valid range of each baseline key the run's trainer reads: (key, low, high, low open, what).
# Where Dassl's constructor refuses a value (DomainMix's Beta(ALPHA, BETA) needs both > 0), the
# same; elsewhere the range in which the key means what its method says (a negative loss weight
# turns a distance to minimise into one to maximise: M3SDA at LMDA -1 collapsed to one class).
BASELINE_RANGES = {
    "M3SDA": [("LMDA", 0.0, None, False, "the moment-distance weight"),
              ("N_STEP_F", 1, None, False, "F's steps on the discrepancy")],
    "MME": [("LMDA", 0.0, None, False, "the entropy weight")],
    "CDAC": [("CLASS_LR_MULTI", 0.0, None, True, "the classifier's learning-rate multiplier"),
             ("RAMPUP_COEF", 0.0, None, False, "the consistency loss's weight"),
             ("RAMPUP_ITRS", 0, None, False, "the ramp-up's length in steps"),
             ("TOPK_MATCH", 1, None, False, "the feature dimensions compared"),
             ("P_THRESH", 0.0, 1.0, False, "the pseudo-label confidence threshold")],
    "MCD": [("N_STEP_F", 1, None, False, "F's steps on the discrepancy")],
    "CrossGrad": [("EPS_F", 0.0, None, False, "the label net's perturbation step"),
                  ("EPS_D", 0.0, None, False, "the domain net's perturbation step"),
                  ("ALPHA_F", 0.0, 1.0, False, "the perturbed images' weight in the label net's loss"),
                  ("ALPHA_D", 0.0, 1.0, False, "the perturbed images' weight in the domain net's loss")],
    "DDAIG": [("LMDA", 0.0, None, False, "the perturbation's weight"),
              ("WARMUP", 0, None, False, "the warm-up epochs"),
              ("ALPHA", 0.0, 1.0, False, "the generated images' weight in the label net's loss")],
    "DomainMix": [("ALPHA", 0.0, None, True, "Beta(ALPHA, BETA)'s first parameter (as in Dassl's DomainMix)"),
                  ("BETA", 0.0, None, True, "Beta(ALPHA, BETA)'s second parameter (as in Dassl's DomainMix)")],
    "EntMin": [("LMDA", 0.0, None, False, "the entropy weight")],
    "FixMatch": [("WEIGHT_U", 0.0, None, False, "the pseudo-label loss's weight"),
                 ("CONF_THRE", 0.0, 1.0, False, "the pseudo-label confidence threshold")],
    "MeanTeacher": [("WEIGHT_U", 0.0, None, False, "the consistency loss's weight"),
                    ("EMA_ALPHA", 0.0, 1.0, False, "the teacher's EMA rate"),
                    ("RAMPUP", 1, None, False, "the ramp-up's length in epochs")],
    "MixMatch": [("WEIGHT_U", 0.0, None, False, "the target loss's weight"),
                 ("TEMP", 0.0, None, True, "the sharpening temperature"),
                 ("MIXUP_BETA", 0.0, None, True, "Beta(MIXUP_BETA, MIXUP_BETA)'s parameter (as in Dassl's mixup)"),
                 ("RAMPUP", 1, None, False, "the ramp-up's length in steps")],
    "SE": [("EMA_ALPHA", 0.0, 1.0, False, "the teacher's EMA rate"),
           ("CONF_THRE", 0.0, 1.0, False, "the teacher's confidence threshold"),
           ("RAMPUP", 1, None, False, "the ramp-up's length in steps")],
}  # fmt: skip


def check_baseline_values(cfg: CN) -> None:
    """The run's baseline keys within :data:`BASELINE_RANGES`, one line otherwise (both engines:
    Dassl's own trainers read the same keys)."""
    name = str(cfg.TRAINER.NAME)
    node = cfg.TRAINER.get(name.upper())
    for key, low, high, low_open, what in BASELINE_RANGES.get(name, ()) if node is not None else ():
        if key not in node:
            continue
        value = node[key]
        whole = isinstance(low, int) and not isinstance(low, float)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (not whole or isinstance(value, int))
        ok = ok and math.isfinite(value) and (value > low if low_open else value >= low)
        ok = ok and (high is None or value <= high)
        if not ok:
            bound = f"{'>' if low_open else '>='} {low}" + (f" and <= {high}" if high is not None else "")
            kind = "an integer " if whole else "a number "
            cfg_key = f"TRAINER.{name.upper()}.{key}"
            raise DAELConfigError(f"{cfg_key}={value!r} is invalid: {what} must be {kind}{bound}")
    if name == "DDAIG" and node is not None and node.get("CLAMP") and not node.CLAMP_MIN < node.CLAMP_MAX:
        raise DAELConfigError(
            f"TRAINER.DDAIG.CLAMP_MIN {node.CLAMP_MIN} must be below CLAMP_MAX {node.CLAMP_MAX} (CLAMP True)"
        )
