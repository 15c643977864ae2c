"""DAEL under category shift: source domains with different label sets (Dassl's issue #34).

The label space is the union of the sources' classes; ``class_mask`` ``(K, C)`` says which
classes source domain k holds (True) and so which its expert can have learned. The paper's DAEL
assumes every domain holds every class; read naively here, expert k is trained by L_ce to put
no mass on the classes its domain lacks, its zero probability there pulls the ensemble down on
exactly the classes only some sources hold, and L_cr asks expert i to match the other experts on
classes expert i has never seen labelled (and the other way round).

The design, each part a consequence of "an expert speaks only about the classes it knows":

- **experts** predict over their own domain's classes: the other logits are set to ``NEG``, a
  large finite negative (not ``-inf``: ``0 * log 0`` and ``inf - inf`` would give NaN in
  ``logsumexp``, KL and the backward pass), so their probability is 0 and their gradient 0;
- **the ensemble** (test time, L_u, the "ensemble" pseudo-label) averages, for each class, the
  experts that know it, then renormalises over classes (:func:`class_ensemble`): a class held by
  one source counts that expert alone, instead of being divided by K;
- **L_cr** compares expert i with the mean of the *other* experts on the classes they share:
  for each class of domain i, the others that know it are averaged; classes no other expert knows
  are dropped; both distributions are renormalised over what is left
  (:func:`shared_consistency`); a sample whose expert shares no class with the others adds 0;
- **the pseudo-label** comes from the most confident expert: with masked logits each expert's
  argmax is one of its own classes, so that is "the most confident expert among those that know
  its class" with no further rule.

**An alternative to masking the experts, part ``other``** (measured because the masks do not
repair L_u: an expert whose domain lacks the true class cannot say so, and is confidently wrong
among its own classes). The experts keep all C outputs, and each learns to put its mass on the
classes its domain lacks, read as one answer "not mine", from the other source domains' images
of those classes (:func:`other_loss`, added to the loss). An expert's probability of one of its
own classes is then lowered by its "not mine" mass; the per-class ensemble and the pseudo-label
restricted to each expert's classes (parts ``ensemble`` and ``pseudo_label``) read it so. Masking
(``experts``) would remove that mass, so the two are exclusive.

With every domain holding every class these are today's losses: the masks are all True,
nothing is set to ``NEG``, each class is averaged over all K experts and the renormalisations
divide by sums that are 1 (a test holds this to float rounding). The paper's path itself
(``class_mask=None``) does not pass through this module at all.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

NEG = -1.0e4  # a masked logit: exp(NEG - max) is 0 in fp32, fp16 and bf16, and NEG is finite in all three
_TINY = 1e-12


def tiny(dtype: torch.dtype) -> float:
    """The smallest divisor or log argument for ``dtype``: ``_TINY``, or the smallest normal number
    where ``_TINY`` underflows (fp16, whose 6.1e-5 is above it; a clamp at an underflowed 0 gave 0 / 0).
    A Python float: no host-to-device copy in a step."""
    return max(_TINY, float(torch.finfo(dtype).tiny))


def mask_logits(logits: torch.Tensor, class_mask: torch.Tensor) -> torch.Tensor:
    """``(B, K, C)`` logits with each expert's unknown classes set to :data:`NEG`."""
    return logits.masked_fill(~class_mask, NEG)  # a Python scalar: no host-to-device copy in a step


