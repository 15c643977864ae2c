"""M3SDA (Peng et al., ICCV 2019, "Moment Matching for Multi-Source Domain Adaptation") on the
built-in engine, step for step as Dassl's ``dassl/engine/da/m3sda.py``:

- step A, ``F`` and ``C``: each domain's pair of classifiers on its own chunk (cross-entropy of
  both), plus ``TRAINER.M3SDA.LMDA`` x the moment distance between the chunks' and the target's
  features;
- step B, ``C`` alone, features fixed: the same cross-entropy minus the pairs' discrepancy on the
  target;
- step C, ``F`` alone, ``TRAINER.M3SDA.N_STEP_F`` times: the pairs' discrepancy on the target.

As in Dassl the backbone normalises each domain chunk with its own batch statistics (Dassl calls
it once per chunk; here one call with per-chunk batch norm, ``core/chunk_norm.py``), the target
batch in a call of its own, and the prediction is the mean of the domains' first classifiers.
The chunks and classifiers run batched: no loop over domains.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

from dael_plugin.core import chunk_norm
from dael_plugin.core.baselines import PairHeads, discrepancy, moment_distance
from dael_plugin.errors import DAELConfigError
from dael_plugin.methods.dassl_baseline import DasslBaseline
from dael_plugin.methods.registry import register


@register("M3SDA")
class M3SDABuiltin(DasslBaseline):
    reads_init_weights = False  # Dassl builds its F without loading MODEL.INIT_WEIGHTS
    per_source_domain = True  # a classifier pair per source domain

    def check_cfg(self) -> None:
        super().check_cfg()
        c = self.cfg.DATALOADER
        if c.TRAIN_X.SAMPLER != "RandomDomainSampler":  # Dassl's M3SDA asserts both
            raise DAELConfigError(
                f"M3SDA needs DATALOADER.TRAIN_X.SAMPLER RandomDomainSampler (each batch in domain chunks), "
                f"not {c.TRAIN_X.SAMPLER}; use the M3SDA config (configs/trainers/da/m3sda/)"
            )
        if c.TRAIN_U.SAME_AS_X:
            raise DAELConfigError(
                "M3SDA needs DATALOADER.TRAIN_U.SAME_AS_X False (a target batch of its own size, TRAIN_U.BATCH_SIZE)"
            )
        node = self.cfg.TRAINER.M3SDA
        self.lmda, self.n_step_f = float(node.LMDA), int(node.N_STEP_F)

    def build_model(self) -> Dict[str, nn.Module]:
        backbone = self.build_backbone()
        return {"F": backbone, "C": PairHeads(backbone.out_features, self.num_classes, len(self.sources))}

    def prepare_model(self) -> None:
        self.bn_layers = chunk_norm.convert(self.modules["F"])
        self.per_domain = self.train_loader_x.batch_sampler.per_domain
        self.in_order = self.train_loader_x.batch_sampler.in_order
        self.all_domains = torch.arange(len(self.sources), device=self.device)

    @property
    def num_experts(self) -> int:
        return len(self.sources)

    def _chunks(self, batch_x: dict):
        per = self.per_domain
        n = len(batch_x["label"]) // per
        if self.in_order:  # every domain, in order (SeqDomainSampler, CyclingDomainSampler): no copy
            return n, self.all_domains
        # Dassl's RandomDomainSampler draws the batch's domains in random order (random.sample), as
        # does N_DOMAIN < K: read from the host tensor the loader made (no sync)
        return n, batch_x["domain"].view(n, per)[:, 0].to(self.device, non_blocking=True)

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        per = self.per_domain
        x, y, xu = self.inputs(batch_x, batch_u)
        n, domains = self._chunks(batch_x)
        net, heads = self.modules["F"], self.modules["C"]

        def source_loss(feat: torch.Tensor) -> torch.Tensor:
            # Dassl: sum over chunks of both classifiers' mean cross-entropy, over the chunk count;
            # equal-sized chunks make that the mean over the batch
            z1, z2 = heads.per_chunk(feat.view(n, per, -1), domains)
            return F.cross_entropy(z1.flatten(0, 1), y) + F.cross_entropy(z2.flatten(0, 1), y)

        def target_discrepancy(feat_u: torch.Tensor) -> torch.Tensor:
            z1, z2 = heads.each_domain(feat_u, domains)  # the batch's domains' pairs on the target
            return discrepancy(F.softmax(z1, -1), F.softmax(z2, -1))  # the mean over them, as Dassl's

        # Step A: F and C
        feat = chunk_norm.fused_forward(net, x, [per] * n, layers=self.bn_layers)
        feat_u = net(xu)
        loss_a = source_loss(feat) + moment_distance(feat.view(n, per, -1), feat_u) * self.lmda
        self.backward_and_update(loss_a)
        # Step B: C alone on fixed features (Dassl's order of the calls: the target first)
        with torch.no_grad():
            feat_u = net(xu)
            feat = chunk_norm.fused_forward(net, x, [per] * n, layers=self.bn_layers)
        loss_b = source_loss(feat) - target_discrepancy(feat_u)
        self.backward_and_update(loss_b, ("C",))
        out = {"loss_step_A": loss_a.detach(), "loss_step_B": loss_b.detach()}
        return self.discrepancy_steps(lambda: target_discrepancy(net(xu)), out)  # step C: F alone

    def features_and_experts(self, x: torch.Tensor):
        feat = self.modules["F"](x)
        z1, _ = self.modules["C"].each_domain(feat, self.all_domains)  # (K, B, C): each domain's c1
        return feat, F.softmax(z1, -1).transpose(0, 1)
