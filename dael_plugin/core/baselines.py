"""The losses of Dassl's DA baselines, as plain PyTorch on tensors (no loop over domains).

Each follows Dassl's trainer of the same name (``dassl/engine/da/``), quirks included, and says
which; the built-in engine's trainers (``builtin/m3sda.py``, ``builtin/mme.py``) call them, and
``tests/test_baselines.py`` holds each to hand-worked numbers and, with Dassl, to Dassl's own.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def moment_distance(feat_x: torch.Tensor, feat_u: torch.Tensor) -> torch.Tensor:
    """M3SDA's moment distance (Peng et al., 2019, as Dassl's ``M3SDA.moment_distance``): the
    mean, over every pair among the K source domains and the target, of the Euclidean distance
    between their feature means, and the same for their variances; the two averaged.

    ``feat_x``: ``(K, n, D)``, each domain's features; ``feat_u``: ``(m, D)``. Dassl's quirks, kept:
    the variance is the unbiased one (``Tensor.var``), the norm is not squared, and the pairs are
    the K source-target pairs and the K(K-1)/2 source-source pairs, weighted alike (every pair of
    the K+1 domains)."""
    means = torch.cat([feat_x.mean(1), feat_u.mean(0, keepdim=True)])  # (K+1, D)
    var = torch.cat([feat_x.var(1), feat_u.var(0, keepdim=True)])
    i, j = torch.triu_indices(len(means), len(means), offset=1, device=means.device)

    def pairwise(m: torch.Tensor) -> torch.Tensor:
        return ((m[i] - m[j]) ** 2).sum(1).sqrt().mean()

    return (pairwise(means) + pairwise(var)) / 2


def discrepancy(p1: torch.Tensor, p2: torch.Tensor) -> torch.Tensor:
    """MCD's classifier discrepancy (Saito et al., 2018, Dassl's ``discrepancy``): the mean
    absolute difference of two classifiers' probabilities, over samples and classes."""
    return (p1 - p2).abs().mean()


class _ReverseGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -grad


def reverse_grad(x: torch.Tensor) -> torch.Tensor:
    """The identity forward, the gradient negated backward (Dassl's ``ReverseGrad``, weight 1)."""
    return _ReverseGrad.apply(x)


def mme_entropy_loss(logits_u: torch.Tensor) -> torch.Tensor:
    """MME's target loss (Saito et al., 2019; Dassl's ``MME``): the negative mean entropy of the
    target predictions, with Dassl's ``+ 1e-5`` inside the log. Minimised through a reversed
    gradient, it raises the entropy for the classifier and lowers it for the feature extractor."""
    p = F.softmax(logits_u, 1)
    return -(-p * torch.log(p + 1e-5)).sum(1).mean()


class Prototypes(nn.Module):
    """MME's classifier: cosine similarity to class prototypes over a temperature (Dassl's
    ``Prototypes``: a bias-free linear layer on L2-normalised features, divided by 0.05)."""

    def __init__(self, fdim: int, num_classes: int, temp: float = 0.05) -> None:
        super().__init__()
        self.prototypes = nn.Linear(fdim, num_classes, bias=False)
        self.temp = temp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.prototypes(F.normalize(x, p=2, dim=1)) / self.temp


class PairHeads(nn.Module):
    """M3SDA's classifiers: for each of K source domains a pair of linear classifiers (Dassl's
    ``PairClassifiers``, ``c1`` and ``c2``), held as ``(K, C, D)`` weights so that all of them run
    as one batched product. Initialised as Dassl builds them: ``nn.Linear``'s scheme, domain by
    domain, ``c1`` then ``c2``."""

    def __init__(self, fdim: int, num_classes: int, num_domains: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_domains, num_classes, fdim))
        self.b1 = nn.Parameter(torch.empty(num_domains, num_classes))
        self.w2 = nn.Parameter(torch.empty(num_domains, num_classes, fdim))
        self.b2 = nn.Parameter(torch.empty(num_domains, num_classes))
        bound = 1 / math.sqrt(fdim)
        with torch.no_grad():
            for k in range(num_domains):  # the RNG's order of K x 2 nn.Linear layers (init only)
                for w, b in ((self.w1, self.b1), (self.w2, self.b2)):
                    nn.init.kaiming_uniform_(w[k], a=math.sqrt(5))
                    nn.init.uniform_(b[k], -bound, bound)

    def per_chunk(self, feats: torch.Tensor, domains: torch.Tensor):
        """``feats`` ``(n, p, D)``: chunk i's features, classified by domain ``domains[i]``'s pair;
        returns both classifiers' logits, ``(n, p, C)`` each."""
        z1 = torch.einsum("npd,ncd->npc", feats, self.w1[domains]) + self.b1[domains][:, None]
        z2 = torch.einsum("npd,ncd->npc", feats, self.w2[domains]) + self.b2[domains][:, None]
        return z1, z2

    def each_domain(self, feats: torch.Tensor, domains: torch.Tensor):
        """``feats`` ``(m, D)`` classified by each domain in ``domains``: ``(n, m, C)`` each."""
        z1 = torch.einsum("md,ncd->nmc", feats, self.w1[domains]) + self.b1[domains][:, None]
        z2 = torch.einsum("md,ncd->nmc", feats, self.w2[domains]) + self.b2[domains][:, None]
        return z1, z2
