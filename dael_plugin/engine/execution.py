"""How a step executes, not what it computes: optimiser kernels, memory layout, precision.

Plain PyTorch, shared by both engines. Each option leaves the method alone;
what each changes numerically is stated where it is defined and in the README.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Optional, Sequence, Tuple

import torch
from torch import nn
from yacs.config import CfgNode as CN

from dael_plugin.config.execution import (  # noqa: F401 (COMPILE_FUSED_MIN_TORCH, check_execution: re-exported)
    COMPILE_FUSED_MIN_TORCH,
    check_execution,
)
from dael_plugin.config.table import BY_NAME

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
assert tuple(PRECISIONS) == BY_NAME["PREC"].choices
_FUSABLE_OPTIMS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


def fused_optimizer(optim: torch.optim.Optimizer, loss_scaling: bool = False) -> torch.optim.Optimizer:
    """The same optimiser with PyTorch's fused kernel (one pass over each
    parameter instead of three to five), where PyTorch has one.

    Same update rule and hyper-parameters, fp32; only the rounding of the
    fused multiply-adds differs (tested to 1e-6). Call it before a scheduler
    or any state is attached. Anything else is returned unchanged.

    SGD's momentum buffers are made here, as zeros. PyTorch's fused SGD makes
    them with ``empty_like`` on its first step and lets the kernel fill them;
    when fp16's loss scaler skips that first step (an overflow, routine at the
    initial scale), the kernel returns early and the uninitialised buffers stay,
    and the weights turn NaN a step later (torch 2.14, CPU and CUDA kernels
    alike). From zeros, the first update is ``0 * momentum + g = g``, exactly
    PyTorch's first step when ``dampening`` is 0. With ``dampening`` it would be
    ``(1 - dampening) * g``, so those groups' buffers are left to PyTorch (its
    first step stores ``g``); with ``dampening`` and loss scaling
    (``loss_scaling``), the plain optimiser is kept, with one log line.
    """
    if type(optim) not in _FUSABLE_OPTIMS or optim.state:
        return optim
    params = [p for g in optim.param_groups for p in g["params"]]
    if not params or any(p.device.type not in ("cpu", "cuda") or not p.is_floating_point() for p in params):
        return optim
    if any(g.get("differentiable") or g.get("foreach") for g in optim.param_groups):
        return optim
    sgd_momentum = isinstance(optim, torch.optim.SGD) and any(g["momentum"] != 0 for g in optim.param_groups)
    if sgd_momentum and loss_scaling and any(g["dampening"] != 0 for g in optim.param_groups):
        print(
            "dael_plugin: FUSED_OPTIM is off for SGD with dampening under fp16 loss scaling (PyTorch's fused "
            "SGD leaves its momentum uninitialised when the scaler skips the first step)"
        )
        return optim
    if not supports_fused(type(optim), params[0].device.type):
        print(
            f"dael_plugin: FUSED_OPTIM is off: torch {torch.__version__} has no fused {type(optim).__name__} "
            f"on {params[0].device.type}"
        )
        return optim
    # Every hyper-parameter travels in the groups (they hold all of them).
    groups = [{**g, "fused": True, "foreach": None} for g in optim.param_groups]
    fused = type(optim)(groups, fused=True)
    fused.defaults.update({k: v for k, v in optim.defaults.items() if k not in ("fused", "foreach")})
    if sgd_momentum:
        for g in fused.param_groups:
            # With dampening the first step must be g, not (1 - dampening) * g: PyTorch makes those
            # buffers itself (and without loss scaling no first step is skipped).
            if g["momentum"] != 0 and g["dampening"] == 0:
                for p in g["params"]:
                    fused.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return fused


def supports_fused(cls: type, device_type: str) -> bool:
    """Whether this torch has ``cls(..., fused=True)`` for parameters on ``device_type``:
    CUDA since torch 2.0 (Adam/AdamW) and 2.3 (SGD), CPU since 2.4."""
    import inspect

    if "fused" not in inspect.signature(cls.__init__).parameters:
        return False
    try:
        probe = torch.zeros(1, device=device_type, requires_grad=True)
        cls([probe], lr=0.1, fused=True)
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


def _probe(module: nn.Module, sample_shape: Sequence[int], device: torch.device, memory_format) -> Optional[str]:
    """Run two blank images through ``module`` in ``memory_format``, in evaluation
    mode and without gradients (no running statistic or random stream moves)."""
    was_training = module.training
    module.eval()
    param = next(module.parameters(), None)
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    x = torch.zeros((2, *sample_shape), device=device, dtype=dtype).contiguous(memory_format=memory_format)
    try:
        with torch.no_grad():
            module(x)
        return None
    except RuntimeError as exc:
        return str(exc).strip().splitlines()[0][:160]
    finally:
        module.train(was_training)


def _last_4d_module(module: nn.Module, sample_shape: Sequence[int], device: torch.device) -> Optional[str]:
    """The name of the last module, in call order, that outputs a 4-D map."""
    order = []
    hooks = [
        m.register_forward_hook(lambda m_, i, o, n=n: order.append(n) if torch.is_tensor(o) and o.dim() == 4 else None)
        for n, m in module.named_modules()
        if n and not list(m.children())
    ]
    try:
        _probe(module, sample_shape, device, torch.contiguous_format)
    finally:
        for h in hooks:
            h.remove()
    return order[-1] if order else None


def _contiguous_output(_module, _inputs, output):
    return output.contiguous()


def channels_last_reason(module: nn.Module, sample_shape: Sequence[int], device: torch.device) -> Optional[str]:
    """Put ``module`` in ``channels_last``; None when it runs so, else why not (and it is put back).

    A backbone that flattens its feature map with ``.view`` (Dassl's
    ``cnn_digit5_m3sda``) fails in ``channels_last``. Then the output of the
    last module that makes a 4-D map is made contiguous by a forward hook, so
    everything up to there (the convolutions and pooling) still runs in
    ``channels_last``; the values are unchanged.
    """
    if len(sample_shape) != 3:
        return f"its input is not an image batch (sample shape {tuple(sample_shape)})"
    module.to(memory_format=torch.channels_last)
    reason = _probe(module, sample_shape, device, torch.channels_last)
    if reason is None:
        return None
    last = _last_4d_module(module, sample_shape, device)
    if last is not None:
        handle = module.get_submodule(last).register_forward_hook(_contiguous_output)
        if _probe(module, sample_shape, device, torch.channels_last) is None:
            module._dael_channels_last_boundary = last
            return None
        handle.remove()
    module.to(memory_format=torch.contiguous_format)
    return reason


def patch_embedding_only(module: nn.Module) -> bool:
    """Whether every convolution of ``module`` is a patch embedding (kernel = stride), as in ViT,
    DeiT, CLIP towers and EVA: ``channels_last`` does not apply."""
    convs = [m for m in module.modules() if isinstance(m, nn.Conv2d)]
    return bool(convs) and all(tuple(m.kernel_size) == tuple(m.stride) for m in convs)


def use_channels_last(module: nn.Module, sample_shape: Sequence[int], device: torch.device, name: str = "") -> bool:
    """Put ``module`` in ``channels_last`` where it runs in it and it applies; else one log line and
    no change. It does not apply where every convolution is a patch embedding (kernel = stride: ViT,
    DeiT, CLIP towers, EVA): the layout would only add copies (4 launches a DAEL step for ViT-S)."""
    name = name or type(module).__name__
    if patch_embedding_only(module):
        print(
            f"dael_plugin: CHANNELS_LAST does not apply to {name}: its only convolution is a patch embedding; "
            "running in the default layout"
        )
        return False
    reason = channels_last_reason(module, sample_shape, device)
    if reason is not None:
        print(
            f"dael_plugin: CHANNELS_LAST is off for {name}: it fails in channels_last ({reason}); "
            "running in the default layout"
        )
        return False
    boundary = getattr(module, "_dael_channels_last_boundary", None)
    if boundary is not None:
        print(
            f"dael_plugin: CHANNELS_LAST for {name} up to {boundary!r}, whose output is made contiguous "
            "(the backbone flattens its feature map with .view after it)"
        )
    return True


def eager_random() -> None:
    """``EXECUTION.COMPILE``: inductor draws its random numbers (dropout masks, ...) with the eager
    kernels, in the eager order (``fallback_random``), so a compiled step draws what the eager step
    draws. Without it inductor generates its own stream and compiling would change the dropout
    masks, hence the run, beyond float noise (measured on the CPU: a compiled dropout net's outputs
    0.9 off eager's from the same seed; bitwise equal with it). Process-wide, set before compiling."""
    import torch._inductor.config as inductor_config

    inductor_config.fallback_random = True


def cuda_settings(cfg: CN) -> None:
    """On CUDA, for every trainer of both engines: cuDNN's autotuner (the shapes here are static,
    as the loaders drop last batches) and TF32 for fp32 matmuls and convolutions unless
    ``USE_TF32 False``. Elsewhere nothing."""
    if not (torch.cuda.is_available() and bool(cfg.get("USE_CUDA", True))):
        return
    tf32 = bool(cfg.get("USE_TF32", True))
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    print(
        f"dael_plugin: CUDA: cudnn.benchmark on; TF32 {'on' if tf32 else 'off'} for fp32 matmuls and "
        "convolutions (USE_TF32)"
    )


def autocast(prec: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast to bf16/fp16 for ``prec`` != fp32 (weights and optimiser stay fp32)."""
    dtype = PRECISIONS[prec]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(prec: str, device: torch.device) -> Optional[torch.amp.GradScaler]:
    """fp16 needs loss scaling; bf16 has fp32's range and does not.

    ``torch.amp.GradScaler(device)`` came with torch 2.3; before it, CUDA had
    ``torch.cuda.amp.GradScaler`` (used, with one log line) and CPU none."""
    if prec != "fp16":
        return None
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device.type)
    if device.type == "cuda":
        print(f"dael_plugin: torch {torch.__version__} has no torch.amp.GradScaler; using torch.cuda.amp.GradScaler")
        return torch.cuda.amp.GradScaler()
    from dael_plugin.errors import DAELConfigError

    raise DAELConfigError(
        f"PREC fp16 on {device.type} needs torch >= 2.3 (loss scaling there); "
        f"this is torch {torch.__version__}: use PREC bf16 or fp32"
    )


def cpu_budget(cgroup_root: str = "/sys/fs/cgroup") -> Tuple[int, str]:
    """The CPUs this process may use, and why: its affinity mask (``taskset``, Slurm's cpuset),
    capped by a CPU quota (a container's ``--cpus``: cgroup v2 ``cpu.max``, or v1's CFS quota)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    why = f"{n} CPUs in its affinity mask"
    for quota_file, period_file in (("cpu.max", None), ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):
        try:
            with open(os.path.join(cgroup_root, quota_file)) as f:
                fields = f.read().split()
            if period_file is None:
                quota, period = fields[0], fields[1]
            else:
                with open(os.path.join(cgroup_root, period_file)) as f:
                    quota, period = fields[0], f.read().split()[0]
            if quota in ("max", "-1"):
                continue
            allowed = max(1, math.ceil(int(quota) / int(period)))
        except (OSError, ValueError, IndexError):
            continue
        if allowed < n:
            n, why = allowed, f"a CPU quota of {int(quota) / int(period):g} CPUs ({quota_file})"
        break
    return n, why


def pin_cpu_threads(cgroup_root: str = "/sys/fs/cgroup") -> str:
    """Torch's CPU threads for a run: ``OMP_NUM_THREADS`` where set (the user's choice, or
    torchrun's, which sets 1 per worker), else at most the CPUs this process may use. Torch's
    own default follows the machine's cores, not a container's quota: 32 threads on a 2-CPU
    container slow every step several times. Returns the line said in the log."""
    env = os.environ.get("OMP_NUM_THREADS")
    if env:
        return f"{torch.get_num_threads()} CPU threads (OMP_NUM_THREADS={env})"
    budget, why = cpu_budget(cgroup_root)
    if torch.get_num_threads() > budget:
        torch.set_num_threads(budget)
        return f"{budget} CPU threads (OMP_NUM_THREADS unset; torch's default was more than the {why})"
    return f"{torch.get_num_threads()} CPU threads (OMP_NUM_THREADS unset; torch's default; {why})"
