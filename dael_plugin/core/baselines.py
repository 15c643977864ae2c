"""The losses of Dassl's DA baselines, as plain PyTorch on tensors (no loop over domains).

Each follows Dassl's trainer of the same name (``dassl/engine/da/``), quirks included, and says
which; the built-in engine's trainers (``methods/m3sda.py``, ``methods/mme.py``) call them, and
``tests/test_baselines.py`` holds each to hand-worked numbers and, with Dassl, to Dassl's own.
"""

from __future__ import annotations

import contextlib
import math
from typing import Sequence

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
    def forward(ctx, x, scale: float):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -ctx.scale * grad, None  # Dassl's ``-grad_scaling * grad_output``


def reverse_grad(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The identity forward, the gradient times ``-scale`` backward (Dassl's ``ReverseGrad``;
    ``scale`` is a host number, so the step needs no sync)."""
    if scale < 0:
        raise ValueError(f"reverse_grad's scale must be non-negative, got {scale}")
    return _ReverseGrad.apply(x, float(scale))


def dann_lambda(progress: float) -> float:
    """DANN's reversal weight (Ganin & Lempitsky, 2015; Dassl's ``DANN``): 2 / (1 + exp(-10 p)) - 1,
    where p is the fraction of the whole run's steps done (0 at the first step, not per epoch)."""
    return 2.0 / (1.0 + math.exp(-10.0 * progress)) - 1.0


def sigmoid_rampup(step: int, length: int) -> float:
    """Dassl's ``sigmoid_rampup``: exp(-5 (1 - t)^2), with t = min(step, length) / length."""
    if length <= 0:
        raise ValueError(f"the ramp-up length must be positive, got {length}")
    phase = 1.0 - min(max(float(step), 0.0), float(length)) / length
    return math.exp(-5.0 * phase * phase)


def linear_rampup(step: int, length: int) -> float:
    """Dassl's ``linear_rampup`` (MixMatch's): step / length, clipped to [0, 1]."""
    if length <= 0:
        raise ValueError(f"the ramp-up length must be positive, got {length}")
    return min(max(step / length, 0.0), 1.0)


def ema_rate(step: int, alpha: float) -> float:
    """Self-ensembling's EMA rate at global step ``step`` (0-based; Dassl's ``SE``):
    min(1 - 1/(step + 1), alpha), so the teacher copies the student at the first step."""
    return min(1.0 - 1.0 / (step + 1), alpha)


@torch.no_grad()
def ema_update(teacher: Sequence[torch.Tensor], student: Sequence[torch.Tensor], alpha: float) -> None:
    """``t = alpha t + (1 - alpha) s`` for each parameter pair (Dassl's ``ema_model_update``:
    parameters only, not batch-norm buffers), as two fused multi-tensor operations."""
    torch._foreach_mul_(list(teacher), alpha)
    torch._foreach_add_(list(teacher), list(student), alpha=1.0 - alpha)


def se_consistency(prob_u: torch.Tensor, teacher_prob_u: torch.Tensor, conf_thre: float, weight: float) -> torch.Tensor:
    """Self-ensembling's target loss (French et al., 2018; Dassl's ``SE``): the squared difference
    of the student's and the teacher's class probabilities, summed over classes. With
    ``conf_thre`` > 0, the mean over the batch with the images whose teacher confidence is
    *above* (strictly) the threshold kept and the others counted as zeros; with 0, the plain
    mean times ``weight`` (the sigmoid ramp-up)."""
    loss = ((prob_u - teacher_prob_u) ** 2).sum(1)
    if conf_thre:
        keep = (teacher_prob_u.max(1)[0] > conf_thre).float()
        return (loss * keep).mean()
    return loss.mean() * weight


