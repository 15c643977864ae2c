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
    updates (``momentum=None`` included). Per layer and chunk: one
    normalisation kernel and one counter update forward, one backward kernel
    and two gradient accumulations; plus one concatenation.
``grouped`` (plain ``BatchNorm1d/2d/3d`` and timm's ``BatchNormAct2d``)
    The batch is viewed, without a copy, as ``(K, n, C, ...)`` for each run of
    equal-sized chunks (the usual fused batch is one run; a target batch of
    another size makes a second). One ``var_mean`` over that view gives every
    (chunk, channel) mean and variance, and one ``addcmul`` normalises, so the
    output keeps the input's memory format (``channels_last`` stays
    ``channels_last``). The backward pass is written out (two reductions and
    two element-wise passes), not left to autograd. The running statistics
    get, in closed form, what K sequential updates leave:
    ``r_K = (1 - m)^K r_0 + sum_k m (1 - m)^(K-1-k) s_k`` (one ``addmm_`` per
    buffer), or the cumulative average for ``momentum=None``. Under bf16/fp16
    autocast the statistics are computed in fp32, as the native kernels do.

Why ``auto`` takes ``grouped`` on CUDA and ``split`` on CPU:

- On a GPU a DAEL step is launch-bound at these shapes, so it is decided by
  counting (``scripts/bench.py --launches``, miniDomainNet shape: ResNet-18,
  3 domains x 64 + 64 target, a fused pass of 7 chunks): the whole training
  step takes 0.41x of Dassl's DAEL's operator launches with ``grouped``
  against 0.54x with ``split``, and ``grouped`` copies 13 MiB per step
  against ``split``'s 185 MiB (each layer's output concatenated, forward and
  backward). ``grouped`` also keeps ``channels_last``, which cuDNN's
  convolutions want. An earlier ``grouped`` form transposed the batch into an
  ``(n, K*C, ...)`` layout for the native kernel; it needed two copies per
  layer each way and gave 16 of ResNet-18's 20 convolutions default-layout
  input, which cuDNN converts back with one more copy each.
- On a CPU the native kernels are much faster than ``var_mean`` and
  broadcast element-wise passes over these views (one 224 x 64 x 32 x 32
  channels_last layer, forward and backward, 2 cores: ``split`` 62 ms,
  ``grouped`` 148 ms; the Digit-5 step 832 ms against 988 ms), so ``split``.

:func:`convert` puts a per-chunk module in place of each batch-norm layer, in its parent and
under its name, sharing the layer's parameters, buffers and hooks (the state-dict keys are
unchanged, so checkpoints from before load as they did). The layer objects themselves are left
alone: no class or attribute is set on them. The per-call state (the chunk sizes, the pending
counter increments) and the synchronisation group live in the per-chunk modules; outside a
fused call, or in evaluation mode (running statistics), a per-chunk module is the original layer.

Long because it holds the two implementations of one semantics (split and grouped) and the switch
between them, tested against each other and against Dassl's per-chunk calls; the forward, backward
and running-statistics code of the grouped one belong together.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

PLAIN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
IMPLS = ("auto", "split", "grouped")
Runs = Tuple[Tuple[int, int], ...]  # (number of chunks, chunk size) for each run of equal chunks


# Layers other than the batch norms converted here that compute over the samples of one call, by class
# name (core imports neither Dassl nor timm): Dassl's MixStyle and EFDMix (its ``*_ms_l*`` and
# ``*_efdmix_l*`` ResNets; ``dassl.modeling.ops``), which also draw in Python whether they act, and
# timm's batch-variance EvoNorms
PYTHON_DRAWERS = ("MixStyle", "EFDMix")
BATCH_MIXERS = PYTHON_DRAWERS + ("EvoNorm2dB0", "EvoNorm2dB1", "EvoNorm2dB2")


def layer_named(module: nn.Module, names: Sequence[str]) -> Optional[str]:
    """The class name of the first layer of ``module`` whose class is named in ``names``, or None."""
    return next((type(m).__name__ for m in module.modules() if type(m).__name__ in names), None)


