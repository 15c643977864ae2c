"""The DAEL losses (paper Eq. 1-4, Algorithm 1), vectorised over samples and experts.

All functions take logits shaped ``(B, K, C)``: B samples, K experts, C
classes. None of them moves data to the host, so they can run inside a
training step without a device sync.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
from torch.nn import functional as F

from dael_plugin.core.category_shift import (
    agreed_labels,
    class_ensemble,
    mask_logits,
    other_loss,
    shared_consistency,
    tiny,
)
from dael_plugin.core.hparams import AGREEING, ALL_CLASS_MASK_PARTS, DAELHparams


def log_mean_probs(log_probs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``log(sum_k w_k p_k / sum_k w_k)`` computed stably in log space.

    Args:
        log_probs: ``(B, K, C)`` per-expert log-probabilities.
        weights: ``(B, K)`` non-negative weights (0 excludes an expert).
    Returns:
        ``(B, C)`` log of the weighted mean probability.
    """
    log_w = torch.log(weights).unsqueeze(-1)
    return torch.logsumexp(log_probs + log_w, dim=1) - torch.log(weights.sum(1)).unsqueeze(-1)


def pseudo_labels(
    probs: torch.Tensor,
    conf_thre: float,
    source: str = "expert",
    class_mask: Optional[torch.Tensor] = None,
    own_classes: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pseudo-labels for unlabeled target data (Eq. 3).

    ``source="expert"`` takes the argmax of the most confident expert i* (the
    expert whose max probability is highest); ``source="ensemble"`` takes the
    argmax of the mean of all experts (Table 3d); ``"agree"`` and ``"corroborate"``
    the class every expert that knows it is confident of (category shift).

    Args:
        probs: ``(B, K, C)`` probabilities on the target view; not differentiated.
        conf_thre: keep a sample where the chosen max probability >= this.
        class_mask: ``(K, C)`` under category shift (core/category_shift.py): with ``source="ensemble"``
            the ensemble is the per-class mean of the experts that know each class.
        own_classes: ``(K, C)``, with ``source="expert"``: each expert's candidate is its most probable
            class among those its domain holds, with that class's probability as its confidence
            (``CLASS_MASKS`` part ``pseudo_label``; a no-op where part ``experts`` already masked them).
            With ``source="agree"`` / ``"corroborate"`` (category shift): which experts know each class
            (:func:`.category_shift.agreed_labels`; ``None``: all of them).
    Returns:
        labels ``(B,)`` long, mask ``(B,)`` float in {0, 1}, confidence ``(B,)``.
    """
    probs = probs.detach()
    if source == "expert":
        if own_classes is not None:
            probs = probs.masked_fill(~own_classes, 0.0)
        expert_conf, expert_label = probs.max(dim=2)  # (B, K)
        conf, best = expert_conf.max(dim=1)  # (B,)
        labels = expert_label.gather(1, best.unsqueeze(1)).squeeze(1)
    elif source == "ensemble":
        ens = class_ensemble(probs, class_mask)
        conf, labels = ens.max(dim=1)
    elif source in AGREEING:
        return agreed_labels(probs, own_classes, conf_thre, not_mine=source == "corroborate")
    else:
        raise ValueError(f"unknown pseudo-label source {source!r}")
    mask = (conf >= conf_thre).to(probs.dtype)
    return labels, mask, conf


def _one_hot(index: torch.Tensor, n: int, dtype: torch.dtype, equal: bool = True) -> torch.Tensor:
    """``(B, n)`` one-hot rows of ``index`` (or their complement). ``F.one_hot`` on CPU reads
    the indices' minimum back to the host to check it; a comparison reads nothing."""
    classes = torch.arange(n, device=index.device)
    hits = index.unsqueeze(1) == classes if equal else index.unsqueeze(1) != classes
    return hits.to(dtype)


def balanced_u_loss(ce: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, num_classes: int) -> torch.Tensor:
    """L_u with each pseudo-class weighted alike (``TRAINER.DAEL.U_BALANCE``): the mean over the kept
    samples' classes of each class's mean loss, times the share of samples kept (Eq. 3 counts the
    others as zeros). Where every kept class is kept equally often it is Eq. 3's masked mean exactly;
    a class one source alone pseudo-labels, kept rarely, is no longer outweighed by the common ones.
    ``ce``, ``labels``, ``mask``: ``(M,)``. No host read (counts from :func:`_one_hot`, not ``bincount``)."""
    hits = _one_hot(labels, num_classes, ce.dtype) * mask.unsqueeze(1)
    count = hits.sum(0)  # (C,) kept samples per pseudo-class
    present = (count > 0).to(ce.dtype).sum()
    per_class = (hits * ce.unsqueeze(1)).sum(0) / count.clamp_min(1.0)  # (C,) each class's mean loss
    return per_class.sum() / present.clamp_min(1.0) * mask.mean()


def _distance(target: torch.Tensor, pred_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-sample distance summed over classes: squared error or KL(target || pred)."""
    if kind == "mse":
        return (pred_log_probs.exp() - target).pow(2).sum(-1)
    # KL divergence; xlogy makes 0 * log 0 = 0 for one-hot targets.
    return (torch.xlogy(target, target) - target * pred_log_probs).sum(-1)


def consistency_loss(
    target: torch.Tensor,
    pred_log_probs: torch.Tensor,
    expert_idx: torch.Tensor,
    mode: str = "collaborative",
    kind: str = "mse",
) -> torch.Tensor:
    """L_cr (Eq. 2): expert target against the non-experts on the prediction view.

    Args:
        target: ``(B, C)`` target distribution (no gradient).
        pred_log_probs: ``(B, K, C)`` log-probabilities on the prediction view.
        expert_idx: ``(B,)`` index of each sample's own expert.
        mode: ``collaborative`` compares the *mean* of the K-1 non-experts with
            the target; ``individual`` averages each non-expert's own distance.
            With K=1 (single classifier) the one classifier is its own
            "non-expert" ensemble.
        kind: ``mse`` (paper) or ``kl``.
    Returns:
        Scalar: mean over samples of the per-sample distance.
    """
    num_experts = pred_log_probs.shape[1]
    if num_experts == 1:
        others = torch.ones_like(pred_log_probs[:, :, 0])
    else:
        others = _one_hot(expert_idx, num_experts, pred_log_probs.dtype, equal=False)
    if mode == "collaborative":
        ens_log_probs = log_mean_probs(pred_log_probs, others)
        return _distance(target, ens_log_probs, kind).mean()
    if mode == "individual":
        per_expert = _distance(target.unsqueeze(1), pred_log_probs, kind)  # (B, K)
        return ((per_expert * others).sum(1) / others.sum(1)).mean()
    raise ValueError(f"unknown consistency mode {mode!r}")


def dael_losses(
    logits_x_target_view: torch.Tensor,
    logits_x_pred_view: torch.Tensor,
    labels_x: torch.Tensor,
    expert_idx: torch.Tensor,
    hparams: DAELHparams,
    logits_u_target_view: Optional[torch.Tensor] = None,
    logits_u_pred_view: Optional[torch.Tensor] = None,
    class_mask: Optional[torch.Tensor] = None,
) -> Dict[str, torch.Tensor]:
    """The full objective L = L_ce + L_cr + weight_u * L_u (Eq. 4, Algorithm 1).

    Args:
        logits_x_target_view: ``(N, K, C)`` all experts on the labeled source
            images, target view (the weak view by default).
        logits_x_pred_view: ``(N, K, C)`` the same images, prediction view
            (strong by default).
        labels_x: ``(N,)`` class labels.
        expert_idx: ``(N,)`` each sample's own expert (its source domain).
        hparams: weights and design switches.
        logits_u_target_view / logits_u_pred_view: ``(M, K, C)`` on unlabeled
            target images; ``None`` for domain generalisation (no L_u).
        class_mask: ``(K, C)`` bool, which classes each source domain holds, under category
            shift (:mod:`.category_shift`); read by the parts ``hparams.class_masks`` turns on
            (masked experts, per-class ensemble, L_cr on shared classes, the pseudo-label among an
            expert's classes, the "not mine" term). ``None`` or no part (the paper) leaves every
            line below as it was.
    Returns:
        A dict of 0-dim tensors: ``loss`` (to back-propagate), ``loss_x``
        (L_ce), ``loss_cr``, ``loss_u``, ``acc_x`` (%, expert on its own
        domain) and ``mask_u`` (fraction of target samples kept); with L_u also
        ``pseudo_label_u`` and ``pseudo_mask_u`` ``(M,)``, for diagnostics.
    """
    n = labels_x.shape[0]
    parts = hparams.class_masks if class_mask is not None else ()
    if "experts" in parts:
        logits_x_target_view = mask_logits(logits_x_target_view, class_mask)
        logits_x_pred_view = mask_logits(logits_x_pred_view, class_mask)
        if logits_u_target_view is not None and logits_u_pred_view is not None:
            logits_u_target_view = mask_logits(logits_u_target_view, class_mask)
            logits_u_pred_view = mask_logits(logits_u_pred_view, class_mask)
    ensemble_mask = class_mask if "ensemble" in parts else None
    log_probs_t = F.log_softmax(logits_x_target_view, dim=-1)
    rows = torch.arange(n, device=labels_x.device)
    own_log_probs = log_probs_t[rows, expert_idx]  # (N, C): expert i on its own domain

    # Eq. 1: each expert on its own domain; averaged over samples then domains.
    loss_x = F.nll_loss(own_log_probs, labels_x)
    acc_x = (own_log_probs.argmax(-1) == labels_x).to(log_probs_t.dtype).mean() * 100.0
    zero = loss_x.new_zeros(())

    loss_cr = zero
    if hparams.use_cr:
        if hparams.cr_target == "expert":
            target = own_log_probs.detach().exp()
        else:
            target = _one_hot(labels_x, own_log_probs.shape[-1], own_log_probs.dtype)
        log_probs_p = F.log_softmax(logits_x_pred_view, dim=-1)
        if "cr" in parts:
            loss_cr = shared_consistency(target, log_probs_p, expert_idx, class_mask, hparams.cr_loss)
        else:
            loss_cr = consistency_loss(target, log_probs_p, expert_idx, hparams.cr_mode, hparams.cr_loss)

    loss_u = zero
    mask_u = zero
    labels_u = mask = None
    if hparams.use_u and logits_u_target_view is not None and logits_u_pred_view is not None:
        with torch.no_grad():
            probs_u = F.softmax(logits_u_target_view.detach(), dim=-1)
            # "agree" and "corroborate" read which experts know each class wherever the data says
            agreeing = hparams.pseudo_label in AGREEING
            labels_u, mask, _ = pseudo_labels(
                probs_u,
                hparams.conf_thre,
                hparams.pseudo_label,
                ensemble_mask,
                class_mask if "pseudo_label" in parts or agreeing else None,
            )
        log_probs_u = F.log_softmax(logits_u_pred_view, dim=-1)
        if ensemble_mask is None:
            ens_log_probs_u = log_mean_probs(log_probs_u, torch.ones_like(log_probs_u[:, :, 0]))
        else:
            ens_log_probs_u = class_ensemble(log_probs_u.exp(), ensemble_mask).clamp_min(tiny(log_probs_u.dtype)).log()
        ce_u = F.nll_loss(ens_log_probs_u, labels_u, reduction="none")
        if hparams.u_balance:  # each kept pseudo-class weighs alike (balanced_u_loss above)
            loss_u = balanced_u_loss(ce_u, labels_u, mask, ens_log_probs_u.shape[-1])
        else:  # Eq. 3: masked samples count as zero in the batch mean.
            loss_u = (ce_u * mask).mean()
        mask_u = mask.mean()

    loss = loss_x + loss_cr + hparams.weight_u * loss_u
    if "other" in parts:
        out_other = other_loss(log_probs_t, labels_x, class_mask)
        loss = loss + hparams.weight_other * out_other
    out = {
        "loss": loss,
        "loss_x": loss_x,
        "loss_cr": loss_cr,
        "loss_u": loss_u,
        "acc_x": acc_x,
        "mask_u": mask_u,
    }
    if "other" in parts:
        out["loss_other"] = out_other
    if labels_u is not None:  # for diagnostics only: (M,) pseudo-labels and their 0/1 mask
        out["pseudo_label_u"], out["pseudo_mask_u"] = labels_u, mask
    return out


def ensemble_probs(
    logits: torch.Tensor, class_mask: Optional[torch.Tensor] = None, parts: Sequence[str] = ALL_CLASS_MASK_PARTS
) -> torch.Tensor:
    """Test-time prediction: mean of all experts' probabilities, ``(B, K, C) -> (B, C)``. Under
    category shift (``class_mask``), ``parts`` of the design (``CLASS_MASKS``): ``experts`` masks
    each expert's classes, ``ensemble`` takes the per-class mean of the experts that know each class."""
    if class_mask is not None and "experts" in parts:
        logits = mask_logits(logits, class_mask)
    return class_ensemble(F.softmax(logits, dim=-1), class_mask if "ensemble" in parts else None)