def domain_critic(fdim: int, hidden: Sequence[int]) -> nn.Sequential:
    """DANN's and ADDA's domain critic as Dassl builds it: its ``mlp`` head (per hidden layer a
    linear layer, 1-d batch norm and an in-place leaky ReLU) then a linear layer to one logit.
    Dassl's DANN uses hidden ``[fdim, fdim]``, its ADDA ``[fdim, fdim // 2]``."""
    layers: list = []
    width = fdim
    for h in hidden:
        layers += [nn.Linear(width, h), nn.BatchNorm1d(h), nn.LeakyReLU(inplace=True)]
        width = h
    return nn.Sequential(_MLP(layers), nn.Linear(width, 1))


class _MLP(nn.Module):
    """Dassl's ``MLP`` head's layout, so that the keys read ``0.mlp.0.weight``, ... as in Dassl."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


def reset_batch_norm_stats(module: nn.Module) -> int:
    """AdaBN's start (Dassl's ``AdaBN.before_epoch``): every batch-norm layer's running mean,
    variance and batch count back to their initial values; returns how many layers."""
    n = 0
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._NormBase):
            m.reset_running_stats()
            n += 1
    return n


def mme_entropy_loss(logits_u: torch.Tensor) -> torch.Tensor:
    """MME's target loss (Saito et al., 2019; Dassl's ``MME``): the negative mean entropy of the
    target predictions, with Dassl's ``+ 1e-5`` inside the log. Minimised through a reversed
    gradient, it raises the entropy for the classifier and lowers it for the feature extractor."""
    p = F.softmax(logits_u, 1)
    return -(-p * torch.log(p + 1e-5)).sum(1).mean()


def cdac_lr_factor(step: int, max_steps: int) -> float:
    """CDAC's learning-rate factor at step ``step`` of ``max_steps`` (Dassl's ``custom_scheduler``,
    Ganin & Lempitsky's annealing with alpha 10, beta 0.75): (1 + 10 step / max_steps) ** -0.75,
    which multiplies each optimiser's starting rate (a ``LambdaLR``)."""
    return (1.0 + float(step / max_steps) * 10.0) ** -0.75


def rank_similarity(feat: torch.Tensor, topk: int) -> torch.Tensor:
    """CDAC's pairwise similarity (Li et al., 2021, Eq. 3; Dassl's ``get_similarity_matrix``):
    ``s[i, j]`` is 1 where images i and j have the same ``topk`` largest feature dimensions (as a
    set, ties ordered as ``argsort`` orders them), else 0; float32 ``(B, B)``, no gradient. One
    comparison of every pair at once where Dassl loops over the rows."""
    ids = torch.argsort(feat.detach(), dim=1, descending=True)[:, :topk].sort(dim=1)[0]
    return (ids.unsqueeze(1) == ids.unsqueeze(0)).all(-1).float()


def aac_loss(sim: torch.Tensor, logit_u: torch.Tensor, logit_us: torch.Tensor) -> torch.Tensor:
    """CDAC's adversarial adaptive clustering loss (Eq. 3; Dassl's ``AAC``) from two views'
    logits: the binary cross-entropy between ``sim`` and the pairwise inner products of their
    class probabilities, ``P = softmax(logit_u) softmax(logit_us)^T``, with Dassl's ``+ 1e-7``
    inside both logs, averaged over the B x B pairs.

    Softmax, product and logs run in float32 under autocast too, as PyTorch's autocast keeps its
    binary cross-entropy: a bfloat16 P of 0.998 or more rounds to 1, where log(1 - P + 1e-7) is
    -16.1 whatever P was; and bfloat16 probabilities, whose sum can round above 1, made P exceed 1
    and the log NaN (a compiled bf16 step, measured). P is clamped at 1, which changes nothing
    where Dassl's loss is finite (a float32 P above 1 by a rounding makes its log NaN)."""
    dev = logit_u.device.type
    off = torch.autocast(dev, enabled=False) if dev in ("cpu", "cuda") else contextlib.nullcontext()
    with off:
        p = (F.softmax(logit_u.float(), 1) @ F.softmax(logit_us.float(), 1).t()).clamp(max=1.0)
        return -(sim * torch.log(p + 1e-7) + (1.0 - sim) * torch.log(1.0 - p + 1e-7)).mean()


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
