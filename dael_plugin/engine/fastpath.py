"""Insurance for what a CPU test cannot see: on the first training step on CUDA, the fused
``grouped`` batch-norm pass is checked on that very batch.

Three passes run on copies of the backbone (the model, its running statistics and every random
stream are left as they were): per-chunk batch norm (``split``: each chunk through torch's own
kernel) in float64, the reference; the same in the step's precision; and the fused pass in the
step's precision. Each is one forward pass of the batch's source and target views with their
domain chunks and one backward pass of a fixed random projection of the features, with full fp32
products where the step uses TF32. The outputs, and all parameters' gradients together, are
compared with the reference by the norm of their difference relative to the reference's.

The fused pass passes when it is about as accurate as torch's own kernel in the same precision:
at most ``RATIO`` times per-chunk batch norm's error plus a floor (``FLOOR``). Comparing the two
fp32 passes with each other instead would not do: a channel that is nearly constant in a chunk
(a dead ReLU at initialisation) makes batch norm ill-conditioned, and two correct fp32 kernels
then differ by up to 5e-3 in the gradients (measured on the H200 and on CPU), either one the
closer to float64. A defect in the fused kernels (statistics over the wrong elements, a wrong
gradient formula) shows as an error of order one. On a failed check the step falls back to
``CHUNK_BN split`` with one log line (under torchrun, where the synchronised form shares the
kernels, the run stops), and ``results.json`` records the check (``fast_path_check``). Its cost is
about two extra training steps (one in float64), once per process start.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Callable, Dict, Optional, Sequence

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from dael_plugin.core.chunk_norm import fused_forward

# The fused pass passes where its error against a float64 reference is at most RATIO times that of
# per-chunk batch norm in the same precision, plus a floor (errors as norms, relative).
RATIO = 4.0
# The floors: fp32's forward rounding, amplified by batch norm on nearly constant channels, leaves
# both fp32 passes 1e-4 to 5e-3 from float64 in the gradients (CPU: ResNet-18, the small CNN and
# Dassl's cnn_digit5_m3sda; the H200: 5e-7 to 5e-3), either one ahead; bf16/fp16 4e-3 to 6e-3
# (the H200). A wrong kernel is off by order one.
FLOOR = {"fp32": 1e-2, "bf16": 5e-2, "fp16": 5e-2}


def _rel(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """``||a - b|| / ||b||`` over all the tensors together (one number for all parameters' gradients:
    a parameter whose gradient is tiny cannot dominate it with rounding noise)."""
    diff = torch.stack([(x.double() - y.double()).square().sum() for x, y in zip(a, b)]).sum().sqrt()
    norm = torch.stack([y.double().square().sum() for y in b]).sum().sqrt()
    return (diff / norm.clamp_min(1e-300)).item()


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
    """Relative errors, against per-chunk batch norm in float64, of the fused ``impl`` pass
    (``output``, ``gradients``) and of per-chunk batch norm in the step's precision
    (``reference_output``, ``reference_gradients``) on ``x``."""
    passes: Dict[str, tuple] = {}
    devices = [x.device] if x.device.type == "cuda" else []
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    # Full fp32 convolutions and matmuls while checking: TF32 rounds every product to 10 bits and
    # would hide what the batch norms themselves do. (The step itself keeps USE_TF32's setting.)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.random.fork_rng(devices=devices):  # every random stream as it was (dropout draws)
            for name, mode, exact in (("exact", "split", True), ("split", "split", False), ("fused", impl, False)):
                passes[name] = _one_pass(featurizer, x, chunk_sizes, mode, autocast, exact)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    (ey, eg), (sy, sg), (fy, fg) = passes["exact"], passes["split"], passes["fused"]
    return {
        "output": _rel([fy], [ey]),
        "gradients": _rel(fg, eg) if eg else 0.0,
        "reference_output": _rel([sy], [ey]),
        "reference_gradients": _rel(sg, eg) if eg else 0.0,
    }


def _one_pass(featurizer, x, chunk_sizes, mode: str, autocast, exact: bool) -> tuple:
    """Features and parameter gradients of a fixed random projection of them, on a copy of the
    backbone: in float64 without autocast (``exact``), or as the step runs."""
    net = _copy_unsynced(featurizer)
    # Batch norm in training mode, everything else in evaluation mode: no dropout or drop-path draws,
    # whose masks would differ between the passes (CUDA's dropout draws its mask by dtype).
    net.eval()
    for m in net.modules():
        if isinstance(m, _BatchNorm):
            m.train()
    if exact:
        net = net.double()
    for p in net.parameters():
        p.grad = None
    with contextlib.nullcontext() if exact else autocast():
        feats = fused_forward(net, x.double() if exact else x, chunk_sizes, mode)
    gen = torch.Generator(device=x.device).manual_seed(0)
    probe = torch.randn(feats.shape, generator=gen, device=x.device, dtype=torch.float64)
    (feats.double() * probe).sum().backward()
    return feats.detach().double(), [p.grad.detach().double() for p in net.parameters() if p.grad is not None]


class FastPathCheck:
    """Runs :func:`compare_fused_pass` once, on the first step's batch, and says what it found."""

    def __init__(self, prec: str) -> None:
        self.prec = prec
        self.result: Optional[Dict[str, object]] = None

    def __call__(self, algorithm, x: torch.Tensor, chunk_sizes: Sequence[int], autocast) -> None:
        from dael_plugin.core.chunk_norm import resolve_impl

        impl = resolve_impl(algorithm.chunk_bn, x.device.type)
        errors = compare_fused_pass(algorithm.featurizer, x, chunk_sizes, impl, autocast)
        floor = FLOOR[self.prec]
        ok = all(errors[k] <= RATIO * errors[f"reference_{k}"] + floor for k in ("output", "gradients"))
        self.result = {"impl": impl, "prec": self.prec, "ratio": RATIO, "floor": floor, **errors, "fell_back": not ok}
        said = (
            f"outputs {errors['output']:.1e} (per-chunk {errors['reference_output']:.1e}), gradients "
            f"{errors['gradients']:.1e} (per-chunk {errors['reference_gradients']:.1e}) against float64"
        )
        if ok:
            print(f"dael_plugin: first-step check of the fused {impl} batch norm: {said}")
        else:
            algorithm.chunk_bn = "split"
            print(
                f"dael_plugin: the fused {impl} batch norm is less accurate than per-chunk batch norm on this "
                f"device ({said}; allowed {RATIO:g}x + {floor:g}); falling back to CHUNK_BN split for this run "
                "(recorded in results.json)"
            )
