"""DAEL as a host-independent algorithm: a backbone, expert heads and the losses.

Like a DomainBed ``Algorithm`` it takes tensors and numbers only. A host (the
Dassl trainer or the built-in engine) parses its batches, says which chunk of
the batch comes from which source domain, calls :meth:`DAEL.losses` and runs
the backward pass and optimiser step itself.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import torch
from torch import nn

from .chunk_norm import per_chunk_batch_norm, unfusable_reason
from .heads import ExpertHeads
from .hparams import DAELHparams
from .losses import dael_losses, ensemble_probs


class DAEL:
    """Domain Adaptive Ensemble Learning (Zhou et al.), Algorithm 1.

    Args:
        featurizer: the shared backbone, ``(B, ...) -> (B, D)``.
        heads: the K experts (``ExpertHeads`` with K = number of source
            domains, or 1 for the single-classifier ablation).
        hparams: loss weights and design switches.
        fuse_chunks: run the source chunks of a view through the backbone in
            one call with per-chunk batch-norm statistics (same semantics as
            one call per chunk; see :mod:`.chunk_norm`). Falls back to one call
            per chunk, saying why once, where that is not exact.
    """

    def __init__(
        self,
        featurizer: Callable[[torch.Tensor], torch.Tensor],
        heads: ExpertHeads,
        hparams: DAELHparams,
        fuse_chunks: bool = False,
    ) -> None:
        self.featurizer = featurizer
        self.heads = heads
        self.hparams = hparams
        self.fuse_chunks = fuse_chunks
        self._fusable: Optional[bool] = None

    def _can_fuse(self) -> bool:
        if self._fusable is None:
            reason = unfusable_reason(self.featurizer) if isinstance(self.featurizer, torch.nn.Module) else "not a module"
            self._fusable = reason is None
            if reason is not None:
                print(f"dael_plugin: FUSE_CHUNKS falls back to one backbone call per domain chunk: {reason}")
        return self._fusable

    def encode(self, x: torch.Tensor, chunk_sizes: Sequence[int]) -> torch.Tensor:
        """Features of ``x`` with batch-norm statistics per domain chunk.

        One backbone call per source-domain chunk, as in Dassl's reference
        DAEL, or, with ``fuse_chunks`` and equal chunks, one call in which
        each chunk is normalised with its own statistics.
        """
        if len(chunk_sizes) == 1:
            return self.featurizer(x)
        if self.fuse_chunks and len(set(chunk_sizes)) == 1 and self._can_fuse():
            with per_chunk_batch_norm(self.featurizer, len(chunk_sizes)):
                return self.featurizer(x)
        return torch.cat([self.featurizer(c) for c in torch.split(x, list(chunk_sizes))], 0)

    def losses(
        self,
        x_views: Sequence[torch.Tensor],
        labels: torch.Tensor,
        expert_idx: torch.Tensor,
        chunk_sizes: Sequence[int],
        u_views: Optional[Sequence[torch.Tensor]] = None,
    ) -> Dict[str, torch.Tensor]:
        """Compute Eq. 4 on one mini-batch.

        Args:
            x_views: labeled source images under each view, ``(weak, strong[,
                strong2])``, each ``(N, ...)``; domains in contiguous chunks.
            labels: ``(N,)`` class labels.
            expert_idx: ``(N,)`` each sample's source-domain (expert) index.
            chunk_sizes: sizes of the contiguous single-domain chunks of the batch.
            u_views: unlabeled target images under each view, or ``None`` (DG).
        Returns:
            the dict of :func:`dael_losses`.
        """
        hp = self.hparams
        t, p = hp.view_indices
        if hp.classifier == "single":
            expert_idx = torch.zeros_like(expert_idx)

        logits_u_t = logits_u_p = None
        use_u = hp.use_u and u_views is not None
        # Same backbone-call order as the reference: the target pseudo-label
        # pass first (no gradient), so running BN statistics evolve identically.
        if use_u:
            with torch.no_grad():
                logits_u_t = self.heads(self.featurizer(u_views[t]))
        logits_x_p = None
        if hp.use_cr and self.fuse_chunks and x_views[t].shape == x_views[p].shape:
            # Both views in one call: 2K chunks in the reference's call order
            # (target view d1..dK, then prediction view d1..dK), so batch-norm
            # statistics and running-statistic updates are unchanged.
            feats = self.encode(torch.cat([x_views[t], x_views[p]]), list(chunk_sizes) * 2)
            logits_x_t, logits_x_p = self.heads(feats).split(x_views[t].shape[0])
        else:
            logits_x_t = self.heads(self.encode(x_views[t], chunk_sizes))
            if hp.use_cr:
                logits_x_p = self.heads(self.encode(x_views[p], chunk_sizes))
        if use_u:
            logits_u_p = self.heads(self.featurizer(u_views[p]))

        return dael_losses(
            logits_x_t,
            logits_x_p if logits_x_p is not None else logits_x_t,
            labels,
            expert_idx,
            hp,
            logits_u_t,
            logits_u_p,
        )

    def predict_experts(self, x: torch.Tensor) -> torch.Tensor:
        """Each expert's class probabilities, ``(B, K, C)``."""
        return torch.softmax(self.heads(self.featurizer(x)), dim=-1)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Test-time prediction: the mean of all experts' probabilities, ``(B, C)``."""
        return ensemble_probs(self.heads(self.featurizer(x)))


def build_heads(in_features: int, num_classes: int, num_domains: int, hparams: DAELHparams) -> nn.Module:
    """K experts, or one shared classifier for the Table 3b ablation."""
    k = 1 if hparams.classifier == "single" else num_domains
    return ExpertHeads(in_features, num_classes, k)