def unfusable_reason(module) -> Optional[str]:
    """Why ``module`` cannot take the fused pass at all, or None when it can.

    The fused pass changes only how batch-norm layers see the batch, so any
    ``nn.Module`` takes it whose other layers treat each sample alone; a plain
    function or a scripted module does not (its layers cannot be converted), nor
    one with a layer that mixes the samples of a call (MixStyle: one call over
    every chunk would mix the domains that per-chunk calls keep apart, and draw
    its random numbers once instead of once a chunk).
    """
    if not isinstance(module, nn.Module):
        return f"the featurizer is a {type(module).__name__}, not an nn.Module"
    if isinstance(module, torch.jit.ScriptModule):
        return "the featurizer is a TorchScript module, whose layers cannot be converted"
    mixer = layer_named(module, BATCH_MIXERS)
    if mixer is not None:
        return (
            f"its {mixer} layer mixes the samples of one call, so one call over every chunk would "
            "mix the domains that per-chunk calls keep apart"
        )
    return None


def _base_class(bn: _BatchNorm) -> type:
    return type(bn).__bases__[1] if isinstance(bn, _ChunkedMixin) else type(bn)


def _is_norm_act(cls: type) -> bool:
    """timm's ``BatchNormAct2d``: ``F.batch_norm`` then ``self.drop`` then ``self.act``."""
    return cls.__name__ == "BatchNormAct2d" and cls.__module__.startswith("timm.")


def grouped_reason(bn: _BatchNorm) -> Optional[str]:
    """Why the ``grouped`` form cannot normalise ``bn`` itself (it then takes ``split``)."""
    cls = _base_class(bn)
    if cls not in PLAIN and not _is_norm_act(cls):
        return f"{cls.__name__} is not a plain BatchNorm1d/2d/3d"
    return None


def runs_of(sizes: Sequence[int]) -> Runs:
    """Chunk sizes as runs of equal sizes: [64]*6 + [32] -> ((6, 64), (1, 32))."""
    runs: List[List[int]] = []
    for s in sizes:
        if runs and runs[-1][1] == s:
            runs[-1][0] += 1
        else:
            runs.append([1, int(s)])
    return tuple((k, n) for k, n in runs)


def _run_views(x: torch.Tensor, runs: Runs) -> List[torch.Tensor]:
    """Each run of ``x`` as a ``(k, n, C, ...)`` view (splitting dim 0 copies only an expanded tensor)."""
    out, start = [], 0
    for k, n in runs:
        out.append(x.narrow(0, start, k * n).reshape(k, n, *x.shape[1:]))
        start += k * n
    return out


def _reduce_dims(xv: torch.Tensor) -> Tuple[int, ...]:
    return (1,) + tuple(range(3, xv.dim()))


