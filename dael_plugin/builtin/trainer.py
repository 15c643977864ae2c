"""The built-in engine: DAEL and SourceOnly on plain torch, torchvision and tqdm.

It serves the main job until Dassl is installed, with the same CLI, config
keys, algorithm core and results.json schema. It is glue, not a toolbox:
data come from ``dael_plugin.data.folders``, the model from
``dael_plugin.backbones``, the losses from ``dael_plugin.core``, and the loop,
evaluation and checkpoints from ``dael_plugin.builtin.loop``.
"""

from __future__ import annotations

import os
from typing import Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F
from yacs.config import CfgNode as CN

from dael_plugin.builtin import data as bdata
from dael_plugin.builtin.loop import CKPT, BuiltinTrainer, set_random_seed  # noqa: F401 (the CLI's)
from dael_plugin.config import check_dael_cfg, hparams_from_cfg, trainer_node
from dael_plugin.config.keys import DOMAIN_SAMPLERS, add_method_node
from dael_plugin.core import DAEL, build_heads
from dael_plugin.data.sampling import sampler_summary
from dael_plugin.engine import checkpoint as ckpt
from dael_plugin.engine.ddp_modules import wrap_each
from dael_plugin.engine.loop import local_share
from dael_plugin.engine.step import make_step, prepare_model
from dael_plugin.errors import DAELConfigError
from dael_plugin.transforms.host import build_train_transform, build_train_views, check_transform_names


class DAELBuiltin(BuiltinTrainer):
    """DAEL on the built-in engine: DA with target train data (``--trainer DAEL``), DG otherwise."""

    uses_target = True
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
        self.train_loader_x = bdata.train_loader(
            self.splits["train_x"],
            views,
            c.TRAIN_X.BATCH_SIZE,
            c.NUM_WORKERS,
            self.pin,
            self.seed,
            sampler=c.TRAIN_X.SAMPLER,
            n_domain=c.TRAIN_X.N_DOMAIN,
        )
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
            [self.optim],
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

    def predict_experts(self, x: torch.Tensor) -> torch.Tensor:
        return self.algorithm.predict_experts(x)

    @property
    def num_experts(self) -> int:
        return self.algorithm.heads.num_experts  # 1 with CLASSIFIER single (no expert named after a source)

    def features_and_experts(self, x: torch.Tensor):
        return self.algorithm.features_and_experts(x)


class DAELDGBuiltin(DAELBuiltin):
    """DAELDG: DAEL's step without L_u; it never reads target data (Dassl's DAELDG is a ``TrainerX``)."""

    uses_target = False


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
        self.train_loader_x = bdata.train_loader(
            self.splits["train_x"],
            weak,
            c.TRAIN_X.BATCH_SIZE,
            c.NUM_WORKERS,
            self.pin,
            self.seed,
            sampler=c.TRAIN_X.SAMPLER,
            n_domain=c.TRAIN_X.N_DOMAIN,
        )
        takes_u = self.target_batches and self.is_da
        self.train_loader_u = self._u_loader(self.target_views(weak)) if takes_u else None
        self.test_loader = self._test_loader(self.splits["test"])
        if balanced:
            self._warn_small_domains(self.train_loader_x)

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
            from dael_plugin.builtin.source_model import load_source_model

            ds = self.cfg.DATASET
            run = {"dataset": ds.NAME, "sources": self.sources, "targets": list(ds.TARGET_DOMAINS)}
            run["fingerprint"] = self.data_fingerprint
            load_source_model(self.cfg.MODEL.INIT_WEIGHTS, modules["F"], modules["C"], self.classnames, run)
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


