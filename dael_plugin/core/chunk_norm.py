"""One backbone call over K equal chunks, each batch-normalised with its own statistics.

Dassl's reference DAEL calls the backbone once per source-domain chunk, so in
training every chunk is normalised with its own batch statistics and the
running statistics receive K updates in chunk order. :func:`per_chunk_batch_norm`
keeps exactly those semantics inside ONE backbone call: while it is active,
each ``nn.BatchNorm{1,2,3}d`` of the module views its ``(K*n, C, ...)`` input as
``(n, K*C, ...)`` and runs the native batch-norm kernel once, so each
(chunk, channel) pair gets its own mean and variance, and the running
statistics are updated in closed form as K sequential updates would leave them:

    r_K = (1 - m)^K r_0 + sum_k m (1 - m)^(K-1-k) s_k

Features match the chunked calls exactly in fp32 on CPU, running statistics
and gradients to float rounding (tested). Evaluation mode, which uses the
running statistics, is unchanged.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm

SUPPORTED = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def unfusable_reason(module: nn.Module) -> Optional[str]:
    """Why ``module`` cannot take the fused pass, or None when it can."""
    for name, m in module.named_modules():
        if isinstance(m, _BatchNorm):
            if type(m) not in SUPPORTED:
                return f"{name or 'the backbone'} is a {type(m).__name__}, not a plain BatchNorm1d/2d/3d"
            if m.momentum is None:
                return f"{name} uses a cumulative moving average (momentum=None)"
    return None


def _grouped_forward(bn: _BatchNorm, k: int, x: torch.Tensor) -> torch.Tensor:
    uses_batch_stats = bn.training or not bn.track_running_stats
    if not uses_batch_stats:
        return type(bn).forward(bn, x)
    if x.shape[0] % k:
        raise ValueError(f"per-chunk batch norm: a batch of {x.shape[0]} does not split into {k} equal chunks")
    n, c, rest = x.shape[0] // k, x.shape[1], x.shape[2:]
    # (K*n, C, ...) -> (n, K*C, ...): channel k*C + c holds chunk k's channel c.
    xs = x.reshape(k, n, c, *rest).transpose(0, 1).reshape(n, k * c, *rest)
    track = bn.training and bn.track_running_stats
    # With momentum 1 the kernel writes each (chunk, channel)'s batch mean and
    # unbiased variance into these buffers: the statistics, with no extra pass.
    stat_mean = torch.zeros(k * c, dtype=bn.running_mean.dtype, device=x.device) if track else None
    stat_var = torch.ones(k * c, dtype=bn.running_var.dtype, device=x.device) if track else None
    weight = bn.weight.repeat(k) if bn.affine else None
    bias = bn.bias.repeat(k) if bn.affine else None
    y = F.batch_norm(xs, stat_mean, stat_var, weight, bias, True, 1.0, bn.eps)
    if track:
        with torch.no_grad():
            decay = 1.0 - bn.momentum
            powers = torch.arange(k - 1, -1, -1, dtype=stat_mean.dtype, device=x.device)
            coef = (bn.momentum * decay ** powers).unsqueeze(1)  # (K, 1)
            bn.running_mean.mul_(decay ** k).add_((coef * stat_mean.view(k, c)).sum(0))
            bn.running_var.mul_(decay ** k).add_((coef * stat_var.view(k, c)).sum(0))
            bn.num_batches_tracked.add_(k)
    return y.reshape(n, k, c, *rest).transpose(0, 1).reshape(x.shape)


@contextlib.contextmanager
def per_chunk_batch_norm(module: nn.Module, num_chunks: int) -> Iterator[None]:
    """Within this block, ``module(x)`` on K equal chunks normalises each chunk
    with its own statistics, as K separate calls would."""
    reason = unfusable_reason(module)
    if reason is not None:
        raise ValueError(f"per-chunk batch norm cannot fuse this module: {reason}")
    bns = [m for m in module.modules() if isinstance(m, _BatchNorm)]
    for m in bns:
        m.forward = _bound(m, num_chunks)  # an instance attribute shadows the class's forward
    try:
        yield
    finally:
        for m in bns:
            del m.forward


def _bound(bn: _BatchNorm, k: int):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return _grouped_forward(bn, k, x)

    return forward
