"""Unsupervised validators for domain adaptation: scores of a checkpoint that read no target label.

Each takes tensors (the ensemble's probabilities on the target's unlabeled train split, features of
the backbone, the experts' probabilities) and returns a score where **higher is better**, as in
Musgrave et al., "Three New Validators and a Large-Scale Benchmark Ranking for Unsupervised Domain
Adaptation" (2022), whose definitions (and pytorch-adapt's implementations) these follow. The
tensor validators stay on the device and return 0-d tensors (one host read per evaluation, at its
end); ClassAMI runs k-means in scikit-learn on the CPU, on a capped subsample.

``probs`` are ``(N, C)`` probabilities (the ensemble's: the mean of the experts', DAEL's prediction);
``expert_probs`` ``(N, K, C)``. Entropies use natural logarithms.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

# The validators' names, as in epochs.jsonl and collect.py --select; and the protocols with a
# per-epoch score (source-validation accuracy, the oracle's target validation accuracy, each
# validator, the accuracy on a dataset's own val split of other images: WILDS's out-of-distribution val).
NAMES = ("entropy", "im", "bnm", "snd", "classami", "dev", "devn", "agreement", "mask_rate")
SCORED_PROTOCOLS = ("source_val", "oracle") + NAMES + ("val",)

# Where a probability is 0, p log p is 0: the clamp keeps log finite without moving any other term.
_TINY = 1e-30


def _entropy_rows(p: torch.Tensor) -> torch.Tensor:
    p = p.float()
    return -(p * p.clamp_min(_TINY).log()).sum(-1)


def entropy_score(probs: torch.Tensor) -> torch.Tensor:
    """Entropy validator: ``-mean_i H(p_i)``, with ``H(p) = -sum_c p_c log p_c``. Confident target
    predictions score high (Grandvalet and Bengio 2004; Musgrave et al. Sec. 3)."""
    return -_entropy_rows(probs).mean()


def im_score(probs: torch.Tensor) -> torch.Tensor:
    """Information maximisation (IM): ``H(mean_i p_i) - mean_i H(p_i)``: confident per sample and
    diverse over the set (Shi and Sha 2012; Liang et al., SHOT, 2020; pytorch-adapt's IMValidator is
    the sum of its entropy and diversity validators)."""
    return _entropy_rows(probs.float().mean(0)) + entropy_score(probs)


def bnm_score(probs: torch.Tensor) -> torch.Tensor:
    """Batch nuclear-norm maximisation (BNM): ``||P||_* / N``, the sum of the singular values of the
    ``(N, C)`` prediction matrix over N (Cui et al., CVPR 2020, Eq. 9). High where predictions are
    both confident and spread over the classes."""
    p = probs.float()
    return torch.linalg.svdvals(p).sum() / p.shape[0]


def snd_score(probs: torch.Tensor, tau: float = 0.05, block: int = 1024) -> torch.Tensor:
    """Soft neighbourhood density (SND): for each sample, the softmax over the other samples of its
    cosine similarities divided by ``tau``; the score is the mean entropy of those distributions
    (Saito et al., ICCV 2021, Eq. 2-3; ``tau = 0.05`` there). Computed in row blocks of ``block``, so
    memory is ``block x N``. Features are the predictions, as in the paper's default."""
    z = torch.nn.functional.normalize(probs.float(), dim=1)
    n = z.shape[0]
    total = z.new_zeros(())
    for start in range(0, n, block):  # blocks of rows, not samples: memory, not a per-sample loop
        sim = z[start : start + block] @ z.T / tau
        rows = torch.arange(start, min(start + block, n), device=z.device)
        sim[rows - start, rows] = float("-inf")  # a sample is not its own neighbour
        total = total + _entropy_rows(torch.softmax(sim, dim=1)).sum()
    return total / n


def expert_agreement(expert_probs: torch.Tensor) -> torch.Tensor:
    """DAEL's own signal: the share of experts whose class is the ensemble's, averaged over the
    target samples (1 where every expert agrees). The experts are trained to agree on the target
    (L_cr, L_u), so it rises as the ensemble settles; it reads no label."""
    ens = expert_probs.float().mean(1).argmax(-1, keepdim=True)
    return (expert_probs.argmax(-1) == ens).float().mean()


def mask_rate(expert_probs: torch.Tensor, conf_thre: float = 0.95) -> torch.Tensor:
    """The share of target samples that L_u would train on: the most confident expert's top
    probability is at least ``conf_thre`` (the paper's Eq. for L_u, Algorithm 1)."""
    return (expert_probs.float().amax(dim=(1, 2)) >= conf_thre).float().mean()


