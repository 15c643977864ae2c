"""DDAIG (Zhou et al., AAAI 2020, "Deep Domain-Adversarial Image Generation for Domain
Generalisation") on the built-in engine, step for step as Dassl's ``dassl/engine/dg/ddaig.py``: a
label net (``F``, ``C``: Dassl's ``F``), a domain net ``D`` (a backbone of its own and a K-way
classifier) and an image generator ``G`` (``TRAINER.DDAIG.G_ARCH``, Dassl's ``fcn_3x32_gctx`` and
kin, rebuilt key for key in ``backbones/ddaig_fcn.py``). Three updates per batch:

- ``G``: the label net's cross-entropy on ``x_p = G(x, LMDA)`` (optionally clamped to
  ``[CLAMP_MIN, CLAMP_MAX]``) minus the domain net's, so the generated images keep their class and
  lose their domain;
- the label net: (1 - ALPHA) CE(x) + ALPHA CE(x_p) with ``x_p`` from the updated ``G`` (CE(x) alone
  in the first ``WARMUP`` epochs);
- the domain net: CE of the domain labels on ``x``.

Dassl's order of the seven network calls is kept (batch-norm statistics, dropout). ``G``'s update
differentiates only ``G``'s parameters, where Dassl's ``backward`` also fills ``F``'s and ``D``'s
gradients that their own updates then clear: the same numbers, less work. A DG method."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

from dael_plugin.backbones.ddaig_fcn import build_generator
from dael_plugin.errors import DAELConfigError
from dael_plugin.methods.dassl_baseline import DasslBaseline
from dael_plugin.methods.registry import register


@register("DDAIG")
class DDAIGBuiltin(DasslBaseline):
    image_modules = ("F", "D")  # the modules fed images (EXECUTION.CHANNELS_LAST)
    uses_target = False
    per_source_domain = True  # its domain classifier's K classes
    reads_init_weights = False  # Dassl builds F, D and G itself
    ddp_reason = (
        "it updates three nets from three backward passes in turn, which DDP's averaging of one "
        "backward pass does not follow"
    )

    def check_cfg(self) -> None:
        super().check_cfg()
        node = self.cfg.TRAINER.DDAIG
        if not node.G_ARCH:
            raise DAELConfigError(
                "DDAIG needs TRAINER.DDAIG.G_ARCH, its generator (Dassl's: fcn_3x32_gctx for 32x32 digits, "
                "fcn_3x64_gctx for larger images); use the DDAIG config (configs/trainers/dg/ddaig/)"
            )
        self.lmda, self.alpha, self.warmup = float(node.LMDA), float(node.ALPHA), int(node.WARMUP)
        self.clamp = (float(node.CLAMP_MIN), float(node.CLAMP_MAX)) if node.CLAMP else None

    def build_model(self) -> Dict[str, nn.Module]:
        modules = super().build_model()  # the label net, as Dassl's F: backbone, then classifier
        modules["D"] = self.domain_net()
        modules["G"] = build_generator(self.cfg.TRAINER.DDAIG.G_ARCH)
        return modules

    def _perturb(self, x: torch.Tensor) -> torch.Tensor:
        x_p = self.modules["G"](x, self.lmda)
        return x_p.clamp(*self.clamp) if self.clamp is not None else x_p

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        dev = self.device
        x = batch_x["img"].to(dev, non_blocking=True)
        y = batch_x["label"].to(dev, non_blocking=True)
        d = batch_x["domain"].to(dev, non_blocking=True)
        net, head, dnet, gen = self.modules["F"], self.modules["C"], self.modules["D"], self.modules["G"]

        x_p = self._perturb(x)  # G: keep the class, lose the domain
        loss_g = F.cross_entropy(head(net(x_p)), y) - F.cross_entropy(dnet(x_p), d)
        self.guard.update(loss_g)
        self.optims["G"].zero_grad(set_to_none=True)
        loss_g.backward(inputs=list(gen.parameters()))
        self.optims["G"].step()
        with torch.no_grad():
            x_p = self._perturb(x)
        loss_f = F.cross_entropy(head(net(x)), y)  # the label net
        if self.epoch + 1 > self.warmup:
            loss_f = (1.0 - self.alpha) * loss_f + self.alpha * F.cross_entropy(head(net(x_p)), y)
        self.backward_and_update(loss_f, ("F", "C"))
        loss_d = F.cross_entropy(dnet(x), d)  # the domain net
        self.backward_and_update(loss_d, ("D",))
        return {"loss_g": loss_g.detach(), "loss_f": loss_f.detach(), "loss_d": loss_d.detach()}
