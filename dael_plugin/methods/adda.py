"""ADDA (Tzeng et al., CVPR 2017, "Adversarial Discriminative Domain Adaptation") on the built-in
engine, step for step as Dassl's ``dassl/engine/da/adda.py``. It starts from a source model
(``MODEL.INIT_WEIGHTS``, a SourceOnly run's checkpoint): a frozen copy of its backbone,
``F_source``, embeds the source images, and the trained backbone ``F`` the target ones. Each step:

- the critic (Dassl's ``mlp`` head, hidden ``[fdim, fdim // 2]``, leaky ReLU, one logit) learns
  to tell ``F_source(x)`` (1) from ``F(u)`` (0), binary cross-entropy;
- ``F`` learns to make the critic say 1 for ``F(u)``.

The classifier ``C`` stays the source model's: Dassl opens only the backbone (and a head) for
training, so ``C`` gets no gradient and its optimiser never moves it. ``F_source`` runs in
evaluation mode (its batch norm on the source model's running statistics), as Dassl's copy."""

from __future__ import annotations

import copy
from typing import Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

from dael_plugin.core.baselines import domain_critic
from dael_plugin.methods.dassl_baseline import DasslBaseline
from dael_plugin.methods.registry import register


@register("ADDA")
class ADDABuiltin(DasslBaseline):
    image_modules = ("F", "F_source")  # the modules fed images (EXECUTION.CHANNELS_LAST)
    frozen = ("F_source",)
    needs_init_weights = True
    ddp_reason = (
        "its update steps the critic and the backbone from two backward passes in turn, which DDP's "
        "averaging of one backward pass does not follow"
    )

    def build_model(self) -> Dict[str, nn.Module]:
        modules = super().build_model()
        fdim = modules["F"].out_features
        modules["critic"] = domain_critic(fdim, [fdim, fdim // 2])
        modules["F_source"] = copy.deepcopy(modules["F"]).requires_grad_(False)
        return modules

    def prepare_model(self) -> None:
        self.modules["C"].requires_grad_(False)  # Dassl's open_specified_layers(["backbone", "head"])

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        x, _, xu = self.inputs(batch_x, batch_u)
        net, critic, source = self.modules["F"], self.modules["critic"], self.modules["F_source"]
        source.eval()  # (the loop's train() at each epoch's start reaches it too)
        self.modules["C"].eval()
        with torch.no_grad():
            feat_x = source(x)
        feat_u = net(xu)
        logit_xd, logit_ud = critic(feat_x), critic(feat_u.detach())
        loss_critic = F.binary_cross_entropy_with_logits(logit_xd, torch.ones_like(logit_xd))
        loss_critic = loss_critic + F.binary_cross_entropy_with_logits(logit_ud, torch.zeros_like(logit_ud))
        self.backward_and_update(loss_critic, ("critic",))
        logit_ud = critic(feat_u)
        loss_model = F.binary_cross_entropy_with_logits(logit_ud, torch.ones_like(logit_ud))
        self.backward_and_update(loss_model, ("F", "C"))
        return {"loss_critic": loss_critic.detach(), "loss_model": loss_model.detach()}