# -- DEV: importance-weighted source validation risk (You et al., ICML 2019) ---------------------
def dev_risk(weights: torch.Tensor, errors: torch.Tensor, normalize: bool = False) -> torch.Tensor:
    """The control-variate estimate of the target risk from source-validation ``errors`` and their
    density ratios ``weights`` (You et al. 2019, Alg. 1): with ``we = w * e``,
    ``mean(we) + eta * mean(w) - eta``, ``eta = -cov(we, w) / var(w)`` (unbiased covariance and variance).
    ``normalize`` (DEVN, Musgrave et al.): the weights divided by their maximum and shifted to mean
    one first, which tames a few huge ratios."""
    w, e = weights.double().flatten(), errors.double().flatten()
    if normalize:
        w = w / w.max()
        w = w - (w.mean() - 1)
    we = w * e
    n = w.numel()
    var_w = w.var(correction=1)
    cov = ((we - we.mean()) * (w - w.mean())).sum() / (n - 1)
    eta = torch.where(var_w > 0, -cov / var_w.clamp_min(1e-300), torch.zeros_like(var_w))
    return we.mean() + eta * w.mean() - eta


def density_ratios(
    source_train: torch.Tensor,
    target: torch.Tensor,
    source_val: torch.Tensor,
    l2: float = 1e-3,
    steps: int = 100,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``p_target(x) / p_source(x)`` at each source-validation feature, from a logistic-regression
    domain classifier fitted on source-train against target features (L-BFGS on their device, L2
    penalty ``l2``; features standardised with the training set's statistics):
    ``w = (N_s / N_t) * P(target | x) / P(source | x)``. Returns the weights and the classifier's
    accuracy on its own training set (near 0.5: the domains look alike to it)."""
    x = torch.cat([source_train, target]).float()
    y = torch.cat([source_train.new_zeros(len(source_train)), target.new_ones(len(target))]).float()
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    x = (x - mean) / std
    w = torch.zeros(x.shape[1], device=x.device, requires_grad=True)
    b = torch.zeros((), device=x.device, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y) + l2 * w.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        acc = ((x @ w + b > 0).float() == y).float().mean()
        logit = ((source_val.float() - mean) / std) @ w + b  # log P(t|x) - log P(s|x)
        ratio = logit.exp() * (len(source_train) / max(len(target), 1))
    return ratio, acc


def dev_score(
    source_train_feats: torch.Tensor,
    target_feats: torch.Tensor,
    source_val_feats: torch.Tensor,
    source_val_losses: torch.Tensor,
    normalize: bool = False,
    weights: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """DEV (``normalize=False``) or DEVN: minus the weighted source-validation risk (higher is
    better), the per-sample losses being the ensemble's cross-entropy ``-log p_y``. ``weights``:
    :func:`density_ratios` already computed (DEV and DEVN share them)."""
    if weights is None:
        weights, _ = density_ratios(source_train_feats, target_feats, source_val_feats)
    return -dev_risk(weights, source_val_losses, normalize).float()


# -- ClassAMI (Musgrave et al. 2022, Sec. 4) -----------------------------------------------------
def class_ami(
    feats: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    seed: int = 0,
    source_feats: Optional[torch.Tensor] = None,
    source_labels: Optional[torch.Tensor] = None,
) -> float:
    """ClassAMI: k-means (k = the number of classes) on the L2-normalised features, scored by the
    adjusted mutual information between the clusters and the class labels: the target's predicted
    labels, and the source's true labels where ``source_feats`` are given (the paper's form, source
    and target together). 1 where the clusters are the classes; about 0 for chance. scikit-learn's
    k-means (k-means++ seeding, one run, ``seed``: scikit-learn's ``n_init="auto"``, as pytorch-adapt
    runs it) on the CPU: cap the samples before calling."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_mutual_info_score

    x, y = feats.float(), labels
    if source_feats is not None:
        x, y = torch.cat([x, source_feats.float()]), torch.cat([y, source_labels])
    x = torch.nn.functional.normalize(x, dim=1).cpu().double().numpy()
    k = min(int(num_classes), len(x))
    clusters = KMeans(n_clusters=k, n_init=1, random_state=seed).fit_predict(x)
    return float(adjusted_mutual_info_score(y.cpu().numpy(), clusters))
