"""MME (Saito et al., ICCV 2019, "Semi-supervised Domain Adaptation via Minimax Entropy") on the
built-in engine, step for step as Dassl's ``dassl/engine/da/mme.py``: a cosine classifier over
class prototypes (temperature 0.05); one update of ``F`` and ``C`` on the source cross-entropy,
then one on ``TRAINER.MME.LMDA`` x the negative target entropy, through a reversed gradient (the
classifier raises the entropy, the feature extractor lowers it). The target batch passes the
backbone in a call of its own, as in Dassl."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

from dael_plugin.core.baselines import Prototypes, mme_entropy_loss, reverse_grad
from dael_plugin.methods.dassl_baseline import DasslBaseline
from dael_plugin.methods.registry import register


@register("MME")
class MMEBuiltin(DasslBaseline):
    reads_init_weights = False  # Dassl builds its F without loading MODEL.INIT_WEIGHTS

    def check_cfg(self) -> None:
        super().check_cfg()
        self.lmda = float(self.cfg.TRAINER.MME.LMDA)

    def build_model(self) -> Dict[str, nn.Module]:
        backbone = self.build_backbone()
        return {"F": backbone, "C": Prototypes(backbone.out_features, self.num_classes)}

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        x, y, xu = self.inputs(batch_x, batch_u)
        net, head = self.modules["F"], self.modules["C"]
        logit_x = head(net(x))
        loss_x = F.cross_entropy(logit_x, y)
        self.backward_and_update(loss_x)
        loss_u = mme_entropy_loss(head(reverse_grad(net(xu))))
        self.backward_and_update(loss_u * self.lmda)
        acc = (logit_x.argmax(-1) == y).float().mean() * 100.0
        return {"loss_x": loss_x.detach(), "acc_x": acc.detach(), "loss_u": loss_u.detach()}
