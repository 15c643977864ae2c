"""Every module a trainer trains, under DDP in a torchrun run, and a training call around its
wrapper refused in one line.

DDP averages the gradients of the parameters it wraps, and of no others: a module called by
itself in a training step (``self.modules["D"](f)`` where ``self.nets["D"]`` was meant) gets
each process's own gradient, and the processes' copies drift apart with nothing said. So each
trainable module gets a wrapper of its own, and the module itself, called in training mode with
gradients on outside any wrapper, raises :class:`DAELConfigError` at the first step. Evaluation
(``eval()`` or ``torch.no_grad()``) may call the modules directly.

Off torchrun the "wrappers" are the modules themselves and nothing is hooked. What a CPU test
cannot see: NCCL's buckets and streams (gloo's all-reduce sums the same values).
"""

from __future__ import annotations

from typing import Dict, Mapping

import torch
from torch import nn

from dael_plugin.engine import distributed
from dael_plugin.errors import DAELConfigError

_DEPTH = [0]  # how many DDP wrappers' forwards are running (a wrapper's module may call another's)


def trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def _enter(_module, _args) -> None:
    _DEPTH[0] += 1


def _leave(_module, _args, _out) -> None:
    _DEPTH[0] -= 1


def wrap_each(modules: Mapping[str, nn.Module], device: torch.device, owner: str) -> Dict[str, nn.Module]:
    """``{name: DDP(module)}`` for each trainable module in a distributed run (the module itself
    otherwise, and for a frozen one); a direct training call of a wrapped module is refused."""
    if not distributed.world().distributed:
        return dict(modules)
    out: Dict[str, nn.Module] = {}
    for name, module in modules.items():
        if not trainable(module):
            out[name] = module
            continue
        wrapper = distributed.wrap(module, device)
        wrapper.register_forward_pre_hook(_enter)
        wrapper.register_forward_hook(_leave, always_call=True)
        module.register_forward_pre_hook(_refuse_outside(name, owner))
        out[name] = wrapper
    return out


def _refuse_outside(name: str, owner: str):
    def check(module: nn.Module, _args) -> None:
        if module.training and torch.is_grad_enabled() and _DEPTH[0] == 0:
            raise DAELConfigError(
                f"{owner} called module {name!r} by itself in a training step under torchrun: DDP would not "
                f"average its gradients, and each process's copy would drift apart; call it through "
                f"self.nets[{name!r}] (self.net for F then C)"
            )

    return check