class SourceOnlyBuiltin(SingleClassifier):
    """One classifier trained with cross-entropy on the pooled source domains: the DA baseline that
    never trains on the target (its runs are DA: the records' validators may read target images)."""

    uses_target = True
    target_batches = False

    def update(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        x = batch_x["img"].to(self.device, non_blocking=True)
        y = batch_x["label"].to(self.device, non_blocking=True)
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        self.backward_and_update(loss)
        acc = (logits.argmax(-1) == y).float().mean() * 100.0
        return {"loss": loss.detach(), "acc": acc}


class VanillaBuiltin(SourceOnlyBuiltin):
    """SourceOnly's step as Dassl's DG ``Vanilla``: a DG method (it never reads target data)."""

    uses_target = False


TRAINERS = {"DAEL": DAELBuiltin, "DAELDG": DAELDGBuiltin, "SourceOnly": SourceOnlyBuiltin, "Vanilla": VanillaBuiltin}
# Dassl's baselines, each in a module of its own (which imports this one), loaded when a run names it
BASELINES = {
    "M3SDA": "dael_plugin.builtin.m3sda:M3SDABuiltin",
    "MME": "dael_plugin.builtin.mme:MMEBuiltin",
    "MCD": "dael_plugin.builtin.mcd:MCDBuiltin",
    "DANN": "dael_plugin.builtin.dann:DANNBuiltin",
    "SE": "dael_plugin.builtin.se:SEBuiltin",
    "ADDA": "dael_plugin.builtin.adda:ADDABuiltin",
    "AdaBN": "dael_plugin.builtin.adabn:AdaBNBuiltin",
    "CrossGrad": "dael_plugin.builtin.crossgrad:CrossGradBuiltin",
    "DomainMix": "dael_plugin.builtin.domain_mix:DomainMixBuiltin",
    "DDAIG": "dael_plugin.builtin.ddaig:DDAIGBuiltin",
}


def trainer_names() -> list:
    """Every ``--trainer`` the built-in engine runs."""
    return sorted(set(TRAINERS) | set(BASELINES))


def register(name: str, config: Optional[dict] = None):
    """Make a trainer class ``--trainer NAME`` on the built-in engine (a class decorator). A name
    already taken is refused: a second class would silently replace the first. ``config``: the
    method's own keys and their defaults, as ``TRAINER.<NAME>`` (Dassl's convention; YAML files,
    the command line and sweep grids set them, and an unknown key is refused as any other)."""

    def add(cls):
        if (name in TRAINERS and TRAINERS[name] is not cls) or (name in BASELINES and name not in TRAINERS):
            raise DAELConfigError(f"a built-in trainer named {name!r} exists; pick another")
        if not (isinstance(cls, type) and issubclass(cls, BuiltinTrainer)):
            raise DAELConfigError(f"{cls!r} is not a BuiltinTrainer subclass; derive it from SingleClassifier")
        if config is not None:
            add_method_node(name, config)
        TRAINERS[name] = cls
        return cls

    return add


def trainer_class(name: str) -> type:
    """The built-in trainer class of ``--trainer NAME`` (a baseline's module loaded on first use)."""
    if name in BASELINES and name not in TRAINERS:
        import importlib

        module, cls = BASELINES[name].split(":")
        TRAINERS[name] = getattr(importlib.import_module(module), cls)
    if name not in TRAINERS:
        raise DAELConfigError(
            f"trainer {name!r} is not available on the built-in engine (it has {trainer_names()}); "
            "a trainer of your own: --plugin MODULE, the module that registers it (docs/internals.md)"
        )
    return TRAINERS[name]


def method_setting(name: str) -> str:
    """ "DA" or "DG" of a trainer's runs, from its class's ``uses_target`` (a name the built-in engine
    does not know: "DA"), for a run folder without results.json; a run's own record says it."""
    try:
        cls = trainer_class(name)
    except DAELConfigError:
        return "DA"
    return "DA" if cls.uses_target else "DG"


def build_builtin_trainer(cfg: CN, eval_each_epoch: bool = False, eval_only: bool = False) -> BuiltinTrainer:
    return trainer_class(cfg.TRAINER.NAME)(cfg, eval_each_epoch=eval_each_epoch, eval_only=eval_only)
