"""How a step executes, not what it computes: optimiser kernels, memory layout, precision.

Plain PyTorch, shared by both engines. Each option leaves the method alone;
what each changes numerically is stated where it is defined and in the README.
"""
from __future__ import annotations

import contextlib
from typing import Optional, Sequence

import torch
from torch import nn

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_MODES = ("none", "default", "reduce-overhead")
_FUSABLE_OPTIMS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


def fused_optimizer(optim: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The same optimiser with PyTorch's fused kernel (one pass over each
    parameter instead of three to five), where PyTorch has one.

    Same update rule and hyper-parameters, fp32; only the rounding of the
    fused multiply-adds differs (tested to 1e-6). Call it before a scheduler
    or any state is attached. Anything else is returned unchanged.
    """
    if type(optim) not in _FUSABLE_OPTIMS or optim.state:
        return optim
    params = [p for g in optim.param_groups for p in g["params"]]
    if not params or any(p.device.type not in ("cpu", "cuda") or not p.is_floating_point() for p in params):
        return optim
    if any(g.get("differentiable") or g.get("foreach") for g in optim.param_groups):
        return optim
    # Every hyper-parameter travels in the groups (they hold all of them).
    groups = [{**g, "fused": True, "foreach": None} for g in optim.param_groups]
    fused = type(optim)(groups, fused=True)
    fused.defaults.update({k: v for k, v in optim.defaults.items() if k not in ("fused", "foreach")})
    return fused


def channels_last_reason(module: nn.Module, sample_shape: Sequence[int], device: torch.device) -> Optional[str]:
    """Why ``module`` cannot run in ``channels_last``, or None when it can.

    A forward of two blank images in evaluation mode, without gradients, so no
    running statistic and no random stream moves. Backbones that ``.view`` a
    4-D feature map (Dassl's ``cnn_digit5_m3sda``) fail here.
    """
    if len(sample_shape) != 3:
        return f"its input is not an image batch (sample shape {tuple(sample_shape)})"
    was_training = module.training
    module.to(memory_format=torch.channels_last).eval()
    x = torch.zeros((2, *sample_shape), device=device).contiguous(memory_format=torch.channels_last)
    try:
        with torch.no_grad():
            module(x)
        return None
    except RuntimeError as exc:
        module.to(memory_format=torch.contiguous_format)
        first = str(exc).strip().splitlines()[0]
        return first[:160]
    finally:
        module.train(was_training)


def use_channels_last(module: nn.Module, sample_shape: Sequence[int], device: torch.device, name: str = "") -> bool:
    """Put ``module`` in ``channels_last`` when it runs in it; else one log line and no change."""
    reason = channels_last_reason(module, sample_shape, device)
    if reason is not None:
        print(f"dael_plugin: CHANNELS_LAST is off for {name or type(module).__name__}: it fails in "
              f"channels_last ({reason}); running in the default layout")
        return False
    return True


def autocast(prec: str, device: torch.device):
    """Autocast to bf16/fp16 for ``prec`` != fp32 (weights and optimiser stay fp32)."""
    dtype = PRECISIONS[prec]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(prec: str, device: torch.device) -> Optional["torch.amp.GradScaler"]:
    """fp16 needs loss scaling; bf16 has fp32's range and does not."""
    return torch.amp.GradScaler(device.type) if prec == "fp16" else None


def check_execution(prec: str, compile_mode: str, prefix: str) -> None:
    from .errors import DAELConfigError

    if prec not in PRECISIONS:
        raise DAELConfigError(f"{prefix}.PREC={prec!r} is invalid; use one of {sorted(PRECISIONS)}")
    if compile_mode not in COMPILE_MODES:
        raise DAELConfigError(f"{prefix}.COMPILE={compile_mode!r} is invalid; use one of {list(COMPILE_MODES)}")
