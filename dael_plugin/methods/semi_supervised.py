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
- **MixMatch** (Berthelot et al., NeurIPS 2019): :class:`MixMatchBuiltin`.
- **SupBaseline**: SourceOnly's step, under Dassl's name.

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

from dael_plugin.core.baselines import ema_rate, ema_update, linear_rampup, sigmoid_rampup
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


@register("MixMatch")
class MixMatchBuiltin(OneModel):
    """MixMatch (Berthelot et al., NeurIPS 2019), as Dassl's: the mean of the model's predictions on
    ``DATALOADER.K_TRANSFORMS`` (2 or more) draws of each target image, sharpened at ``TEMP``, is its
    label, shared by its draws; the source images (their first draw, one-hot labels) and the target
    draws are shuffled together, and each batch is mixed up with the shuffled one (Beta(``MIXUP_BETA``,
    ``MIXUP_BETA``), the larger weight its own); the source's soft cross-entropy plus ``WEIGHT_U`` x
    a linear ramp-up over ``RAMPUP`` steps x the squared error on the target. The shuffle and the
    mixing weights are drawn from the CPU generator, in Dassl's order, and moved to the device."""

    k_transforms = 2  # Dassl asserts more than 1: any number of draws from 2 up (check_cfg)

    def check_cfg(self) -> None:
        views = int(self.cfg.DATALOADER.K_TRANSFORMS)
        if views < 2:
            raise DAELConfigError(
                f"DATALOADER.K_TRANSFORMS={views}: MixMatch guesses each target image's label from 2 or more draws "
                "of it (Dassl's assertion); set it to 2"
            )
        self.k_transforms = views
        super().check_cfg()
        node = self.cfg.TRAINER.MIXMATCH
        self.weight_u, self.temp = float(node.WEIGHT_U), float(node.TEMP)
        self.beta, self.rampup = float(node.MIXUP_BETA), int(node.RAMPUP)

    def target_views(self, weak):
        return [weak] * self.k_transforms  # "img", "img2", ...: K draws of each target image

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        dev, n = self.device, batch_x["img"].shape[0]
        x = batch_x["img"].to(dev, non_blocking=True)
        y = F.one_hot(batch_x["label"].to(dev, non_blocking=True), self.num_classes).float()
        keys = ["img"] + [f"img{k}" for k in range(2, self.k_transforms + 1)]
        views = [batch_u[k].to(dev, non_blocking=True) for k in keys]
        weight_u = self.weight_u * linear_rampup(self.global_step, self.rampup)
        with torch.no_grad():  # the target's label: the draws' mean prediction, sharpened (a pass per draw)
            guess = sum(F.softmax(self.model(v).float(), 1) for v in views) / len(views)
            guess = guess.pow(self.temp)
            label_u = (guess / guess.sum(1, keepdim=True)).repeat(len(views), 1)
            xu = torch.cat(views)
        order = torch.randperm(n + xu.shape[0]).to(dev, non_blocking=True)  # Dassl's shuffle_index
        mixed, mixed_y = torch.cat([x, xu])[order], torch.cat([y, label_u])[order]
        x, y = self._mixup(x, mixed[:n], y, mixed_y[:n])
        xu, label_u = self._mixup(xu, mixed[n:], label_u, mixed_y[n:])
        loss_x = (-y * torch.log(F.softmax(self.model(x).float(), 1) + 1e-5)).sum(1).mean()
        loss_u = ((label_u - F.softmax(self.model(xu).float(), 1)) ** 2).mean()
        self.backward_and_update(loss_x + loss_u * weight_u, ("model",))
        return {"loss_x": loss_x.detach(), "loss_u": loss_u.detach()}

    def _mixup(self, x1, x2, y1, y2):
        """Dassl's ``mixup(..., preserve_order=True)``: a weight per image from Beta(beta, beta) on the
        CPU, the larger of it and its complement."""
        lam = torch.distributions.Beta(self.beta, self.beta).sample([x1.shape[0], 1, 1, 1])
        lam = torch.max(lam, 1 - lam).to(x1.device, non_blocking=True)
        return x1 * lam + x2 * (1 - lam), y1 * lam[:, :, 0, 0] + y2 * (1 - lam[:, :, 0, 0])
