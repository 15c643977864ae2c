"""DANN (Ganin & Lempitsky, ICML 2015, "Unsupervised Domain Adaptation by Backpropagation") on the
built-in engine, step for step as Dassl's ``dassl/engine/da/dann.py``: a backbone ``F``, a linear
classifier ``C`` and a domain critic (Dassl's ``mlp`` head, hidden ``[fdim, fdim]``, leaky ReLU,
then one logit). One update of every module on

    cross-entropy(source) + BCE(critic(R(f_x)), 1) + BCE(critic(R(f_u)), 0),

where ``R`` reverses the gradient times 2 / (1 + exp(-10 p)) - 1, p the fraction of the whole
run's steps done. As in Dassl, the source and the target pass the backbone, and the critic, in
calls of their own (each batch-norm layer normalises each domain with its own statistics)."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

from dael_plugin.core.baselines import dann_lambda, domain_critic, reverse_grad
from dael_plugin.methods.dassl_baseline import DasslBaseline
from dael_plugin.methods.registry import register


@register("DANN")
class DANNBuiltin(DasslBaseline):
    ddp_reason = (
        "its update passes the backbone twice (source, then target) before one backward pass, which "
        "DDP's one-forward-one-backward gradient averaging does not follow"
    )

    def build_model(self) -> Dict[str, nn.Module]:
        modules = super().build_model()
        fdim = modules["F"].out_features
        modules["critic"] = domain_critic(fdim, [fdim, fdim])
        return modules

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        x, y, xu = self.inputs(batch_x, batch_u)
        net, head, critic = self.modules["F"], self.modules["C"], self.modules["critic"]
        lmda = dann_lambda(self.global_step / (self.cfg.OPTIM.MAX_EPOCH * self.num_batches))
        feat_x = net(x)
        logit_x = head(feat_x)
        feat_u = net(xu)
        loss_x = F.cross_entropy(logit_x, y)
        out_x = critic(reverse_grad(feat_x, lmda))
        out_u = critic(reverse_grad(feat_u, lmda))
        loss_d = F.binary_cross_entropy_with_logits(out_x, torch.ones_like(out_x))
        loss_d = loss_d + F.binary_cross_entropy_with_logits(out_u, torch.zeros_like(out_u))
        self.backward_and_update(loss_x + loss_d)
        acc = (logit_x.argmax(-1) == y).float().mean() * 100.0
        return {"loss_x": loss_x.detach(), "acc_x": acc.detach(), "loss_d": loss_d.detach()}
