"""Self-ensembling (French et al., ICLR 2018, "Self-ensembling for visual domain adaptation") on the
built-in engine, step for step as Dassl's ``dassl/engine/da/se.py``: a student (``F``, ``C``) and
a teacher, its exponential moving average. One update of the student on

    cross-entropy(source) + consistency(student(u1), teacher(u2)),

u1 and u2 two views of each target image (``DATALOADER.K_TRANSFORMS 2``); the consistency is the
squared difference of the two softmaxes, summed over classes and averaged over the batch with the
images whose teacher confidence is not above ``TRAINER.SE.CONF_THRE`` counted as zeros (with
``CONF_THRE 0``: weighted by a sigmoid ramp-up over ``TRAINER.SE.RAMPUP`` steps). Then the
teacher's parameters move to the student's at rate min(1 - 1/(step+1), ``TRAINER.SE.EMA_ALPHA``).

Dassl's quirks, kept: the teacher runs in training mode (its batch norm uses the batch's
statistics and keeps running ones of its own, which the EMA does not touch, and its dropout is
on); the source batch uses the first view only. Not kept: Dassl's teacher is not in its
checkpoints, so a resumed Dassl run restarts it from the initial weights; here the teacher is
module ``teacher`` of the checkpoint and a resume is exact. Predictions are the student's, as
Dassl's."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

from dael_plugin.core.baselines import ema_rate, ema_update, se_consistency, sigmoid_rampup
from dael_plugin.errors import DAELConfigError
from dael_plugin.methods.dassl_baseline import DasslBaseline
from dael_plugin.methods.registry import register


@register("SE")
class SEBuiltin(DasslBaseline):
    image_modules = ("F", "teacher")  # the modules fed images (EXECUTION.CHANNELS_LAST)
    frozen = ("teacher",)
    k_transforms = 2
    ddp_reason = (
        "its update passes the backbone twice (source, then target) before one backward pass, and "
        "its teacher averages each process's own weights; DDP follows neither"
    )

    def check_cfg(self) -> None:
        super().check_cfg()  # DATALOADER.K_TRANSFORMS 2: two views of each target image
        node = self.cfg.TRAINER.SE
        self.ema_alpha, self.conf_thre, self.rampup = float(node.EMA_ALPHA), float(node.CONF_THRE), int(node.RAMPUP)
        if not self.conf_thre and self.rampup <= 0:
            raise DAELConfigError(
                "TRAINER.SE.RAMPUP must be positive when TRAINER.SE.CONF_THRE is 0 (the ramp-up's length)"
            )

    def target_views(self, weak):
        return [weak, weak]  # "img" and "img2": two draws of the weak view

    def build_model(self) -> Dict[str, nn.Module]:
        return self.with_teacher(super().build_model())

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        x, y, xu1 = self.inputs(batch_x, batch_u)
        xu2 = batch_u["img2"].to(self.device, non_blocking=True)
        net, head, teacher = self.modules["F"], self.modules["C"], self.modules["teacher"]
        step = self.global_step
        logit_x = head(net(x))
        loss_x = F.cross_entropy(logit_x, y)
        prob_u = F.softmax(head(net(xu1)), 1)
        t_prob_u = F.softmax(teacher(xu2), 1)
        weight = 1.0 if self.conf_thre else sigmoid_rampup(step, self.rampup)
        loss_u = se_consistency(prob_u, t_prob_u, self.conf_thre, weight)
        self.backward_and_update(loss_x + loss_u, ("F", "C"))
        ema_update(*self.teacher_pairs, ema_rate(step, self.ema_alpha))
        acc = (logit_x.argmax(-1) == y).float().mean() * 100.0
        return {"loss_x": loss_x.detach(), "acc_x": acc.detach(), "loss_u": loss_u.detach()}
