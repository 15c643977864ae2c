"""What Dassl's baselines on the built-in engine share: Dassl's one optimiser (and scheduler) per
module, its ``model_backward_and_update``, and the preconditions a baseline states in one line."""

from __future__ import annotations

import copy
import functools
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from dael_plugin.engine import distributed
from dael_plugin.errors import DAELConfigError
from dael_plugin.methods.single_classifier import SingleClassifier


class DasslBaseline(SingleClassifier):
    """A Dassl baseline: for a DA method (``uses_target``) target batches, one optimiser per module
    (``F``, ``C``, ..., as Dassl's ``register_model`` gives them), updated by named groups."""

    uses_target = True
    frozen: Tuple[str, ...] = ()  # modules no optimiser steps (ADDA's source backbone, SE's teacher)
    needs_init_weights = False  # True: a source model to adapt (ADDA, AdaBN), MODEL.INIT_WEIGHTS
    # why the update cannot run under DDP (each baseline's own reason, in the refusal's line)
    ddp_reason = "its update steps several optimisers on one backbone in turn, which DDP's averaging of one backward pass does not follow"

    def check_cfg(self) -> None:
        super().check_cfg()
        name = self.cfg.TRAINER.NAME
        self.refuse_under_torchrun(name)
        if self.needs_init_weights and not self.cfg.MODEL.INIT_WEIGHTS and not (self.resuming() or self.eval_only):
            raise DAELConfigError(
                f"{name} adapts a source model: set MODEL.INIT_WEIGHTS to the checkpoint of a finished "
                "SourceOnly run (either engine)"
            )

    @classmethod
    def refuse_under_torchrun(cls, name: str) -> None:
        """Under torchrun, one line with this trainer's reason (train.py asks before joining the
        group, so every rank stops before its first collective)."""
        if distributed.from_env().distributed:
            raise DAELConfigError(
                f"{name} on the built-in engine runs on one process: {cls.ddp_reason}; run it without torchrun"
            )

    @property
    def global_step(self) -> int:
        """The run's step, 0-based (Dassl's ``batch_idx + epoch * num_batches``)."""
        return self.batch_idx + self.epoch * self.num_batches

    def domain_net(self) -> nn.Module:
        """Dassl's second ``SimpleNet`` of its DG trainers (CrossGrad, DDAIG): a backbone of its own
        and a K-way classifier of the source domains."""
        backbone = self.build_backbone()
        return nn.Sequential(backbone, nn.Linear(backbone.out_features, len(self.sources)))

    @staticmethod
    def with_teacher(modules: Dict[str, nn.Module]) -> Dict[str, nn.Module]:
        """``modules`` and ``teacher``: a frozen copy of the student ``F`` then ``C`` (SE's and
        MeanTeacher's, Dassl's ``copy.deepcopy(self.model)``), module ``teacher`` of each checkpoint."""
        teacher = copy.deepcopy(nn.Sequential(modules["F"], modules["C"])).requires_grad_(False)
        return {**modules, "teacher": teacher}

    @functools.cached_property
    def teacher_pairs(self) -> Tuple[list, list]:
        """The teacher's parameters and the student's (``F`` then ``C``, as Dassl's model), for the EMA
        (listed once, at the first step: the modules are on their device by then)."""
        student = [p for name in ("F", "C") for p in self.modules[name].parameters()]
        return list(self.modules["teacher"].parameters()), student

    def discrepancy_steps(self, loss_fn, out: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """MCD's and M3SDA's step C: ``N_STEP_F`` updates of ``F`` alone on ``loss_fn()``."""
        for _ in range(self.n_step_f):
            loss_c = loss_fn()
            self.backward_and_update(loss_c, ("F",))
            out["loss_step_C"] = loss_c.detach()
        return out

    def check_target(self) -> None:
        if not self.is_da:
            raise DAELConfigError(
                f"{self.cfg.TRAINER.NAME} is a domain adaptation method and needs unlabeled target data, but "
                f"{self.cfg.DATASET.NAME} gives none for {list(self.cfg.DATASET.TARGET_DOMAINS)}; "
                "use a DA dataset config"
            )

    def build_optimizers(self) -> Dict[str, torch.optim.Optimizer]:
        return {name: self._build_optim(m.parameters()) for name, m in self.modules.items() if name not in self.frozen}

    def build_step(self) -> None:
        if self.uses_target:  # a DA method (no DDP wrapper: one process, see check_cfg)
            self.check_target()

    def predict_experts(self, x: torch.Tensor) -> torch.Tensor:
        return self.features_and_experts(x)[1]  # a baseline defines its prediction there, once

    def inputs(self, batch_x: dict, batch_u: dict):
        """The source images and labels and the target images, on the device."""
        dev = self.device
        return (
            batch_x["img"].to(dev, non_blocking=True),
            batch_x["label"].to(dev, non_blocking=True),
            batch_u["img"].to(dev, non_blocking=True),
        )

    def backward_and_update(self, loss: torch.Tensor, names: Optional[Sequence[str]] = None) -> None:
        """Dassl's ``model_backward_and_update(loss, names)``: the named optimisers' gradients
        cleared (every module's without ``names``), one backward pass, those optimisers stepped
        (engine/strategy.py: fp16's loss scaler; the loss to the divergence flag instead of
        Dassl's host-side ``isfinite`` check)."""
        optims = self.optims.values() if names is None else [self.optims[n] for n in names]
        super().backward_and_update(loss, optims)
