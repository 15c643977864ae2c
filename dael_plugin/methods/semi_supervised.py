"""Dassl's semi-supervised trainers (``dassl/engine/ssl``) on the built-in engine, step for step as
Dassl's, with the target domain's unlabeled images as their unlabeled data (Dassl runs them so on
a DA dataset): the usual self-training baselines of domain adaptation.

- **EntMin** (Grandvalet & Bengio, NeurIPS 2004): cross-entropy on the source plus
  ``TRAINER.ENTMIN.LMDA`` x the entropy of the target predictions (with Dassl's log(p + 1e-5)).
- **FixMatch** (Sohn et al., NeurIPS 2020): on the weak views of the source and target images
  together, the model's predictions (no gradient, in training mode, as Dassl's) give pseudo-labels,
  kept where their probability is at least ``TRAINER.FIXMATCH.CONF_THRE``; the strong views
  (``TRAINER.FIXMATCH.STRONG_TRANSFORMS``, drawn for both loaders as Dassl's DataManager draws
  them) are trained towards them, averaged over every image, x ``WEIGHT_U``, beside the source
  cross-entropy.
- **MeanTeacher** (Tarvainen & Valpola, NeurIPS 2017): the squared difference of the student's and
  the teacher's target probabilities, summed over classes, x ``WEIGHT_U`` x a sigmoid ramp-up over
  ``RAMPUP`` *epochs*; the teacher, in training mode as Dassl's, follows the student's parameters
  at rate min(1 - 1/(step+1), ``EMA_ALPHA``).

One optimiser over the model (Dassl's ``SimpleNet``). Not kept from Dassl: FixMatch's log reads
the target's labels (``y_u_pred_acc_raw``, ``y_u_pred_acc_thre``; here only an oracle reads them,
the keep rate is logged), and Dassl's MeanTeacher leaves its teacher out of its checkpoints, so a
resumed Dassl run restarts it from the student; here it is module ``teacher`` and a resume is exact.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

from dael_plugin.core.baselines import ema_rate, ema_update, sigmoid_rampup
from dael_plugin.errors import DAELConfigError
from dael_plugin.methods.dassl_baseline import DasslBaseline
from dael_plugin.methods.registry import register
from dael_plugin.methods.source_only import SourceOnlyBuiltin
from dael_plugin.transforms.host import build_train_transform, check_transform_names


class OneModel(DasslBaseline):
    """Dassl's ``TrainerXU`` of one ``SimpleNet`` (``F`` then ``C``) and one optimiser over it."""

    ddp_reason = (
        "its update passes the model over the source and the target in calls of their own before one "
        "backward pass, which DDP's one-forward-one-backward gradient averaging does not follow"
    )

    def build_optimizers(self) -> Dict[str, torch.optim.Optimizer]:
        return {
            "model": self._build_optim(
                p for n, m in self.modules.items() if n not in self.frozen for p in m.parameters()
            )
        }

    def model(self, x: torch.Tensor) -> torch.Tensor:
        return self.modules["C"](self.modules["F"](x))


@register("EntMin")
class EntMinBuiltin(OneModel):
    def check_cfg(self) -> None:
        super().check_cfg()
        self.lmda = float(self.cfg.TRAINER.ENTMIN.LMDA)

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        x, y, xu = self.inputs(batch_x, batch_u)
        logit_x = self.model(x)
        loss_x = F.cross_entropy(logit_x, y)
        prob_u = F.softmax(self.model(xu).float(), 1)
        loss_u = (-prob_u * torch.log(prob_u + 1e-5)).sum(1).mean()
        self.backward_and_update(loss_x + loss_u * self.lmda, ("model",))
        acc = (logit_x.argmax(-1) == y).float().mean() * 100.0
        return {"loss_x": loss_x.detach(), "acc_x": acc.detach(), "loss_u": loss_u.detach()}


