"""Divergence checks that never sync the host inside a training step.

:class:`FiniteGuard` keeps one device-side flag: each step ORs in whether its
loss was non-finite, and the host reads the flag only when it already reads
the meters (every ``PRINT_FREQ`` steps and at the end of an epoch).
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

import torch

from dael_plugin.engine.checkpoint import LAST, checkpoint_epoch
from dael_plugin.errors import NonFiniteLossError


class FiniteGuard:
    def __init__(self) -> None:
        self.bad: Optional[torch.Tensor] = None

    def update(self, loss: torch.Tensor) -> None:
        bad = ~torch.isfinite(loss.detach()).all()
        self.bad = bad if self.bad is None else (self.bad | bad)

    def reset(self) -> None:
        self.bad = None

    def tripped(self) -> bool:
        """Whether any step since the reset was non-finite, on any process of a distributed run
        (so every process stops at the same step)."""
        from dael_plugin.engine.distributed import any_true

        return any_true(self.bad is not None and bool(self.bad))


def weights_finite(modules: Iterable[torch.nn.Module]) -> bool:
    """Whether every parameter and floating-point buffer (batch-norm statistics) is finite: one
    host read for all of them, once per epoch before the checkpoint is written, so a "last good
    checkpoint" is good in its buffers too."""
    flags = [
        torch.isfinite(t.detach()).all()
        for m in modules
        for t in list(m.parameters()) + [b for b in m.buffers() if b.is_floating_point()]
    ]
    return bool(torch.stack(flags).all()) if flags else True


def divergence_error(
    epoch: int, batch: Optional[int], lr: float, output_dir: Optional[str], what: str = "loss"
) -> NonFiniteLossError:
    """The one-line message: NaN/inf, where, the likely cause, and the last good checkpoint (of the
    plugin's trainers; ``output_dir`` None for Dassl's own, whose checkpoints are their own)."""
    where = f"epoch {epoch}" + (f" (by batch {batch})" if batch is not None else "")
    path = os.path.join(output_dir, LAST) if output_dir is not None else ""
    done = checkpoint_epoch(path) if path and os.path.isfile(path) else None
    keep = (
        f"the last good checkpoint is {path} (epoch {done})"
        if done is not None
        else ("no checkpoint was saved before it" if path else "found by Dassl's own check (detect_anomaly)")
    )
    return NonFiniteLossError(
        f"the {what} became NaN/inf at {where}; likely cause: the learning rate is too high "
        f"(OPTIM.LR={lr:g}) or the inputs hold NaN/inf; {keep}; no results.json was written"
    )
