"""MCD (Saito et al., CVPR 2018, "Maximum Classifier Discrepancy for Unsupervised Domain
Adaptation") on the built-in engine, step for step as Dassl's ``dassl/engine/da/mcd.py``: two
classifiers ``C1``, ``C2`` on one feature extractor ``F``, each with its own optimiser;

- step A (``F``, ``C1``, ``C2``): both classifiers' source cross-entropy;
- step B (``C1`` and ``C2``, features fixed): that cross-entropy minus their discrepancy on the
  target;
- step C (``F`` alone, ``TRAINER.MCD.N_STEP_F`` times): the discrepancy.

The prediction is ``C1``'s, as Dassl's ``model_inference``. The sources pass the backbone as one
batch and the target in a call of its own, in Dassl's order."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

from dael_plugin.core.baselines import discrepancy
from dael_plugin.methods.dassl_baseline import DasslBaseline
from dael_plugin.methods.registry import register


@register("MCD")
class MCDBuiltin(DasslBaseline):
    reads_init_weights = False  # Dassl builds its F without loading MODEL.INIT_WEIGHTS

    def check_cfg(self) -> None:
        super().check_cfg()
        self.n_step_f = int(self.cfg.TRAINER.MCD.N_STEP_F)

    def build_model(self) -> Dict[str, nn.Module]:
        backbone = self.build_backbone()
        fdim = backbone.out_features
        return {"F": backbone, "C1": nn.Linear(fdim, self.num_classes), "C2": nn.Linear(fdim, self.num_classes)}

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        x, y, xu = self.inputs(batch_x, batch_u)
        net, c1, c2 = self.modules["F"], self.modules["C1"], self.modules["C2"]

        def source_loss(feat: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(c1(feat), y) + F.cross_entropy(c2(feat), y)

        def target_discrepancy(feat_u: torch.Tensor) -> torch.Tensor:
            return discrepancy(F.softmax(c1(feat_u), 1), F.softmax(c2(feat_u), 1))

        loss_a = source_loss(net(x))  # step A: F, C1, C2
        self.backward_and_update(loss_a)
        with torch.no_grad():  # step B: the classifiers alone
            feat, feat_u = net(x), net(xu)
        loss_b = source_loss(feat) - target_discrepancy(feat_u)
        self.backward_and_update(loss_b, ("C1", "C2"))
        out = {"loss_step_A": loss_a.detach(), "loss_step_B": loss_b.detach()}
        return self.discrepancy_steps(lambda: target_discrepancy(net(xu)), out)  # step C: F alone

    def features_and_experts(self, x: torch.Tensor):
        feat = self.modules["F"](x)
        return feat, F.softmax(self.modules["C1"](feat), -1).unsqueeze(1)
