"""Where and how a trainer's step runs, for every method: the ``EXECUTION`` options.

A trainer's update stays its own (Dassl's ``forward_backward``: its losses, which optimisers
it steps and in which order); the strategy gives it, from ``EXECUTION.*``:

- ``PREC``: autocast around the update (bf16, fp16) and, for fp16, PyTorch's loss scaler in
  :meth:`Strategy.backward_and_update` (each call scales, steps and updates the scale, so an
  update that steps several optimisers in turn, as MCD's and M3SDA's do, is one scaled step each);
- ``FUSED_OPTIM``: PyTorch's fused optimiser kernels (:func:`~dael_plugin.engine.execution.fused_optimizer`);
- ``CHANNELS_LAST``: the modules that take images in ``channels_last``, where they run in it;
- ``COMPILE``: ``torch.compile`` of each module, in place (its state dict keeps its keys).

DAEL's own step (``engine/step.py``) runs on the same strategy and goes further with the same
options: one graph over the forward and the losses, the fused per-domain pass, its views fed in
``channels_last`` and made on the device, and the fused pass checked on the first batch.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterable, Optional, Sequence

import torch
from torch import nn

from dael_plugin.config.execution import Execution
from dael_plugin.engine import execution as ex


class Strategy:
    """The ``EXECUTION`` options of one run on ``device``, for a trainer's own update."""

    compile_backend = "inductor"  # torch.compile's own; the tests set aot_eager (the same graph, no C++ build)

    def __init__(
        self,
        execution: Execution,
        device: torch.device,
        views_channels_last: bool = False,
        compile_backend: Optional[str] = None,
        check_first_step: Optional[bool] = None,
    ) -> None:
        """``views_channels_last``: DAEL's step feeds its views in ``channels_last`` (the trainer
        sets it once the backbone runs in it); ``compile_backend``: this run's ``torch.compile``
        backend, where not the class's; ``check_first_step``: DAEL's fused pass checked against
        per-chunk batch norm on the first batch (None: on CUDA, engine/first_step_check.py)."""
        self.execution = execution
        self.device = device
        self.scaler: Optional[torch.amp.GradScaler] = ex.grad_scaler(execution.prec, device)
        self.views_channels_last = views_channels_last
        if compile_backend is not None:
            self.compile_backend = compile_backend
        self.check_first_step = device.type == "cuda" if check_first_step is None else check_first_step

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast to ``PREC`` (nothing at fp32); weights and optimiser state stay fp32."""
        return ex.autocast(self.execution.prec, self.device)

    def optimizer(self, optim: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """``optim`` with PyTorch's fused kernel where ``FUSED_OPTIM`` is on and PyTorch has one."""
        if not self.execution.fused_optim:
            return optim
        return ex.fused_optimizer(optim, loss_scaling=self.scaler is not None)

    def prepare(self, modules: Dict[str, nn.Module], image_modules: Sequence[str], sample_shape: Sequence[int]) -> None:
        """On the device, before the optimisers exist: ``image_modules`` (those fed images) in
        ``channels_last`` where it is on and they run in it, then each module compiled in place."""
        if self.execution.channels_last:
            for name in image_modules:
                if name in modules:
                    ex.use_channels_last(modules[name], sample_shape, self.device, name=name)
        if self.execution.compile != "none":
            ex.eager_random()  # the compiled modules draw eager's dropout masks
            for module in modules.values():
                module.compile(mode=self.execution.compile, dynamic=False, backend=self.compile_backend)

    def backward_and_update(self, loss: torch.Tensor, optims: Iterable[torch.optim.Optimizer], guard) -> None:
        """Dassl's ``model_backward_and_update``: the optimisers' gradients cleared, one backward
        pass, those optimisers stepped; under fp16 through the loss scaler (a step whose gradients
        overflow is skipped, and the scale updated). The loss goes to the divergence flag."""
        optims = list(optims)
        guard.update(loss)
        for o in optims:
            o.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            for o in optims:
                o.step()
            return
        self.scaler.scale(loss).backward()
        for o in optims:
            self.scaler.step(o)
        self.scaler.update()
