"""CDAC (Li et al., CVPR 2021, "Cross-Domain Adaptive Clustering for Semi-Supervised Domain
Adaptation") on the built-in engine, step for step as Dassl's ``dassl/engine/da/cdac.py``: a
backbone ``F`` and a cosine classifier ``C`` over class prototypes (MME's, temperature 0.05), whose
rate is ``TRAINER.CDAC.CLASS_LR_MULTI`` times ``F``'s. Each step makes two updates of both:

1. the source cross-entropy (Eq. 2), on the weak view;
2. on the target, the weak view ``u`` and two strong views ``s1``, ``s2``
   (``TRAINER.CDAC.STRONG_TRANSFORMS``, ``DATALOADER.K_TRANSFORMS 2``), each through the backbone
   in a call of its own:

   - minus the adversarial adaptive clustering loss (Eq. 3, :func:`~dael_plugin.core.baselines.aac_loss`)
     of C(R(F(u))) against C(R(F(s1))), ``R`` reversing the gradient, with the pairs' similarity
     1 where two weak-view features share their ``TOPK_MATCH`` largest dimensions;
   - the pseudo-label loss (Eq. 4): the cross-entropy of C(F(s2)) towards the weak view's
     prediction, kept where its probability is at least ``P_THRESH`` (averaged over the batch);
   - the consistency loss (Eq. 8): ``RAMPUP_COEF`` x a sigmoid ramp-up over ``RAMPUP_ITRS`` steps
     x the mean squared difference of the two strong views' probabilities.

The learning rates follow Dassl's per-step annealing (:func:`~dael_plugin.core.baselines.cdac_lr_factor`
over ``OPTIM.MAX_EPOCH`` epochs of ``TRAIN.COUNT_ITER``'s batches), stepped after each step, so
``OPTIM.LR_SCHEDULER`` is not read (one line if set). Not kept from Dassl: its log's pseudo-label
accuracy reads the target's labels during training (here only an oracle reads them; the keep
rate is logged), and ``TRAIN.COUNT_ITER train_u`` stops Dassl's CDAC with an AttributeError
(here it counts the target loader's batches)."""

from __future__ import annotations

import functools
from typing import Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

from dael_plugin.core.baselines import (
    Prototypes,
    aac_loss,
    cdac_lr_factor,
    rank_similarity,
    reverse_grad,
    sigmoid_rampup,
)
from dael_plugin.engine.loop import epoch_length
from dael_plugin.errors import DAELConfigError
from dael_plugin.methods.dassl_baseline import DasslBaseline
from dael_plugin.methods.registry import register
from dael_plugin.transforms.host import build_train_transform, check_transform_names


@register("CDAC")
class CDACBuiltin(DasslBaseline):
    reads_init_weights = False  # Dassl builds its F without loading MODEL.INIT_WEIGHTS
    k_transforms = 2  # Dassl's check: two draws of the strong view of each target image
    ddp_reason = (
        "its update passes the backbone three times (the weak view and two strong ones) before one "
        "backward pass, which DDP's one-forward-one-backward gradient averaging does not follow"
    )

    def check_cfg(self) -> None:
        super().check_cfg()  # DATALOADER.K_TRANSFORMS 2; the keys' ranges: config/ranges.py
        node, o = self.cfg.TRAINER.CDAC, self.cfg.OPTIM
        check_transform_names(node.STRONG_TRANSFORMS, "TRAINER.CDAC.STRONG_TRANSFORMS")
        if len(node.STRONG_TRANSFORMS) == 0:
            raise DAELConfigError(
                "TRAINER.CDAC.STRONG_TRANSFORMS is empty; CDAC needs a strong view, e.g. "
                "TRAINER.CDAC.STRONG_TRANSFORMS \"['randaugment', 'normalize']\" (Dassl's configs)"
            )
        steps = list(o.STEPSIZE) if isinstance(o.STEPSIZE, (list, tuple)) else [o.STEPSIZE]
        if o.LR_SCHEDULER != "single_step" or steps != [-1]:
            raise DAELConfigError(
                f"OPTIM.LR_SCHEDULER {o.LR_SCHEDULER!r} (STEPSIZE {steps}): CDAC's learning rate follows its own "
                "per-step annealing, as Dassl's, which reads neither; remove them"
            )
        self.lr_multi = float(node.CLASS_LR_MULTI)
        self.topk, self.p_thresh = int(node.TOPK_MATCH), float(node.P_THRESH)
        self.rampup_coef, self.rampup_iters = float(node.RAMPUP_COEF), int(node.RAMPUP_ITRS)

    def target_views(self, weak):
        strong = build_train_transform(self.cfg, self.cfg.TRAINER.CDAC.STRONG_TRANSFORMS)
        return [weak, strong, strong]  # "img", then two draws of the strong view: "img2", "img3"

    def build_model(self) -> Dict[str, nn.Module]:
        backbone = self.build_backbone()
        return {"F": backbone, "C": Prototypes(backbone.out_features, self.num_classes)}

    def build_optimizers(self) -> Dict[str, torch.optim.Optimizer]:
        optims = super().build_optimizers()
        for group in optims["C"].param_groups:  # Dassl: C's rate times CLASS_LR_MULTI, before its scheduler
            group["lr"] *= self.lr_multi
        return optims

    def build_scheduler(self, optim):
        loaders = (self.train_loader_x, self.train_loader_u)
        max_steps = int(self.cfg.OPTIM.MAX_EPOCH) * epoch_length(loaders, self.cfg.TRAIN.COUNT_ITER)
        return torch.optim.lr_scheduler.LambdaLR(optim, functools.partial(cdac_lr_factor, max_steps=max_steps))

    def schedulers(self):
        return ()  # stepped after each step (update), not after each epoch

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        x, y, xu = self.inputs(batch_x, batch_u)
        xs1, xs2 = (batch_u[k].to(self.device, non_blocking=True) for k in ("img2", "img3"))
        net, head = self.modules["F"], self.modules["C"]
        logit_x = head(net(x))
        loss_x = F.cross_entropy(logit_x, y)
        self.backward_and_update(loss_x)

        feat_u, feat_s1, feat_s2 = net(xu), net(xs1), net(xs2)
        logit_u_r, logit_s1_r = head(reverse_grad(feat_u)), head(reverse_grad(feat_s1))
        loss_aac = -aac_loss(rank_similarity(feat_u, self.topk), logit_u_r, logit_s1_r)
        prob_u = F.softmax(head(feat_u), 1).detach()
        prob_s1 = F.softmax(head(feat_s1), 1)
        logit_s2 = head(feat_s2)
        max_prob, pseudo = prob_u.max(1)
        keep = (max_prob >= self.p_thresh).float()
        loss_pl = (F.cross_entropy(logit_s2, pseudo, reduction="none") * keep).mean()
        ramp = sigmoid_rampup(self.global_step, self.rampup_iters) if self.rampup_iters else 1.0
        loss_cons = ramp * self.rampup_coef * F.mse_loss(prob_s1, F.softmax(logit_s2, 1))
        loss_u = loss_aac + loss_pl + loss_cons
        self.backward_and_update(loss_u)
        for sched in self.scheds.values():
            sched.step()
        acc = (logit_x.argmax(-1) == y).float().mean() * 100.0
        return {
            "loss_x": loss_x.detach(),
            "acc_x": acc.detach(),
            "loss_u": loss_u.detach(),
            "aac_loss": loss_aac.detach(),
            "pl_loss": loss_pl.detach(),
            "cons_loss": loss_cons.detach(),
            "p_u_pred_keep": keep.mean(),
        }
