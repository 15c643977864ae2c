"""Insurance for what a CPU test cannot see: on the first training step on CUDA, the fused
``grouped`` batch-norm pass is checked against per-chunk batch norm on that very batch.

Both run on copies of the backbone (the model, its running statistics and every random stream
are left as they were), under the step's precision: one forward pass of the batch's source and
target views with their domain chunks, and one backward pass of a fixed random projection of the
features, in full fp32 where the step uses TF32. The outputs, and all parameters' gradients
together, are compared by the norm of their difference relative to the reference's. A defect in the fused kernels (statistics over the
wrong elements, a wrong gradient formula, a layout the kernels mishandle) shows as an error of
order one; rounding stays far below the tolerances (``TOLERANCE``), which leave room for bf16's and
fp16's rounding of per-chunk native kernels that are themselves compared. On a mismatch the step
falls back to the reference (``CHUNK_BN split``) with one log line, and ``results.json`` records
the check (``fast_path_check``). Its cost is about one extra training step, once per process start.

Under torchrun the copies are checked without synchronisation (each process its own shard): the
synchronised form runs the same kernels on combined statistics.
"""

from __future__ import annotations

import copy
from typing import Callable, Dict, List, Optional, Sequence

import torch

from dael_plugin.core.chunk_norm import fused_forward

# Largest relative error of the outputs and gradients that still passes, by precision.
TOLERANCE = {"fp32": 1e-3, "bf16": 1e-1, "fp16": 1e-1}


def _rel(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """``||a - b|| / ||b||`` over all the tensors together (one number for all parameters' gradients:
    a parameter whose gradient is tiny cannot dominate it with rounding noise)."""
    diff = torch.stack([(x.float() - y.float()).square().sum() for x, y in zip(a, b)]).sum().sqrt()
    norm = torch.stack([y.float().square().sum() for y in b]).sum().sqrt()
    return (diff / norm.clamp_min(1e-30)).item()


def _copy_unsynced(net: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``net`` whose batch-norm layers normalise this process's batch alone (a
    process group cannot be copied, and the comparison is of the kernels)."""
    synced = [(m, m._dael_sync, m._dael_world) for m in net.modules() if getattr(m, "_dael_sync", None) is not None]
    for m, _, _ in synced:
        m._dael_sync, m._dael_world = None, 1
    try:
        return copy.deepcopy(net)
    finally:
        for m, group, world in synced:
            m._dael_sync, m._dael_world = group, world


def compare_fused_pass(
    featurizer: torch.nn.Module,
    x: torch.Tensor,
    chunk_sizes: Sequence[int],
    impl: str,
    autocast: Callable[[], object],
) -> Dict[str, float]:
    """The largest relative errors of the fused ``impl`` pass against per-chunk batch norm
    (``split``: each chunk through the layer's own kernel) on ``x``: outputs and gradients."""
    results: List[tuple] = []
    devices = [x.device] if x.device.type == "cuda" else []
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    # Full fp32 convolutions and matmuls while checking: TF32 rounds every product to 10 bits, so two
    # passes whose inputs differ in the last bit of fp32 would differ by TF32's rounding, hiding what
    # the batch norms themselves do. (The step itself keeps USE_TF32's setting.)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.random.fork_rng(devices=devices):  # every random stream as it was (dropout draws)
            _two_passes(featurizer, x, chunk_sizes, impl, autocast, results)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    (ref_y, ref_g), (y, g) = results
    return {"output": _rel([y], [ref_y]), "gradients": _rel(g, ref_g) if g else 0.0}


def _two_passes(featurizer, x, chunk_sizes, impl, autocast, results) -> None:
    probe = None
    for mode in ("split", impl):
        net = _copy_unsynced(featurizer).train()
        for p in net.parameters():
            p.grad = None
        with autocast():
            feats = fused_forward(net, x, chunk_sizes, mode)
        if probe is None:
            gen = torch.Generator(device=x.device).manual_seed(0)
            probe = torch.randn(feats.shape, generator=gen, device=x.device)
        (feats.float() * probe).sum().backward()
        results.append(
            (feats.detach().float(), [p.grad.detach().float() for p in net.parameters() if p.grad is not None])
        )


class FastPathCheck:
    """Runs :func:`compare_fused_pass` once, on the first step's batch, and says what it found."""

    def __init__(self, prec: str) -> None:
        self.prec = prec
        self.result: Optional[Dict[str, object]] = None

    def __call__(self, algorithm, x: torch.Tensor, chunk_sizes: Sequence[int], autocast) -> None:
        from dael_plugin.core.chunk_norm import resolve_impl

        impl = resolve_impl(algorithm.chunk_bn, x.device.type)
        errors = compare_fused_pass(algorithm.featurizer, x, chunk_sizes, impl, autocast)
        tol = TOLERANCE[self.prec]
        ok = all(v <= tol for v in errors.values())
        self.result = {"impl": impl, "prec": self.prec, "tolerance": tol, **errors, "fell_back": not ok}
        if ok:
            print(
                f"dael_plugin: first-step check of the fused {impl} batch norm against per-chunk batch norm: "
                f"outputs {errors['output']:.1e}, gradients {errors['gradients']:.1e} (tolerance {tol:g})"
            )
        else:
            algorithm.chunk_bn = "split"
            print(
                f"dael_plugin: the fused {impl} batch norm differs from per-chunk batch norm on this device "
                f"(outputs {errors['output']:.1e}, gradients {errors['gradients']:.1e}, tolerance {tol:g}); "
                "falling back to CHUNK_BN split for this run (recorded in results.json)"
            )
