"""CrossGrad (Shankar et al., ICLR 2018, "Generalizing Across Domains via Cross-Gradient Training")
on the built-in engine, step for step as Dassl's ``dassl/engine/dg/crossgrad.py``: a label net
(``F``, ``C``: Dassl's ``F``) and a domain net ``D`` (a backbone of its own and a K-way classifier).
Each step perturbs the images along each net's input gradient, clamped to [-0.1, 0.1]:

- ``x_d = x + EPS_F * clamp(d loss_D / d x)`` (the domain net's gradient) trains the label net:
  (1 - ALPHA_F) CE(F(x), y) + ALPHA_F CE(F(x_d), y);
- ``x_f = x + EPS_D * clamp(d loss_F / d x)`` trains the domain net:
  (1 - ALPHA_D) CE(D(x), d) + ALPHA_D CE(D(x_f), d).

Dassl's order of the six network calls is kept (each updates batch-norm statistics and draws
dropout). The input gradients come from ``torch.autograd.grad``, where Dassl's ``backward`` also
fills the nets' parameter gradients, which its updates then clear unused: the same numbers, less
work. A DG method: no target data."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

from dael_plugin.methods.dassl_baseline import DasslBaseline
from dael_plugin.methods.registry import register


@register("CrossGrad")
class CrossGradBuiltin(DasslBaseline):
    image_modules = ("F", "D")  # the modules fed images (EXECUTION.CHANNELS_LAST)
    uses_target = False
    per_source_domain = True  # its domain classifier's K classes
    reads_init_weights = False  # Dassl builds F and D itself
    ddp_reason = (
        "each step differentiates both nets by their inputs and updates them from two backward passes "
        "in turn, which DDP's averaging of one backward pass does not follow"
    )

    def check_cfg(self) -> None:
        super().check_cfg()
        node = self.cfg.TRAINER.CROSSGRAD
        self.eps_f, self.eps_d = float(node.EPS_F), float(node.EPS_D)
        self.alpha_f, self.alpha_d = float(node.ALPHA_F), float(node.ALPHA_D)

    def build_model(self) -> Dict[str, nn.Module]:
        modules = super().build_model()  # the label net, as Dassl's F: backbone, then classifier
        modules["D"] = self.domain_net()
        return modules

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        dev = self.device
        x = batch_x["img"].to(dev, non_blocking=True)
        y = batch_x["label"].to(dev, non_blocking=True)
        d = batch_x["domain"].to(dev, non_blocking=True)
        net, head, dnet = self.modules["F"], self.modules["C"], self.modules["D"]

        def label_net(z: torch.Tensor) -> torch.Tensor:
            return head(net(z))

        xg = x.detach().requires_grad_(True)
        (grad_d,) = torch.autograd.grad(F.cross_entropy(dnet(xg), d), xg)
        x_d = x + self.eps_f * grad_d.clamp(-0.1, 0.1)  # the domain perturbation, for the label net
        (grad_f,) = torch.autograd.grad(F.cross_entropy(label_net(xg), y), xg)
        x_f = x + self.eps_d * grad_f.clamp(-0.1, 0.1)  # the label perturbation, for the domain net
        loss_f = (1 - self.alpha_f) * F.cross_entropy(label_net(x), y)
        loss_f = loss_f + self.alpha_f * F.cross_entropy(label_net(x_d), y)
        self.backward_and_update(loss_f, ("F", "C"))
        loss_d = (1 - self.alpha_d) * F.cross_entropy(dnet(x), d)
        loss_d = loss_d + self.alpha_d * F.cross_entropy(dnet(x_f), d)
        self.backward_and_update(loss_d, ("D",))
        return {"loss_f": loss_f.detach(), "loss_d": loss_d.detach()}
