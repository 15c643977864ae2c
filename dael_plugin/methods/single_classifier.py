"""The base of a single-classifier method (a backbone ``F`` and a linear classifier ``C``, as Dassl's
``SimpleNet``): derive a method of your own from it and write its ``update`` (docs/internals.md).
"""

from __future__ import annotations

import os
from typing import Dict, Optional

import torch
from torch import nn

from dael_plugin.config.keys import DOMAIN_SAMPLERS
from dael_plugin.engine import checkpoint as ckpt
from dael_plugin.engine.ddp_modules import wrap_each
from dael_plugin.engine.trainer import CKPT, BuiltinTrainer
from dael_plugin.transforms.host import build_train_transform


class SingleClassifier(BuiltinTrainer):
    """A backbone ``F`` and one linear classifier ``C`` (under torchrun, DDP averages their
    gradients through ``self.net``), fed by the source loader (Dassl's ``TRAIN_X.SAMPLER``) and,
    where ``uses_target`` and the run is DA, an unlabeled target loader of the same weak view.
    A trainer built on it supplies :meth:`update` alone; docs/internals.md has an example. Modules
    it adds in ``build_model`` are called through ``self.nets[name]`` (DDP's under torchrun)."""

    uses_target = False  # True: a DA method (its run is DA where the data has a target train split)
    target_batches = True  # with uses_target: batch_u holds target images (False: SourceOnly, a DA baseline)
    reads_init_weights = True  # Dassl's SimpleNet: MODEL.INIT_WEIGHTS, a SourceOnly checkpoint

    def build_loaders(self) -> None:
        cfg = self.cfg
        c = cfg.DATALOADER
        weak = build_train_transform(cfg, cfg.INPUT.TRANSFORMS)
        balanced = c.TRAIN_X.SAMPLER in DOMAIN_SAMPLERS
        self.train_loader_x = self._x_loader(self.source_views(weak))
        takes_u = self.target_batches and self.is_da
        self.train_loader_u = self._u_loader(self.target_views(weak)) if takes_u else None
        self.test_loader = self._test_loader(self.splits["test"])
        if balanced:
            self._warn_small_domains(self.train_loader_x)

    def source_views(self, weak):
        """The source loader's transforms: the weak view (``img``); a list gives ``img``, ``img2``, ..."""
        return weak

    def target_views(self, weak):
        """The target loader's transforms: the weak view (``img``); a list gives ``img``, ``img2``, ..."""
        return weak

    source_model_record: Optional[dict] = None  # the sha256 of the MODEL.INIT_WEIGHTS file read

    def run_state(self, epochs_done: int, rng_ranks: Optional[list] = None) -> dict:
        state = super().run_state(epochs_done, rng_ranks)
        if self.source_model_record is not None:  # a resume may find the same file at another path
            state["source_model"] = dict(self.source_model_record)
        return state

    def resuming(self) -> bool:
        """The output folder holds this run's last checkpoint: its modules (ADDA's frozen source
        copy, AdaBN's source model) come from there, not from MODEL.INIT_WEIGHTS, which may be gone."""
        return os.path.isfile(os.path.join(self.cfg.OUTPUT_DIR, CKPT))

    def build_model(self) -> Dict[str, nn.Module]:
        """``F`` and ``C`` (Dassl's ``SimpleNet``), from ``MODEL.INIT_WEIGHTS`` where it is set,
        as Dassl's ``build_model`` loads it (``source_model.load_source_model``, strict)."""
        backbone = self.build_backbone()
        modules = {"F": backbone, "C": nn.Linear(backbone.out_features, self.num_classes)}
        if self.cfg.MODEL.INIT_WEIGHTS and self.eval_only:
            print("--eval-only: the weights come from the checkpoint (MODEL.INIT_WEIGHTS unread)")
        elif self.cfg.MODEL.INIT_WEIGHTS and self.resuming():
            print(
                f"Resuming: the source model comes from {self.cfg.OUTPUT_DIR}'s checkpoint (MODEL.INIT_WEIGHTS unread)"
            )
            last = ckpt.load_checkpoint(os.path.join(self.cfg.OUTPUT_DIR, CKPT))
            self.source_model_record = last.get("source_model")  # carried on into later checkpoints
        elif self.cfg.MODEL.INIT_WEIGHTS:
            from dael_plugin.engine.source_model import load_source_model

            ds = self.cfg.DATASET
            run = {"dataset": ds.NAME, "sources": self.sources, "targets": list(ds.TARGET_DOMAINS)}
            run["fingerprint"] = self.data_fingerprint
            named = nn.ModuleDict({"backbone": modules["F"], "classifier": modules["C"]})  # as Dassl's SimpleNet
            load_source_model(self.cfg.MODEL.INIT_WEIGHTS, named, self.classnames, run)
            self.source_model_record = {"sha256": ckpt.file_sha256(self.cfg.MODEL.INIT_WEIGHTS)}
        return modules

    def build_step(self) -> None:
        # Under torchrun each trainable module runs under a DDP of its own, which averages its
        # gradients (a module the trainer adds in build_model too); a call around it is refused.
        self.nets = wrap_each(self.modules, self.device, self.cfg.TRAINER.NAME)
        self.net = nn.Sequential(self.nets["F"], self.nets["C"])

    def forward_backward(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        with self.strategy.autocast():  # EXECUTION.PREC (engine/strategy.py)
            return self.update(batch_x, batch_u)

    def backward_and_update(self, loss: torch.Tensor, optims=None) -> None:
        """Clear the gradients of ``optims`` (every optimiser by default), one backward pass of
        ``loss``, step them: the strategy's (fp16's loss scaler; the loss to the divergence flag)."""
        self.strategy.backward_and_update(loss, self.optims.values() if optims is None else optims, self.guard)

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        """One optimisation step on a source batch (and a target batch); returns 0-dim tensors to
        log (read on the host only every PRINT_FREQ batches). Feed each loss to ``self.guard``."""
        raise NotImplementedError

    def predict_experts(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.modules["C"](self.modules["F"](x)), dim=-1).unsqueeze(1)

    def features_and_experts(self, x: torch.Tensor):
        feats = self.modules["F"](x)
        return feats, torch.softmax(self.modules["C"](feats), dim=-1).unsqueeze(1)
