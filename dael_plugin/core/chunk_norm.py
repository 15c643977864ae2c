"""One backbone call over several domain chunks, each batch-normalised with its own statistics.

Dassl's reference DAEL calls the backbone once per source-domain chunk (and
once for the target batch), so in training every chunk is normalised with its
own batch statistics and the running statistics receive one update per chunk,
in chunk order. :func:`per_chunk_batch_norm` keeps exactly those semantics
inside ONE backbone call: every layer that is not a batch norm (convolutions,
linear layers, pooling, activations) runs once over the whole batch, and only
the batch-norm layers see the chunks. Two implementations:

``split`` (any ``_BatchNorm`` subclass, any chunk sizes)
    The layer's own forward runs once per chunk on a view of the input and
    the outputs are concatenated. It is *bitwise* the chunked calls'
    normalisation, and the running statistics get the same sequential
    updates (``momentum=None`` included). One copy per layer (the concat).
``grouped`` (plain ``BatchNorm1d/2d/3d``, equal chunks)
    The ``(K*n, C, ...)`` input is viewed as ``(n, K*C, ...)`` and the
    native kernel runs once, so each (chunk, channel) gets its own mean and
    variance; the running statistics are updated in closed form as K
    sequential updates would leave them:
    ``r_K = (1 - m)^K r_0 + sum_k m (1 - m)^(K-1-k) s_k``.
    One kernel launch per layer but two transposing copies.

``auto`` takes ``grouped`` on CUDA (where launches cost more than copies) when
it applies, and ``split`` elsewhere (on a 2-core CPU the split is 1.7x faster
than the grouped form for a 64-channel 32x32 layer: 70 ms against 122 ms
forward and backward at 7 chunks of 32).

Layers are converted in place the first time (their class gains a mixin; the
parameters, buffers, hooks and state-dict keys are unchanged). Outside the
context, or in evaluation mode (running statistics), a converted layer is the
original layer.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Optional, Sequence, Union

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm

PLAIN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
IMPLS = ("auto", "split", "grouped")


def unfusable_reason(module) -> Optional[str]:
    """Why ``module`` cannot take the fused pass at all, or None when it can."""
    if not isinstance(module, nn.Module):
        return f"the featurizer is a {type(module).__name__}, not an nn.Module"
    return None


def _grouped_ok(bn: _BatchNorm) -> bool:
    base = type(bn).__bases__[1] if isinstance(bn, _ChunkedMixin) else type(bn)
    return base in PLAIN and bn.momentum is not None


class _ChunkedMixin:
    """Batch statistics per chunk while ``_dael_chunks`` is set (see module docstring)."""

    _dael_chunks: Optional[List[int]] = None
    _dael_impl: str = "split"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sizes = self._dael_chunks
        uses_batch_stats = self.training or not self.track_running_stats
        if sizes is None or not uses_batch_stats:
            return super().forward(x)
        if isinstance(sizes, int):
            sizes = equal_chunks(x.shape[0], sizes)
        if len(sizes) == 1:
            return super().forward(x)
        if x.shape[0] != sum(sizes):
            raise ValueError(f"per-chunk batch norm: a batch of {x.shape[0]} is not chunks of {list(sizes)}")
        if self._dael_impl == "grouped" and len(set(sizes)) == 1 and _grouped_ok(self):
            return _grouped_forward(self, len(sizes), x)
        return torch.cat([super(_ChunkedMixin, self).forward(c) for c in x.split(list(sizes))])


_CLASSES: Dict[type, type] = {}


def _chunked_class(cls: type) -> type:
    if cls not in _CLASSES:
        name = f"Chunked{cls.__name__}"
        new = type(name, (_ChunkedMixin, cls), {"__module__": __name__, "__qualname__": name})
        _CLASSES[cls] = new
        globals().setdefault(name, new)  # so a pickled whole module finds its class
    return _CLASSES[cls]


for _cls in PLAIN:
    _chunked_class(_cls)


def convert(module: nn.Module) -> List[_BatchNorm]:
    """Give every batch-norm layer of ``module`` the per-chunk mode (idempotent); returns them."""
    bns = [m for m in module.modules() if isinstance(m, _BatchNorm)]
    for m in bns:
        if not isinstance(m, _ChunkedMixin):
            m.__class__ = _chunked_class(type(m))
    return bns


def _grouped_forward(bn: _BatchNorm, k: int, x: torch.Tensor) -> torch.Tensor:
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


def resolve_impl(impl: str, device: torch.device) -> str:
    if impl not in IMPLS:
        raise ValueError(f"per-chunk batch norm: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "grouped" if device.type == "cuda" else "split"
    return impl


@contextlib.contextmanager
def per_chunk_batch_norm(
    module: nn.Module, chunks: Union[int, Sequence[int]], impl: str = "auto", device: Optional[torch.device] = None,
    layers: Optional[List[_BatchNorm]] = None,
) -> Iterator[None]:
    """Within this block, ``module(x)`` normalises each chunk of ``x`` (a count
    of equal chunks, or their sizes) with its own statistics, as separate calls would.
    ``layers``: the module's converted layers (from :func:`convert`), to skip the
    module walk on every call."""
    reason = unfusable_reason(module)
    if reason is not None:
        raise ValueError(f"per-chunk batch norm cannot fuse this module: {reason}")
    bns = layers if layers is not None else convert(module)
    if device is None:
        p = next(module.parameters(), None)
        device = p.device if p is not None else torch.device("cpu")
    mode = resolve_impl(impl, device)
    for m in bns:
        m._dael_impl = mode
        m._dael_chunks = chunks
    try:
        yield
    finally:
        for m in bns:
            m._dael_chunks = None


def equal_chunks(n: int, k: int) -> List[int]:
    if n % k:
        raise ValueError(f"per-chunk batch norm: a batch of {n} does not split into {k} equal chunks")
    return [n // k] * k

