"""DomainMix (Dassl's ``dassl/engine/dg/domain_mix.py``, from "Dynamic Domain Generalization",
Sun et al., IJCAI 2022) on the built-in engine, step for step as Dassl's: mixup of each source
image with a partner, one weight ``lam ~ Beta(ALPHA, BETA)`` per batch,

    x' = lam x + (1 - lam) x[perm],  loss = lam CE(f(x'), y) + (1 - lam) CE(f(x'), y[perm]).

``TRAINER.DOMAINMIX.TYPE crossdomain`` draws each image's partner from the *other* domains of the
batch (per domain, without replacement when there are enough, as Dassl's ``multinomial``),
``random`` from the whole batch.

The partners are drawn on the host from the loader's domain labels, with Dassl's calls in Dassl's
order (so the same seed gives Dassl's partners on CPU): the device never reports a count to the
host. One difference on a GPU: Dassl draws its first permutation with the device's generator,
this engine with the host's."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch.nn import functional as F

from dael_plugin.errors import DAELConfigError
from dael_plugin.methods.dassl_baseline import DasslBaseline
from dael_plugin.methods.registry import register


def domain_mix_partners(domain: torch.Tensor, mix_type: str) -> torch.Tensor:
    """Each image's mixing partner (an index into the batch), from the batch's domain labels on
    the host, with Dassl's draws: a random permutation, then for ``crossdomain`` each domain's
    images (in the order of ``torch.unique``) take partners among the other domains' images."""
    perm = torch.randperm(domain.size(0), dtype=torch.int64)
    if mix_type == "crossdomain":
        domains = torch.unique(domain)
        if len(domains) > 1:
            for idx in domains:  # K domains on the host: the draws Dassl makes, in its order
                mine = domain == idx
                cnt_a = int(mine.sum())
                others = (~mine).nonzero().squeeze(-1)
                picks = torch.ones(others.shape[0]).multinomial(num_samples=cnt_a, replacement=cnt_a > others.shape[0])
                perm[mine] = others[picks]
    elif mix_type != "random":
        raise DAELConfigError(f"TRAINER.DOMAINMIX.TYPE is 'random' or 'crossdomain', not {mix_type!r}")
    return perm


@register("DomainMix")
class DomainMixBuiltin(DasslBaseline):
    uses_target = False
    ddp_reason = "its mixing partners are drawn across the whole batch, which each process holds only a share of"

    def check_cfg(self) -> None:
        super().check_cfg()
        node = self.cfg.TRAINER.DOMAINMIX
        self.mix_type, self.alpha, self.beta = str(node.TYPE), float(node.ALPHA), float(node.BETA)
        if self.mix_type not in ("random", "crossdomain"):
            raise DAELConfigError(f"TRAINER.DOMAINMIX.TYPE is 'random' or 'crossdomain', not {self.mix_type!r}")
        self.dist_beta = torch.distributions.Beta(self.alpha, self.beta)  # ALPHA, BETA > 0: check_run_values

    def build_optimizers(self):
        return {"model": self._build_optim(self.modules.parameters())}  # Dassl's one SimpleNet optimiser

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        dev = self.device
        lam = self.dist_beta.rsample((1,))
        perm = domain_mix_partners(batch_x["domain"], self.mix_type)
        x = batch_x["img"].to(dev, non_blocking=True)
        y = batch_x["label"].to(dev, non_blocking=True)
        lam, perm = lam.to(dev, non_blocking=True), perm.to(dev, non_blocking=True)
        mixed = lam * x + (1 - lam) * x[perm, :]
        out = self.modules["C"](self.modules["F"](mixed))
        loss = lam * F.cross_entropy(out, y) + (1 - lam) * F.cross_entropy(out, y[perm])
        self.backward_and_update(loss.squeeze(), ("model",))
        acc = (out.argmax(-1) == y).float().mean() * 100.0
        return {"loss": loss.detach().squeeze(), "acc": acc.detach()}
