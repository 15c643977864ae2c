"""AdaBN (Li et al., 2016, "Revisiting Batch Normalization For Practical Domain Adaptation") on the
built-in engine, as Dassl's ``dassl/engine/da/adabn.py``: a source model (``MODEL.INIT_WEIGHTS``,
a SourceOnly run's checkpoint) whose batch-norm statistics are reset before the first epoch and
then re-estimated on the target: each step passes a target batch through the model in training
mode, without gradients. No weight changes.

Dassl's quirks, kept: the statistics are running averages at each layer's momentum (0.1 by
default), not the exact mean over the target set, so the last batches weigh most. Not kept:
Dassl resets the statistics at the first epoch of every process, so a resumed Dassl run throws
away what earlier epochs estimated; here they are reset only at the run's first epoch."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from dael_plugin.core.baselines import reset_batch_norm_stats
from dael_plugin.errors import DAELConfigError
from dael_plugin.methods.dassl_baseline import DasslBaseline
from dael_plugin.methods.registry import register


@register("AdaBN")
class AdaBNBuiltin(DasslBaseline):
    optimises = False  # Dassl's AdaBN never calls update_lr either
    needs_init_weights = True
    ddp_reason = "its batch-norm statistics would be each process's own share of the target"

    def build_step(self) -> None:
        super().build_step()
        if not any(isinstance(m, torch.nn.modules.batchnorm._NormBase) for m in self.modules.modules()):
            raise DAELConfigError(  # before the first batch, not at it
                f"AdaBN re-estimates batch-norm statistics, and {self.cfg.MODEL.BACKBONE.NAME} has no "
                "batch-norm layer; choose a backbone with batch norm"
            )

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        if self.global_step == 0:
            reset_batch_norm_stats(self.modules)
        xu = batch_u["img"].to(self.device, non_blocking=True)
        with torch.no_grad():
            self.modules["C"](self.modules["F"](xu))
        return {}