class _GroupedBatchNorm(torch.autograd.Function):
    """Batch norm with statistics per (chunk, channel) over ``(k, n, C, ...)`` views.

    Returns the normalised batch and, per chunk, the mean and the biased variance ``(sum k, C)``
    in fp32 (for the running statistics).

    Precision, as the native kernels keep it: statistics, products and reductions in fp32 under
    bf16/fp16 (a low-precision input is widened exactly inside each kernel, never multiplied in
    its own precision), and the backward pass in the centred form, ``sum g * (x - mean)``, not
    ``E[g x] - mean E[g]``, which cancels once ``mean / std`` is large.

    Synchronised (``group`` given, ``world`` processes, each holding an equal shard of every
    chunk): forward, every process's per-chunk mean and variance are gathered in ONE collective for
    all chunks of the layer and combined in the centred form (Chan's: the mean of the variances
    plus the variance of the means); backward, the per-chunk means of ``g`` and ``g * (x - mean)``
    are averaged in one all-reduce. The parameters' gradients stay this shard's (DDP averages them).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, runs: Runs, eps: float, group=None, world: int = 1):
        low = x.dtype in (torch.float16, torch.bfloat16)
        c = x.shape[1]
        shape = [1, 1, c] + [1] * (x.dim() - 2)
        w = weight.view(shape) if weight is not None else None
        b = bias.view(shape) if bias is not None else None
        views = _run_views(x, runs)
        stats = [
            torch.var_mean(xv.float() if low else xv, dim=_reduce_dims(xv), correction=0, keepdim=True) for xv in views
        ]
        if group is not None:
            stats = _combine_over_processes(stats, runs, c, group, world)
        # Eager: x's memory format, each run written into its view of y. Compiled: each run's output
        # made out of place and concatenated (inductor fuses it): dynamo refuses an out= into a chunk's
        # view of a channels_last y, and a copy_ into a traced reshape of y can be a copy's, not y's
        # (two processes' weights then parted: the compiled DDP test).
        compiling = torch.compiler.is_compiling()
        y = None if compiling else torch.empty_like(x)
        y_runs = [None] * len(views) if compiling else _run_views(y, runs)
        outs, means, vars_, saved = [], [], [], []
        for xv, yv, (var, mean) in zip(views, y_runs, stats):
            rstd = torch.rsqrt(var + eps)
            scale = rstd * w if w is not None else rstd
            shift = torch.addcmul(b, mean, scale, value=-1) if b is not None else -(mean * scale)
            if compiling:  # low precision: in fp32, rounded once, as below
                outs.append(torch.addcmul(shift, xv, scale).to(x.dtype).reshape(-1, *x.shape[1:]))
            elif low:  # in fp32, rounded once (y's terms can cancel)
                yv.copy_(torch.addcmul(shift, xv, scale))
            else:
                torch.addcmul(shift, xv, scale, out=yv)
            means.append(mean.view(-1, c))
            vars_.append(var.view(-1, c))
            saved += [mean, rstd, scale]
        ctx.save_for_backward(x, weight, *saved)
        ctx.runs, ctx.group, ctx.world = runs, group, world
        if compiling:
            y = torch.cat(outs)  # a new tensor even for one run: a returned view could not be modified in place
        mean, var = (means[0], vars_[0]) if len(means) == 1 else (torch.cat(means), torch.cat(vars_))
        ctx.mark_non_differentiable(mean, var)
        ctx.set_materialize_grads(False)  # no zero gradients made for mean and var
        return y, mean, var

    @staticmethod
    def backward(ctx, gy, _gmean, _gvar):
        if gy is None:
            return None, None, None, None, None, None, None
        x, weight, *saved = ctx.saved_tensors
        low = x.dtype in (torch.float16, torch.bfloat16)
        c = x.shape[1]
        acc = {"dtype": torch.float32} if low else {}
        stats = list(zip(saved[0::3], saved[1::3], saved[2::3]))
        parts = []  # per run: x - mean (fp32), mean of g, mean of g * (x - mean)
        for xv, g, (mean, _, _) in zip(_run_views(x, ctx.runs), _run_views(gy, ctx.runs), stats):
            dims = _reduce_dims(xv)
            xc = xv - mean  # fp32 (mean is fp32): x widened exactly, centred before any product
            parts.append((xc, g.mean(dims, keepdim=True, **acc), (g * xc).mean(dims, keepdim=True)))
        local = [(mg, mgx) for _, mg, mgx in parts]
        means = local
        if ctx.group is not None:  # the global chunks' means, in one all-reduce for every chunk
            means = _mean_over_processes(local, ctx.runs, c, ctx.group, ctx.world)
        compiling = torch.compiler.is_compiling()  # out of place and concatenated, as in forward
        want_dx = ctx.needs_input_grad[0]
        dx = torch.empty_like(x) if want_dx and not compiling else None
        dx_runs = _run_views(dx, ctx.runs) if dx is not None else [None] * len(ctx.runs)
        dx_parts = []
        dw = db = None
        for (xc, _, _), (mean_g, mean_gxc), (_, rstd, scale), g, out, (lg, lgx) in zip(
            parts, means, stats, _run_views(gy, ctx.runs), dx_runs, local
        ):
            if want_dx:
                # dx = scale * (g - mean_g - xhat * mean(g * xhat)) = scale * g - scale * mean_g - a * (x - mean),
                # with a = scale * rstd^2 * mean(g * (x - mean)); in fp32, rounded once
                a = torch.mul(scale, rstd).mul_(rstd).mul_(mean_gxc)
                shift = torch.mul(scale, mean_g).neg_()
                if compiling:
                    part = torch.addcmul(shift, xc, a, value=-1).addcmul_(g, scale)
                    dx_parts.append(part.to(x.dtype).reshape(-1, *x.shape[1:]))
                elif low:  # in fp32, rounded once (the terms largely cancel)
                    out.copy_(torch.addcmul(shift, xc, a, value=-1).addcmul_(g, scale))
                else:
                    torch.addcmul(shift, xc, a, value=-1, out=out).addcmul_(g, scale)
            count = xc[0].numel() // c  # values per (chunk, channel) in this process's shard
            if weight is not None and ctx.needs_input_grad[1]:
                part = (lgx * rstd).sum(0).view(c).mul_(count)  # sum over the shard of g * xhat
                dw = part if dw is None else dw + part
            if ctx.needs_input_grad[2]:
                part = lg.sum(0).view(c).mul_(count)
                db = part if db is None else db + part
        if dx_parts:
            dx = torch.cat(dx_parts)
        if dw is not None:
            dw = dw.to(weight.dtype)
        if db is not None:
            db = db.to(weight.dtype if weight is not None else x.dtype)
        return dx, dw, db, None, None, None, None


def _cat(parts: List[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _combine_over_processes(stats, runs: Runs, c: int, group, world: int):
    """Each run's ``(var, mean)`` over every process's equal shard: one all-gather of all chunks'
    local means and variances, combined in the centred form (no cancellation)."""
    import torch.distributed as dist

    local = _cat([torch.stack([mean.view(-1, c), var.view(-1, c)], 1) for var, mean in stats])  # (K, 2, C)
    everyone = local.new_empty((world * local.shape[0], 2, c))
    # all_gather_single where torch has it (2.13 deprecated all_gather_into_tensor, which calls it;
    # dynamo traces both as the same functional collective)
    getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(everyone, local, group=group)
    everyone = everyone.view(world, -1, 2, c)
    # Equal counts per process: the mean of the means, and the mean of the variances plus the
    # variance of the means (each process's chunk centred on its own mean, then combined).
    spread, mean = torch.var_mean(everyone[:, :, 0], 0, correction=0)
    var = everyone[:, :, 1].mean(0).add_(spread)
    out, start = [], 0
    for (k, _), (v_, m_) in zip(runs, stats):
        out.append((var[start : start + k].view(v_.shape), mean[start : start + k].view(m_.shape)))
        start += k
    return out


def _mean_over_processes(local, runs: Runs, c: int, group, world: int):
    """Each run's per-chunk means of ``g`` and ``g * (x - mean)`` over every process's shard (one all-reduce)."""
    import torch.distributed as dist

    buf = _cat([torch.stack([mg.reshape(-1, c), mgx.reshape(-1, c)], 1) for mg, mgx in local])  # (K, 2, C)
    dist.all_reduce(buf, group=group)
    buf = buf.div_(world)
    out, start = [], 0
    for (k, _), (mg, mgx) in zip(runs, local):
        out.append((buf[start : start + k, 0].view(mg.shape), buf[start : start + k, 1].view(mgx.shape)))
        start += k
    return out


def _update_weights(cache: Dict[Tuple[int, float], torch.Tensor], k: int, m: float, like: torch.Tensor) -> torch.Tensor:
    """``(1 - m)^(k-1-j)`` for chunk j (``addmm_`` scales by m): one factory kernel, no copy;
    made once per fused call for each (chunks, momentum) its layers use."""
    if (k, m) not in cache:
        cache[(k, m)] = torch.logspace(k - 1, 0, k, base=1.0 - m, device=like.device, dtype=like.dtype).view(1, k)
    return cache[(k, m)]


@torch.no_grad()
def _update_running(
    bn: _BatchNorm, mean: torch.Tensor, var: torch.Tensor, runs: Runs, x: torch.Tensor, world: int = 1
) -> None:
    """The running statistics after one update per chunk, in chunk order, in closed form. The
    counter's increments are added for all layers at once at the end of the fused call. With
    ``world`` processes each chunk of ``x`` is one of ``world`` equal shards of the global chunk."""
    per_value = x[0].numel() // x.shape[1]  # values per channel in one sample
    start = 0
    for k, n in runs:
        m_, v_ = mean[start : start + k], var[start : start + k]
        start += k
        count = n * per_value * world
        bessel = count / (count - 1)
        pending = bn._dael_pending
        bn._dael_pending = pending + k
        if bn.momentum is None:  # cumulative average over every update so far
            t0 = bn.num_batches_tracked.to(mean.dtype) + pending
            keep, add = t0 / (t0 + k), 1.0 / (t0 + k)
            bn.running_mean.mul_(keep).add_(m_.sum(0) * add)
            bn.running_var.mul_(keep).add_(v_.sum(0) * (add * bessel))
        else:
            m = float(bn.momentum)
            coef, decay = _update_weights(bn._dael_weights, k, m, mean), (1.0 - m) ** k
            bn.running_mean.view(1, -1).addmm_(coef, m_, beta=decay, alpha=m)
            bn.running_var.view(1, -1).addmm_(coef, v_, beta=decay, alpha=m * bessel)


def _check_counts(x: torch.Tensor, sizes: Sequence[int]) -> None:
    per_value = x[0].numel() // x.shape[1] if x.dim() > 1 else 1
    if min(sizes) * per_value <= 1:
        raise ValueError(
            f"Expected more than 1 value per channel when training, got a chunk of {min(sizes)} "
            f"sample(s) of input size {list(x.shape[1:])}"
        )


class _ChunkedMixin:
    """Batch statistics per chunk while ``_dael_chunks`` is set (see module docstring)."""

    _dael_chunks: Optional[List[int]] = None
    _dael_impl: str = "split"
    _dael_pending = 0  # counter increments of this fused call, added at its end
    _dael_weights: Optional[dict] = None  # closed-form update weights, shared by the call's layers
    _dael_sync = None  # a process group: batch statistics over every process's shard (set_sync)
    _dael_world = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sizes = self._dael_chunks
        uses_batch_stats = self.training or not self.track_running_stats
        # Synchronised in training only, as torch's SyncBatchNorm: in evaluation a layer without running
        # statistics normalises each process's batch alone (shards can differ by a batch, and one
        # rank's extra collective would hang the others).
        if self._dael_sync is not None and self.training:
            return self._synced(x, sizes or [x.shape[0]])
        if sizes is None or not uses_batch_stats or len(sizes) == 1:
            return super().forward(x)
        if x.shape[0] != sum(sizes):
            raise ValueError(f"per-chunk batch norm: a batch of {x.shape[0]} is not chunks of {list(sizes)}")
        if self._dael_impl == "grouped" and grouped_reason(self) is None:
            return self._grouped(x, sizes)
        return torch.cat([super(_ChunkedMixin, self).forward(c) for c in x.split(list(sizes))])

    def _synced(self, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """The grouped form with statistics over every process's shard of each chunk."""
        self._check_input_dim(x)
        if x.shape[0] != sum(sizes):
            raise ValueError(f"per-chunk batch norm: a batch of {x.shape[0]} is not chunks of {list(sizes)}")
        runs = runs_of(sizes)
        y, mean, var = _GroupedBatchNorm.apply(
            x, self.weight, self.bias, runs, self.eps, self._dael_sync, self._dael_world
        )
        if self.training and self.track_running_stats:
            if self._dael_chunks is None:  # a plain call: one update, counted now
                self._dael_weights = {} if self._dael_weights is None else self._dael_weights
                _update_running(self, mean, var, runs, x, self._dael_world)
                with torch.no_grad():
                    self.num_batches_tracked.add_(self._dael_pending)
                self._dael_pending, self._dael_weights = 0, None
            else:
                _update_running(self, mean, var, runs, x, self._dael_world)
        if _is_norm_act(type(self).__bases__[1]):
            y = self.act(self.drop(y))
        return y

    def _grouped(self, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        self._check_input_dim(x)
        _check_counts(x, sizes)
        runs = runs_of(sizes)
        y, mean, var = _GroupedBatchNorm.apply(x, self.weight, self.bias, runs, self.eps, None, 1)
        if self.training and self.track_running_stats:
            _update_running(self, mean, var, runs, x)
        if _is_norm_act(type(self).__bases__[1]):
            y = self.act(self.drop(y))
        return y


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


def _chunked_copy(bn: _BatchNorm) -> _BatchNorm:
    """A module of ``bn``'s per-chunk class holding ``bn``'s parameters and buffers (the same
    tensors) and its hooks; ``bn`` itself keeps its class and attributes."""
    cls = _chunked_class(type(bn))
    new = cls.__new__(cls)
    # Module's containers (parameters, buffers, hooks, children) copied, their contents shared
    new.__dict__.update({k: (v.copy() if isinstance(v, (dict, set)) else v) for k, v in bn.__dict__.items()})
    # Instance attributes from the start: a compiled step guards on which exist, so setting them
    # for the first time in the first step would recompile the second.
    new._dael_impl, new._dael_chunks, new._dael_pending, new._dael_weights = "split", None, 0, None
    new._dael_sync, new._dael_world = None, 1
    return new


def convert(module: nn.Module) -> List[_BatchNorm]:
    """Put a per-chunk batch-norm module in place of every batch-norm layer of ``module`` (in its
    parent, under the same name: the state-dict keys do not change); returns them, in the order
    of ``module.modules()``. Idempotent. The layers replaced are left as they were: no class or
    attribute is set on them; each new module shares their parameters and buffers."""
    if isinstance(module, _BatchNorm) and not isinstance(module, _ChunkedMixin):
        raise ValueError("per-chunk batch norm converts the batch-norm layers inside a module, not a bare layer")
    made: Dict[int, _BatchNorm] = {}  # a layer shared by two parents stays one module
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, _BatchNorm) and not isinstance(child, _ChunkedMixin):
                setattr(parent, name, made.setdefault(id(child), _chunked_copy(child)))
    return [m for m in module.modules() if isinstance(m, _ChunkedMixin)]