@register("FixMatch")
class FixMatchBuiltin(OneModel):
    def check_cfg(self) -> None:
        super().check_cfg()
        node = self.cfg.TRAINER.FIXMATCH
        check_transform_names(node.STRONG_TRANSFORMS, "TRAINER.FIXMATCH.STRONG_TRANSFORMS")
        if len(node.STRONG_TRANSFORMS) == 0:  # Dassl's check_cfg asserts it
            raise DAELConfigError(
                "TRAINER.FIXMATCH.STRONG_TRANSFORMS is empty; FixMatch needs a strong view, e.g. TRAINER.FIXMATCH."
                "STRONG_TRANSFORMS \"['random_flip', 'randaugment_fixmatch', 'normalize', 'cutout']\" (Dassl's config)"
            )
        self.weight_u, self.conf_thre = float(node.WEIGHT_U), float(node.CONF_THRE)

    def source_views(self, weak):
        return [weak, build_train_transform(self.cfg, self.cfg.TRAINER.FIXMATCH.STRONG_TRANSFORMS)]

    target_views = source_views  # "img", the weak view; "img2", the strong one (Dassl's custom_tfm_train)

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        x, y, xu = self.inputs(batch_x, batch_u)
        x2, xu2 = (b["img2"].to(self.device, non_blocking=True) for b in (batch_x, batch_u))
        with torch.no_grad():  # the pseudo-labels, from the weak views of both batches
            max_prob, pseudo = F.softmax(self.model(torch.cat([x, xu])).float(), 1).max(1)
            keep = (max_prob >= self.conf_thre).float()
        logit_x = self.model(x)
        loss_x = F.cross_entropy(logit_x, y)
        loss_u = (F.cross_entropy(self.model(torch.cat([x2, xu2])), pseudo, reduction="none") * keep).mean()
        self.backward_and_update(loss_x + loss_u * self.weight_u, ("model",))
        acc = (logit_x.argmax(-1) == y).float().mean() * 100.0
        out = {"loss_x": loss_x.detach(), "acc_x": acc.detach(), "loss_u": loss_u.detach()}
        return {**out, "y_u_pred_keep": keep[x.shape[0] :].mean()}


@register("MeanTeacher")
class MeanTeacherBuiltin(OneModel):
    image_modules = ("F", "teacher")  # the modules fed images (EXECUTION.CHANNELS_LAST)
    frozen = ("teacher",)

    def check_cfg(self) -> None:
        super().check_cfg()
        node = self.cfg.TRAINER.MEANTEACHER
        self.weight_u, self.ema_alpha, self.rampup = float(node.WEIGHT_U), float(node.EMA_ALPHA), int(node.RAMPUP)

    def build_model(self) -> Dict[str, nn.Module]:
        return self.with_teacher(super().build_model())

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        x, y, xu = self.inputs(batch_x, batch_u)
        logit_x = self.model(x)
        loss_x = F.cross_entropy(logit_x, y)
        target_u = F.softmax(self.modules["teacher"](xu).float(), 1)
        prob_u = F.softmax(self.model(xu).float(), 1)
        loss_u = ((prob_u - target_u) ** 2).sum(1).mean()
        weight_u = self.weight_u * sigmoid_rampup(self.epoch, self.rampup)  # (Dassl's: by epoch)
        self.backward_and_update(loss_x + loss_u * weight_u, ("model",))
        ema_update(*self.teacher_pairs, ema_rate(self.global_step, self.ema_alpha))
        acc = (logit_x.argmax(-1) == y).float().mean() * 100.0
        return {"loss_x": loss_x.detach(), "acc_x": acc.detach(), "loss_u": loss_u.detach()}


@register("SupBaseline")
class SupBaselineBuiltin(SourceOnlyBuiltin):
    """Dassl's supervised baseline of its semi-supervised trainers: SourceOnly's step (cross-entropy
    on the labeled source alone), under Dassl's name."""
