"""DAEL as a host-independent algorithm: a backbone, expert heads and the losses.

Like a DomainBed ``Algorithm`` it takes tensors and numbers only. A host (the
Dassl trainer or the built-in engine) parses its batches, says which chunk of
the batch comes from which source domain, calls :meth:`DAEL.losses` and runs
the backward pass and optimiser step itself.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from dael_plugin.core.category_shift import mask_logits
from dael_plugin.core.chunk_norm import (
    convert,
    fused_forward,
    resolve_impl,
    unfusable_reason,
)
from dael_plugin.core.heads import ExpertHeads
from dael_plugin.core.hparams import DAELHparams
from dael_plugin.core.losses import dael_losses, ensemble_probs


class DAEL:
    """Domain Adaptive Ensemble Learning (Zhou et al.), Algorithm 1.

    Args:
        featurizer: the shared backbone, ``(B, ...) -> (B, D)``.
        heads: the K experts (``ExpertHeads`` with K = number of source
            domains, or 1 for the single-classifier ablation).
        hparams: loss weights and design switches.
        fuse_chunks: run every chunk that takes a gradient (the source chunks
            of both views and the target batch) through the backbone in one
            call with per-chunk batch-norm statistics: the same semantics as one
            call per chunk (see :mod:`.chunk_norm`). Falls back to one call per
            chunk, saying why once, where that is not possible.
        chunk_bn: the per-chunk batch-norm implementation, ``auto``, ``split``
            or ``grouped`` (:mod:`.chunk_norm`).
        class_mask: ``(K, C)`` bool under category shift (:mod:`.category_shift`): which classes
            each source domain holds; read by the parts of the design ``hparams.class_masks`` turns
            on and by the ``agree`` / ``corroborate`` rules (none: the paper, and the table is not kept).
    """

    def __init__(
        self,
        featurizer: Callable[[torch.Tensor], torch.Tensor],
        heads: ExpertHeads,
        hparams: DAELHparams,
        fuse_chunks: bool = True,
        chunk_bn: str = "auto",
        class_mask: Optional[torch.Tensor] = None,
    ) -> None:
        self.featurizer = featurizer
        self.heads = heads
        self.hparams = hparams
        if hparams.reads_class_table and class_mask is None:
            raise ValueError(
                f"CLASS_MASKS {list(hparams.class_masks)} / PSEUDO_LABEL {hparams.pseudo_label} needs the (K, C) "
                "table of each domain's classes"
            )
        self.class_mask = class_mask if hparams.reads_class_table else None
        self.fuse_chunks = fuse_chunks
        resolve_impl(chunk_bn, "cpu")  # a bad name fails here, not in the first step
        self.chunk_bn = chunk_bn
        self._bns = None
        # Decided here, once: nothing in a (possibly compiled) step changes this
        # object's state, so a compiled step never recompiles.
        if fuse_chunks:
            reason = unfusable_reason(featurizer)
            if reason is None:
                self._bns = convert(featurizer)  # per-chunk modules in place of the layers, once
                if not self._bns:
                    print(
                        "dael_plugin: the backbone has no batch-norm layer (any LayerNorm or GroupNorm normalises "
                        "each image alone), so per-domain statistics do not apply: the fused pass is one plain call, "
                        "and EXECUTION.CHUNK_BN changes nothing"
                    )
            else:
                self.fuse_chunks = False
                print(f"dael_plugin: FUSE_CHUNKS falls back to one backbone call per domain chunk: {reason}")

    def encode(self, x: torch.Tensor, chunk_sizes: Sequence[int]) -> torch.Tensor:
        """Features of ``x`` with batch-norm statistics per chunk.

        One backbone call per chunk, as in Dassl's reference DAEL, or, with
        ``fuse_chunks``, one call in which each chunk is normalised with its
        own statistics (:mod:`.chunk_norm`): the same normalisation and the
        same running-statistic updates, in the same order.
        """
        if len(chunk_sizes) == 1:
            return self.featurizer(x)
        if self.fuse_chunks:
            return fused_forward(self.featurizer, x, chunk_sizes, self.chunk_bn, self._bns)
        return torch.cat([self.featurizer(c) for c in torch.split(x, list(chunk_sizes))], 0)

    def gradient_parts(
        self,
        x_views: Sequence[torch.Tensor],
        chunk_sizes: Sequence[int],
        u_views: Optional[Sequence[torch.Tensor]] = None,
    ) -> Tuple[List[torch.Tensor], List[List[int]]]:
        """The views that take a gradient, in the order the step's one fused call takes them, and
        each one's domain chunks: the source chunks of the target view, those of the prediction
        view (with L_cr), and the target batch's prediction view (with L_u). The first-step check
        of the fused pass (engine/first_step_check.py) checks this very layout."""
        hp = self.hparams
        t, p = hp.view_indices
        use_u = hp.use_u and u_views is not None
        source_views = [x_views[t], x_views[p]] if hp.use_cr else [x_views[t]]
        parts = source_views + ([u_views[p]] if use_u else [])
        part_chunks = [list(chunk_sizes)] * len(source_views) + ([[u_views[p].shape[0]]] if use_u else [])
        return parts, part_chunks

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
        # pass first (no gradient), then the source chunks of the target view,
        # those of the prediction view, then the target batch's prediction view.
        # Fused, the last three are one call with a chunk each, so batch-norm
        # statistics and running-statistic updates are unchanged.
        if use_u:
            with torch.no_grad():
                logits_u_t = self.heads(self.featurizer(u_views[t]))
        parts, part_chunks = self.gradient_parts(x_views, chunk_sizes, u_views)
        if self.fuse_chunks and all(v.shape[1:] == parts[0].shape[1:] for v in parts):
            feats = self.encode(torch.cat(parts), [c for cs in part_chunks for c in cs])
        else:
            feats = torch.cat([self.encode(v, cs) for v, cs in zip(parts, part_chunks)])
        logits = self.heads(feats)
        sizes = [v.shape[0] for v in parts]
        pieces = list(logits.split(sizes))
        logits_x_t = pieces[0]
        logits_x_p = pieces[1] if hp.use_cr else logits_x_t
        if use_u:
            logits_u_p = pieces[-1]

        return dael_losses(logits_x_t, logits_x_p, labels, expert_idx, hp, logits_u_t, logits_u_p, self.class_mask)

    @property
    def ensemble_mask(self) -> Optional[torch.Tensor]:
        """The class table where the ensemble is the per-class one (``CLASS_MASKS`` part ``ensemble``),
        for the trainers' evaluation and records; None for the mean over experts."""
        return self.class_mask if self.hparams.masks("ensemble") else None

    def _logits(self, feats: torch.Tensor) -> torch.Tensor:
        logits = self.heads(feats)
        return mask_logits(logits, self.class_mask) if self.hparams.masks("experts") else logits

    def features_and_experts(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The backbone's features ``(B, D)`` and each expert's class probabilities ``(B, K, C)``
        (the inputs of the selection validators)."""
        feats = self.featurizer(x)
        return feats, torch.softmax(self._logits(feats), dim=-1)

    def predict_experts(self, x: torch.Tensor) -> torch.Tensor:
        """Each expert's class probabilities, ``(B, K, C)``."""
        return torch.softmax(self._logits(self.featurizer(x)), dim=-1)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Test-time prediction: the mean of all experts' probabilities, ``(B, C)``."""
        return ensemble_probs(self.heads(self.featurizer(x)), self.class_mask, self.hparams.class_masks)


def build_heads(in_features: int, num_classes: int, num_domains: int, hparams: DAELHparams) -> nn.Module:
    """K experts, or one shared classifier for the Table 3b ablation."""
    k = 1 if hparams.classifier == "single" else num_domains
    return ExpertHeads(in_features, num_classes, k)
