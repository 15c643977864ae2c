"""SourceOnly (the DA baseline: one classifier on the pooled sources, never trained on the target)
and Vanilla (the same step as Dassl's DG baseline), on the built-in engine."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch.nn import functional as F

from dael_plugin.methods.registry import register
from dael_plugin.methods.single_classifier import SingleClassifier


@register("SourceOnly")
class SourceOnlyBuiltin(SingleClassifier):
    """One classifier trained with cross-entropy on the pooled source domains: the DA baseline that
    never trains on the target (its runs are DA: the records' validators may read target images)."""

    uses_target = True
    target_batches = False

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        x = batch_x["img"].to(self.device, non_blocking=True)
        y = batch_x["label"].to(self.device, non_blocking=True)
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        self.backward_and_update(loss)
        acc = (logits.argmax(-1) == y).float().mean() * 100.0
        return {"loss": loss.detach(), "acc": acc}


@register("Vanilla")
class VanillaBuiltin(SourceOnlyBuiltin):
    """SourceOnly's step as Dassl's DG ``Vanilla``: a DG method (it never reads target data)."""

    uses_target = False
