"""DAEL (Zhou, Yang, Qiao and Xiang, *Domain Adaptive Ensemble Learning*) on the built-in engine:
``--trainer DAEL`` (DA where the data has target train data, DG otherwise) and ``DAELDG`` (DG,
never reading target data). The losses are ``dael_plugin.core``'s; the step, with every
``EXECUTION`` option, is ``engine/step.py``'s, which the Dassl engine's trainer runs too.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from dael_plugin.config import check_dael_cfg, hparams_from_cfg, trainer_node
from dael_plugin.core import DAEL, build_heads
from dael_plugin.data.sampling import sampler_summary
from dael_plugin.engine.loop import local_share
from dael_plugin.engine.step import make_step, prepare_model
from dael_plugin.engine.trainer import BuiltinTrainer
from dael_plugin.methods.registry import register
from dael_plugin.transforms.host import build_train_views, check_transform_names


@register("DAEL")
class DAELBuiltin(BuiltinTrainer):
    """DAEL on the built-in engine: DA with target train data (``--trainer DAEL``), DG otherwise."""

    uses_target = True
    per_source_domain = True  # an expert per source domain
    dael_step = True
    execution_defaults = {"CHANNELS_LAST": True, "FUSED_OPTIM": True}  # DAEL's node's defaults too

    def check_cfg(self) -> None:
        super().check_cfg()
        check_dael_cfg(self.cfg)
        node = trainer_node(self.cfg)
        check_transform_names(node.STRONG_TRANSFORMS, f"TRAINER.{self.cfg.TRAINER.NAME.upper()}.STRONG_TRANSFORMS")
        self.hparams = hparams_from_cfg(self.cfg)

    def build_loaders(self) -> None:
        cfg = self.cfg
        node = trainer_node(cfg)
        views = build_train_views(cfg, node, self.hparams.num_views, self.execution.aug_on_device)
        c = cfg.DATALOADER
        self.train_loader_x = self._x_loader(views)
        # Images per domain chunk in this process's share of a batch (all of it in one process).
        self.per_domain = local_share(self.train_loader_x.batch_sampler.per_domain)
        self.train_loader_u = self._u_loader(views) if self.is_da else None
        self.test_loader = self._test_loader(self.splits["test"])
        print(f"Sampler: {sampler_summary(c.TRAIN_X.SAMPLER, len(self.train_loader_x), self.per_domain)}")
        self._warn_small_domains(self.train_loader_x)

    def build_model(self) -> Dict[str, nn.Module]:
        backbone = self.build_backbone()
        heads = build_heads(backbone.out_features, self.num_classes, len(self.sources), self.hparams)
        e = self.execution
        mask = torch.tensor(self.classes_held, device=self.device) if self.hparams.reads_class_table else None
        self.algorithm = DAEL(
            backbone, heads, self.hparams, fuse_chunks=e.fuse_chunks, chunk_bn=e.chunk_bn, class_mask=mask
        )
        return {"F": backbone, "E": heads}

    def prepare_model(self) -> None:
        prepare_model(self.strategy, self.modules["F"], self.cfg)

    def build_step(self) -> None:
        self.step = make_step(
            self.strategy,
            self.algorithm,
            list(self.optims.values()),
            len(self.sources),
            self.per_domain,
            self.is_da,
            self.guard,
            self.cfg,
        )

    def forward_backward(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        return self.step(batch_x, batch_u)

    @property
    def pseudo_label_threshold(self) -> float:
        return self.hparams.conf_thre

    @property
    def ensemble_mask(self):
        return self.algorithm.ensemble_mask

    step = None  # the DAELStep, from build_step

    @property
    def fast_path_check(self):
        return self.step.fast_path_check

    def predict_experts(self, x: torch.Tensor) -> torch.Tensor:
        return self.algorithm.predict_experts(x)

    @property
    def num_experts(self) -> int:
        return self.algorithm.heads.num_experts  # 1 with CLASSIFIER single (no expert named after a source)

    def features_and_experts(self, x: torch.Tensor):
        return self.algorithm.features_and_experts(x)


@register("DAELDG")
class DAELDGBuiltin(DAELBuiltin):
    """DAELDG: DAEL's step without L_u; it never reads target data (Dassl's DAELDG is a ``TrainerX``)."""

    uses_target = False
