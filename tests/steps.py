"""A :class:`~dael_plugin.engine.strategy.Strategy` for the tests that build DAEL's step by hand
(the trainers build theirs from ``EXECUTION.*``): these options, every other key's default."""

from __future__ import annotations

from typing import Optional

import torch

from dael_plugin.config.execution import Execution
from dael_plugin.engine.strategy import Strategy


def strategy(
    device: str | torch.device = "cpu",
    prec: str = "fp32",
    compile_mode: str = "none",
    channels_last: bool = False,
    compile_backend: Optional[str] = None,
    check_first_step: Optional[bool] = None,
) -> Strategy:
    execution = Execution(prec=prec, compile=compile_mode)
    return Strategy(execution, torch.device(device), channels_last, compile_backend, check_first_step)