def set_sync(module: nn.Module, group, world: int) -> List[_BatchNorm]:
    """Normalise every batch-norm layer of ``module`` in training with statistics over all
    ``world`` processes of ``group`` (each chunk an equal shard per process), per chunk: the
    per-domain synchronised batch norm of a distributed run. ``group=None`` undoes it (the hosts
    do at the end of training: a process group cannot be copied, and ``copy.deepcopy`` of the
    trained model then works)."""
    bns = convert(module)
    for m in bns:
        if group is not None and grouped_reason(m) is not None:
            raise ValueError(f"per-domain synchronised batch norm needs plain batch-norm layers: {grouped_reason(m)}")
        m._dael_sync, m._dael_world = group, (int(world) if group is not None else 1)
    return bns


def resolve_impl(impl: str, device_type: str) -> str:
    """``auto``: ``grouped`` on CUDA, ``split`` elsewhere (module docstring says why);
    a layer ``grouped`` cannot take uses ``split``."""
    if impl not in IMPLS:
        raise ValueError(f"per-chunk batch norm: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "grouped" if device_type == "cuda" else "split"
    return impl


def _device_type(module: nn.Module) -> str:
    for p in module.parameters():
        return p.device.type
    return "cpu"


def _begin(
    module: nn.Module, chunks: Sequence[int], impl: str, layers: Optional[List[_BatchNorm]], device_type: Optional[str]
) -> List[_BatchNorm]:
    reason = unfusable_reason(module)
    if reason is not None:
        raise ValueError(f"per-chunk batch norm cannot fuse this module: {reason}")
    bns = layers if layers is not None else convert(module)
    mode = resolve_impl(impl, device_type or _device_type(module))
    sizes = [int(s) for s in chunks]
    weights: dict = {}
    for m in bns:
        m._dael_impl, m._dael_chunks, m._dael_pending, m._dael_weights = mode, sizes, 0, weights
    return bns


def _end(bns: List[_BatchNorm], done: bool) -> None:
    counted = [m for m in bns if m._dael_pending] if done else []
    if counted:  # the counters of every layer in one kernel
        with torch.no_grad():
            torch._foreach_add_([m.num_batches_tracked for m in counted], [m._dael_pending for m in counted])
    for m in bns:
        m._dael_chunks, m._dael_pending, m._dael_weights = None, 0, None


def fused_forward(
    module: nn.Module,
    x: torch.Tensor,
    chunks: Sequence[int],
    impl: str = "auto",
    layers: Optional[List[_BatchNorm]] = None,
) -> torch.Tensor:
    """``module(x)`` with each chunk of ``x`` (``chunks``: their sizes, in order) normalised with
    its own statistics, as separate calls would. ``layers``: the module's converted layers (from
    :func:`convert`), to skip the module walk on every call.

    Plain functions, no context manager or helper object, so ``torch.compile`` traces it whole."""
    bns = _begin(module, chunks, impl, layers, x.device.type)
    done = False
    try:
        y = module(x)
        done = True
    finally:
        _end(bns, done)
    return y


@contextlib.contextmanager
def per_chunk_batch_norm(
    module: nn.Module,
    chunks: Sequence[int],
    impl: str = "auto",
    layers: Optional[List[_BatchNorm]] = None,
) -> Iterator[None]:
    """Within this block, ``module(x)`` normalises each chunk of ``x`` with its own statistics,
    as :func:`fused_forward` does (for tests and interactive use: one call in the block)."""
    bns = _begin(module, chunks, impl, layers, None)
    done = False
    try:
        yield
        done = True
    finally:
        _end(bns, done)


__all__ = [
    "BATCH_MIXERS",
    "IMPLS",
    "PYTHON_DRAWERS",
    "convert",
    "fused_forward",
    "grouped_reason",
    "layer_named",
    "per_chunk_batch_norm",
    "resolve_impl",
    "runs_of",
    "set_sync",
    "unfusable_reason",
]