def class_ensemble(probs: torch.Tensor, class_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``(B, K, C) -> (B, C)``: for each class the mean of the experts that know it, renormalised
    over classes. All True, it is the mean over experts (the paper's ensemble); ``None`` (no
    per-class ensemble), exactly that mean."""
    if class_mask is None:
        return probs.mean(dim=1)
    m = class_mask.to(probs.dtype)
    per_class = (probs * m).sum(1) / m.sum(0).clamp_min(1.0)
    return per_class / per_class.sum(-1, keepdim=True).clamp_min(tiny(probs.dtype))


def shared_consistency(
    target: torch.Tensor,
    log_probs_p: torch.Tensor,
    expert_idx: torch.Tensor,
    class_mask: torch.Tensor,
    kind: str = "mse",
) -> torch.Tensor:
    """L_cr on shared classes (collaborative mode): expert i's target ``(B, C)`` against the
    per-class mean of the other experts ``(B, K, C)`` log-probabilities, both restricted to the
    classes of domain i that another expert knows and renormalised there. Mean over samples.

    A sample whose target puts no mass on those classes has nothing to compare and adds 0: with
    ``CR_TARGET label``, a sample whose class no other expert knows (renormalised, the others' mean
    would still sum to 1 against a zero target, and the squared error would push the other experts
    towards uniform); with any target, a domain that shares no class."""
    b, k, c = log_probs_p.shape
    dtype = log_probs_p.dtype
    m = class_mask.to(dtype)
    if k == 1:
        others = log_probs_p.new_ones(b, 1)
    else:
        others = (expert_idx.unsqueeze(1) != torch.arange(k, device=expert_idx.device)).to(dtype)
    w = others.unsqueeze(-1) * m  # (B, K, C): expert j counts for class c of sample b
    count = w.sum(1)  # (B, C)
    ens = (w * log_probs_p.exp()).sum(1) / count.clamp_min(1.0)
    shared = m[expert_idx] * (count > 0).to(dtype)  # domain i's classes that another expert knows
    eps = tiny(dtype)
    ens = ens * shared
    ens = ens / ens.sum(-1, keepdim=True).clamp_min(eps)
    t = target.to(dtype) * shared
    t_mass = t.sum(-1, keepdim=True)
    t = t / t_mass.clamp_min(eps)
    if kind == "mse":
        dist = (ens - t).pow(2).sum(-1)
    elif kind == "kl":
        dist = (torch.xlogy(t, t) - t * ens.clamp_min(eps).log()).sum(-1)
    else:
        raise ValueError(f"unknown consistency loss {kind!r}")
    return (dist * (t_mass.squeeze(-1) > 0).to(dtype)).mean()  # nothing to compare: 0 (docstring)


def other_loss(log_probs: torch.Tensor, labels: torch.Tensor, class_mask: torch.Tensor) -> torch.Tensor:
    """Part ``other``: each expert learns to answer "not one of my classes" (its mass on the classes
    its domain lacks) on the other source domains' images of those classes.

    ``log_probs`` ``(N, K, C)`` of every expert on the labelled source images; ``labels`` ``(N,)``.
    For each pair (image n, expert k) whose class expert k's domain lacks, ``-log sum_{c not in S_k}
    p_k(c)``; the mean over those pairs (0 where there is none: every domain holding every class
    gives 0). An image's own expert never lacks its class."""
    dtype = log_probs.dtype
    log_other = torch.logsumexp(log_probs.masked_fill(class_mask, NEG), dim=-1)  # (N, K): log p_k(not S_k)
    lacks = (~class_mask).to(dtype).t()[labels]  # (N, K): expert k's domain lacks image n's class
    return -(lacks * log_other).sum() / lacks.sum().clamp_min(1.0)


def agreed_labels(
    probs: torch.Tensor, class_mask: Optional[torch.Tensor], conf_thre: float, not_mine: bool = False
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pseudo-labels that every expert able to speak about the class gives (``PSEUDO_LABEL agree``
    and ``corroborate``; docs/category_shift.md, "Pseudo-labelling rules").

    ``probs`` ``(B, K, C)``. A class's score is the smallest probability that the experts knowing it
    (``class_mask[k, c]``) give it: it passes ``conf_thre`` only where all of them are confident of it,
    so an expert whose domain lacks the true class can no longer impose its own confident guess, and
    a class one source alone holds is that expert's. With ``not_mine`` (``corroborate``, needs part
    ``other``) the experts whose domain *lacks* the class must also say "not mine": their mass on
    the classes they lack enters the minimum. The pseudo-label is the best-scoring class, kept where
    its score is ``>= conf_thre`` and no other class's score is (two sources' classes claimed at
    once, the ambiguous case, are dropped). Without ``class_mask`` every expert knows every class:
    the label all K experts give.

    Returns labels ``(B,)`` long, mask ``(B,)`` in {0, 1} (``probs.dtype``) and the score ``(B,)``."""
    b, k, c = probs.shape
    if class_mask is None:
        class_mask = torch.ones(k, c, dtype=torch.bool, device=probs.device)
    big = torch.finfo(probs.dtype).max
    score = probs.masked_fill(~class_mask, big).amin(1)  # (B, C): the least confident knower
    if not_mine:
        lacked = (probs * (~class_mask).to(probs.dtype)).sum(-1)  # (B, K): each expert's "not mine" mass
        score = torch.minimum(score, lacked.unsqueeze(-1).masked_fill(class_mask, big).amin(1))
    score = score.masked_fill(~class_mask.any(0), 0.0)  # a class no expert knows (refused earlier) scores 0
    if c == 1:
        conf, labels = score[:, 0], score.new_zeros(b, dtype=torch.long)
        return labels, (conf >= conf_thre).to(probs.dtype), conf
    top, idx = score.topk(2, dim=1)
    mask = ((top[:, 0] >= conf_thre) & (top[:, 1] < conf_thre)).to(probs.dtype)
    return idx[:, 0], mask, top[:, 0]
