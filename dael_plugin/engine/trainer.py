"""The built-in engine's trainer: data, optimisers, epochs, the progress line, evaluation and its
tallies, and the hooks around the epochs (checkpoints and exact resume, records), for every method
of ``dael_plugin/methods/``.

Resume is exact: after every epoch the "last" checkpoint holds the model,
optimiser, scheduler, the RNG states and the config, and every data draw is
seeded from (seed, epoch, position), so a killed and rerun job ends with the
same weights as an uninterrupted one.

Long because it is the one loop of every built-in trainer (data, optimiser, epoch, checkpoints,
evaluation, records), as Dassl's ``SimpleTrainer`` is; the logic shared with the Dassl engine is in
engine/hooks.py (what runs around the epochs) and engine/loop.py (the epoch), and the methods
themselves in dael_plugin/methods/.
"""

from __future__ import annotations

import datetime
import os
import random
import time
from typing import Dict, List, Optional, Set

import numpy as np
import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter
from yacs.config import CfgNode as CN

from dael_plugin.backbones import build_backbone
from dael_plugin.config.execution import PLAIN_EXECUTION, execution_from_cfg
from dael_plugin.data import loaders
from dael_plugin.data.classes import classes_by_domain, say_class_table
from dael_plugin.data.fingerprint import data_fingerprint, seeded_domains
from dael_plugin.data.folders import dataset_options, load_splits, own_val, sources_val
from dael_plugin.engine import checkpoint as ckpt
from dael_plugin.engine import distributed, hooks
from dael_plugin.engine.evaluate import (
    classification_results,
    evaluate_experts,
    mean_class_accuracy,
    report_experts,
    report_official,
    save_confusion_matrix,
)
from dael_plugin.engine.execution import cuda_settings
from dael_plugin.engine.guard import FiniteGuard, divergence_error
from dael_plugin.engine.hooks import DivergenceCheck, EpochRecords, EvalEachEpoch, LastCheckpoint, StepSchedulers
from dael_plugin.engine.loop import (
    EpochLog,
    ProgressLog,
    end_sync_batch_norm,
    epoch_batches,
    note_bad,
    pick_eval_split,
    show_progress,
    sync_batch_norm,
    train_epoch,
)
from dael_plugin.engine.results import TrainerFacts
from dael_plugin.engine.selection import EvaluatedModel, Selection, record_loaders, split_sources
from dael_plugin.engine.strategy import Strategy
from dael_plugin.errors import DAELConfigError
from dael_plugin.transforms.host import build_test_transform, check_transform_names

CKPT = ckpt.LAST


def set_random_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_optimizer(o: CN, params) -> torch.optim.Optimizer:
    """The OPTIM node's optimiser (``sgd``, ``adam`` or ``adamw``, with Dassl's keys) over ``params``."""
    if o.NAME == "sgd":
        return torch.optim.SGD(
            params,
            lr=o.LR,
            momentum=o.MOMENTUM,
            weight_decay=o.WEIGHT_DECAY,
            dampening=o.SGD_DAMPNING,
            nesterov=o.SGD_NESTEROV,
        )
    cls = torch.optim.Adam if o.NAME == "adam" else torch.optim.AdamW
    return cls(params, lr=o.LR, weight_decay=o.WEIGHT_DECAY, betas=(o.ADAM_BETA1, o.ADAM_BETA2))


def check_optim_values(o: CN) -> None:
    """The optimiser built on one weight before any data is read: torch's refusal of a value (a
    negative OPTIM.MOMENTUM or WEIGHT_DECAY, an ADAM_BETA1 of 1.5) is one line, not a traceback as
    the trainer builds it."""
    try:
        make_optimizer(o, [torch.zeros(1, requires_grad=True)])
    except ValueError as exc:
        raise DAELConfigError(f"OPTIM ({o.NAME}): torch refuses it: {exc}") from None


class BuiltinTrainer(TrainerFacts):
    """Epoch loop, evaluation, checkpoints and logs shared by the built-in trainers."""

    def __init__(
        self, cfg: CN, eval_each_epoch: bool = False, eval_only: bool = False, splits=None, backbones=None
    ) -> None:
        """``splits``: the data as read by another reader (``classnames`` and the ``train_x``,
        ``train_u``, ``val`` and ``test`` items: the Dassl engine's dataset classes,
        dassl_adapter/method_trainer.py); None: the built-in engine's readers (data/folders.py).
        ``backbones``: the builder of ``MODEL.BACKBONE`` (``build_backbone``'s arguments), another
        engine's (the Dassl engine's registry, dassl_adapter/backbones.py); None: the plugin's."""
        self.cfg = cfg
        self.backbones = backbones or build_backbone
        self.eval_each_epoch = eval_each_epoch
        self.eval_only = eval_only  # --eval-only: the weights come from a checkpoint (no source model read)
        # The eta's pace: wall time and batches since training started (train() restarts both;
        # set here too, so that run_epoch() alone, as the bench calls it, works).
        self._run_start, self._batches_run = time.time(), 0
        self.world = distributed.world()
        self.device = distributed.device(cfg.USE_CUDA)
        cuda_settings(cfg)
        self.pin = self.device.type == "cuda"
        self.sources = list(cfg.DATASET.SOURCE_DOMAINS)
        # EXECUTION.*: how the update runs (engine/strategy.py); DAEL's step keys only where it has one
        self.execution = execution_from_cfg(cfg, self.execution_defaults, "" if self.dael_step else cfg.TRAINER.NAME)
        self.strategy = Strategy(self.execution, self.device)
        self.check_cfg()
        self.seed = max(int(cfg.SEED), 0)
        self.category_shift = bool(cfg.DATASET.get("CATEGORY_SHIFT", False))
        self.splits = splits or load_splits(
            cfg.DATASET.NAME,
            cfg.DATASET.ROOT,
            self.sources,
            cfg.DATASET.TARGET_DOMAINS,
            seed=self.seed,
            category_shift=self.category_shift,
            options=dataset_options(cfg.DATASET),
        )
        # which images were read, per split and domain: in results.json and the checkpoint (resume compares)
        ds = cfg.DATASET
        self.data_fingerprint = data_fingerprint(
            self.splits, self.sources, ds.TARGET_DOMAINS, ds.ROOT, seeded_domains(ds), dataset=ds.NAME
        )
        distributed.check_same_run(cfg, self.data_fingerprint)  # every rank: rank 0's settings and data
        self.check_domains_named()
        self.classnames: List[str] = self.splits["classnames"]
        self.num_classes = len(self.classnames)
        # which classes each source holds (DATASET.CATEGORY_SHIFT: they may differ; else all of them)
        self.classes_held = classes_by_domain(self.splits["train_x"], len(self.sources), self.num_classes)
        if self.category_shift and self.world.is_main:
            say_class_table(self.classes_held, self.sources, self.classnames)
        self.has_target_train = self.splits["train_u"] is not None
        self.is_da = self.has_target_train and self.uses_target  # the one truth: the method's
        self.bad_images: Set[str] = set()
        self._source_val_split()
        self.build_loaders()
        self._shard_loaders()
        self.val_loader = self._test_loader(self.splits["val"]) if self.splits["val"] else None
        self.modules = nn.ModuleDict(self.build_model()).to(self.device)
        self.guard = FiniteGuard()
        self.prepare_model()
        if not self.dael_step:
            self.strategy.prepare(self.modules, self.image_modules, (3, *[int(v) for v in cfg.INPUT.SIZE]))
        sync_batch_norm(self.modules)  # under torchrun: statistics over every shard, per domain chunk
        # One optimiser and scheduler per group of modules (build_optimizers); the first is
        # self.optim / self.sched, which a trainer with one optimiser uses alone.
        self.optims = self.build_optimizers()
        self.scheds = {name: self.build_scheduler(o) for name, o in self.optims.items()}
        first = next(iter(self.optims))
        self.optim, self.sched = self.optims[first], self.scheds[first]
        self.build_step()
        self.start_epoch = 0
        self.epoch = 0
        self.batch_idx, self.num_batches = 0, len(self.train_loader_x)
        self.expert_accuracy: List[float] = []
        self.last_accuracy: Optional[float] = None
        self.loaded_epoch: Optional[int] = None
        self.writer: Optional[SummaryWriter] = None
        self.selection = self._build_selection()
        self.hooks = hooks.bind(self, self.build_hooks())
        self._summary()

    # What a trainer reads of Dassl's per-trainer loader and model keys (a value it would ignore
    # is refused, as a run that silently ignores it would look like the run it names):
    k_transforms = 1  # DATALOADER.K_TRANSFORMS (SE, CDAC: 2 draws of a view of each target image)
    reads_init_weights = False  # MODEL.INIT_WEIGHTS (Dassl's SimpleNet trainers load it)
    optimises = True  # False: no optimiser steps, so no scheduler does either (AdaBN, as Dassl's)
    # A DA method: its run is DA where the data has a target train split (the log, results.json's
    # "setting", the records' validators, collect's table); False: DG, target data never read.
    uses_target = False
    # True: the model has one output per source domain (an expert, a class of a domain classifier),
    # which a dataset naming one source of many metadata domains (WILDS) cannot give it.
    per_source_domain = False
    # The records' mask_rate validator counts the target predictions this confident (DAEL: CONF_THRE).
    pseudo_label_threshold = 0.95
    own_records = True  # the records and best models are this trainer's (engine/results.TrainerFacts)
    # The engine its checkpoints name: a method on Dassl's loop says "dassl" (its
    # dataset classes may list the images in another order, so a resume stays on one engine).
    engine = "builtin"
    # EXECUTION's None (CHANNELS_LAST, FUSED_OPTIM): the trainer's own choice; off, as Dassl's trainers run
    execution_defaults = PLAIN_EXECUTION
    dael_step = False  # True: DAEL's step, which reads EXECUTION's FUSE_CHUNKS, CHUNK_BN, AUG_ON_DEVICE
    image_modules = ("F",)  # the modules fed images (EXECUTION.CHANNELS_LAST converts them)

    @property
    def scaler(self):
        """fp16's GradScaler, where the step has one (its state goes into each checkpoint)."""
        return self.strategy.scaler

    @classmethod
    def refuse_under_torchrun(cls, name: str) -> None:
        """Under torchrun, one line where the method cannot run on several processes (train.py asks
        before joining the group, so every rank stops before its first collective). Every rank may."""

    def check_domains_named(self) -> None:
        """A method with an output per source domain needs the items' domains to be the named ones:
        a WILDS split is one named source of many metadata domains (data/items.named_domain), whose
        numbers would index past its outputs (Dassl's CrossGrad and DDAIG stop there in a traceback)."""
        held = 1 + max((it.domain for it in self.splits["train_x"]), default=0)
        if self.per_source_domain and held > len(self.sources):
            raise DAELConfigError(
                f"{self.cfg.TRAINER.NAME} learns one output per source domain, and {self.cfg.DATASET.NAME}'s one source "
                f"domain {self.sources} holds {held} domains of its metadata: train a method without per-domain "
                "outputs on it (Vanilla, DomainMix), or name those domains with --source-domains (data/wilds_formats.py)"
            )

    # -- to override ----------------------------------------------------
    def check_cfg(self) -> None:
        cfg, name = self.cfg, self.cfg.TRAINER.NAME
        check_transform_names(cfg.INPUT.TRANSFORMS, "INPUT.TRANSFORMS")
        k, views = self.k_transforms, int(cfg.DATALOADER.K_TRANSFORMS)
        if views != k:
            raise DAELConfigError(
                f"DATALOADER.K_TRANSFORMS={views}: {name} takes {k}, not {views} (views per image: SE and CDAC "
                f"take 2); set it to {k}"
            )
        if cfg.MODEL.INIT_WEIGHTS and not self.reads_init_weights:
            raise DAELConfigError(
                f"MODEL.INIT_WEIGHTS {cfg.MODEL.INIT_WEIGHTS}: {name} does not read it on either engine (neither "
                "does Dassl's: it builds its own modules); remove it, start the backbone from a file with "
                "MODEL.BACKBONE.WEIGHTS, or use SourceOnly, DANN, SE, ADDA or AdaBN, which start from it"
            )

    def build_hooks(self) -> List[Optional[hooks.HookBase]]:
        """What runs around the epochs; after each, in this order (engine/hooks.py): the
        schedulers, the divergence check, --eval-each-epoch, the epoch's record, then the "last"
        checkpoint (``self.checkpointer``, which resume reads). None: left out."""
        self.checkpointer = LastCheckpoint(every=int(self.cfg.TRAIN.CHECKPOINT_FREQ), epoch_files=True)
        return [
            StepSchedulers(),
            DivergenceCheck(),
            EvalEachEpoch() if self.eval_each_epoch and not self.cfg.TEST.NO_TEST else None,
            EpochRecords(self.selection) if self.selection is not None else None,
            self.checkpointer,
        ]

    def build_loaders(self) -> None:
        raise NotImplementedError

    def build_model(self) -> Dict[str, nn.Module]:
        raise NotImplementedError

    def prepare_model(self) -> None:
        """Changes to the model on its device, before the optimiser exists (``EXECUTION``'s layout
        and compilation follow, engine/strategy.py; DAEL's step makes its own)."""

    def build_backbone(self) -> nn.Module:
        """``MODEL.BACKBONE`` (name, pretrained weights or a local file) for images of ``INPUT.SIZE``."""
        b = self.cfg.MODEL.BACKBONE
        size = tuple(int(v) for v in self.cfg.INPUT.SIZE)
        return self.backbones(b.NAME, pretrained=b.PRETRAINED, weights_file=b.WEIGHTS, img_size=size)

    def build_optimizers(self) -> Dict[str, torch.optim.Optimizer]:
        """The optimisers by name, each over its modules, from ``OPTIM`` (a scheduler each): one
        over every module by default; Dassl's baselines give one per module, as Dassl does."""
        return {"all": self._build_optim(self.modules.parameters())}

    def build_step(self) -> None:
        """Whatever the training step needs beyond the model and optimiser."""

    def forward_backward(self, batch_x: dict, batch_u: Optional[dict]) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def predict_experts(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, K, C)`` class probabilities of each expert (K=1 for a single classifier)."""
        raise NotImplementedError

    @property
    def num_experts(self) -> int:
        """K of :meth:`predict_experts`: 1 for a single classifier."""
        return 1

    def features_and_experts(self, x: torch.Tensor):
        """The backbone's features ``(B, D)`` and :meth:`predict_experts` (the records' validators)."""
        raise NotImplementedError

    # -- model selection: the source validation split and the per-epoch records ----------
    def _source_val_split(self) -> None:
        """With records on (``SELECTION.EVAL_FREQ``), the sources' validation split: the dataset's
        own, or a stratified held-out part of each source's train split, never trained on
        (engine/selection.split_sources, shared with the Dassl engine)."""
        train, held, info, self.eval_freq = split_sources(
            self.cfg.get("SELECTION", None),
            self.splits["train_x"],
            sources_val(self.cfg.DATASET.NAME, self.splits["val"]),
            self.seed,
            self.sources,
            self.cfg.DATASET.ROOT,
        )
        if len(train) != len(self.splits["train_x"]):
            self.splits = dict(self.splits, train_x=train)
        self.source_val_items, self.source_val_info = held, info

    def _build_selection(self):
        sel = self.cfg.get("SELECTION", None)
        if self.eval_freq <= 0:
            return None
        cap = int(sel.TARGET_CAP)
        loaders = record_loaders(
            self._test_loader,
            self.source_val_items,
            self.splits["train_x"],
            self.splits["train_u"] if self.has_target_train else None,
            self.test_loader,
            cap,
            self.seed,
            own_val(self.cfg.DATASET.NAME, self.splits["val"]),
        )
        model = EvaluatedModel(
            self.features_and_experts,
            self.device,
            loaders,
            self.modules.eval,
            self._save_best,
            self.bad_images,
            self.ensemble_mask,
        )
        return Selection.from_cfg(
            self.cfg, self.eval_freq, self.num_classes, self.pseudo_label_threshold, self.is_da, model
        )

    def _save_best(self, path: str) -> None:
        ckpt.save_checkpoint(ckpt.model_state(self.run_state(self.epoch + 1)), path)

    # -- shared machinery ------------------------------------------------
    def _test_loader(self, items):
        c = self.cfg.DATALOADER
        return loaders.test_loader(
            items,
            build_test_transform(self.cfg),
            c.TEST.BATCH_SIZE,
            c.NUM_WORKERS,
            self.pin,
            indices=distributed.test_indices(len(items)) if self.world.distributed else None,
        )

    def _shard_loaders(self) -> None:
        """In a distributed run each process takes its share of every chunk of every batch."""
        if self.world.distributed:
            for loader in self._loaders():
                loader.batch_sampler.set_shard(self.world.rank, self.world.size)

    def _x_loader(self, transforms):
        """The source loader: ``DATALOADER.TRAIN_X``'s sampler (Dassl's epoch under Dassl's names)."""
        c = self.cfg.DATALOADER
        x = c.TRAIN_X
        return loaders.train_loader(
            self.splits["train_x"],
            transforms,
            x.BATCH_SIZE,
            c.NUM_WORKERS,
            self.pin,
            self.seed,
            sampler=x.SAMPLER,
            n_domain=x.N_DOMAIN,
            names=self._domain_names(),
        )

    def _u_loader(self, transforms):
        c = self.cfg.DATALOADER
        bs = c.TRAIN_X.BATCH_SIZE if c.TRAIN_U.SAME_AS_X else c.TRAIN_U.BATCH_SIZE
        return loaders.train_loader(self.splits["train_u"], transforms, bs, c.NUM_WORKERS, self.pin, self.seed)

    def _domain_names(self) -> List[str]:
        """Each source item's domain number's name for the log: the run's source domain, or, under one
        named source of many metadata domains (WILDS's ``train``), ``train's metadata domain 2``."""
        if len(self.sources) > 1:
            return [str(s) for s in self.sources]
        held = 1 + max((it.domain for it in self.splits["train_x"]), default=0)
        return (
            [str(self.sources[0])] if held == 1 else [f"{self.sources[0]}'s metadata domain {d}" for d in range(held)]
        )

    def _warn_small_domains(self, loader) -> None:
        sampler, names = loader.batch_sampler, self._domain_names()
        for d, n in sampler.small_domains():
            print(
                f"warning: source domain {names[d]!r} has {n} training images, fewer than its "
                f"per-batch share of {sampler.per_domain}; its images repeat within each batch"
            )

    def _build_optim(self, params):
        return self.strategy.optimizer(make_optimizer(self.cfg.OPTIM, params))  # EXECUTION.FUSED_OPTIM

    def build_scheduler(self, optim):
        """The learning-rate scheduler of one optimiser, from ``OPTIM`` (Dassl's names; stepped after
        each epoch through :meth:`schedulers`): a method with its own schedule (CDAC) returns its own."""
        o = self.cfg.OPTIM
        if o.LR_SCHEDULER == "cosine":
            return torch.optim.lr_scheduler.CosineAnnealingLR(optim, float(o.MAX_EPOCH))
        steps = list(o.STEPSIZE) if isinstance(o.STEPSIZE, (list, tuple)) else [o.STEPSIZE]
        if o.LR_SCHEDULER == "single_step":
            step = steps[-1] if steps[-1] > 0 else o.MAX_EPOCH
            return torch.optim.lr_scheduler.StepLR(optim, step_size=step, gamma=o.GAMMA)
        return torch.optim.lr_scheduler.MultiStepLR(optim, milestones=steps, gamma=o.GAMMA)

    def _summary(self) -> None:
        s = self.splits
        setting = "DA" if self.is_da else "DG"
        print(
            f"Dataset: {self.cfg.DATASET.NAME} | source {self.sources} | target {list(self.cfg.DATASET.TARGET_DOMAINS)}"
        )
        print(
            f"# classes {self.num_classes} | # train_x {len(s['train_x']):,} | "
            f"# train_u {len(s['train_u']) if s['train_u'] else 0:,} | # val {len(s['val']) if s['val'] else 0:,} | "
            f"# test {len(s['test']):,} | setting {setting} | device {self.device}"
        )
        if self.has_target_train and not self.is_da:
            print(f"{self.cfg.TRAINER.NAME} runs domain generalisation: the target train split is unused")
        n_params = sum(p.numel() for p in self.modules.parameters())
        print(f"Model: {self.cfg.MODEL.BACKBONE.NAME} | # params {n_params:,}")

    # -- what the hooks read (engine/hooks.py) ---------------------------------
    def trained_modules(self):
        return [self.modules]

    def schedulers(self):
        """The schedulers ``StepSchedulers`` steps after each epoch (none where nothing optimises, or
        where the method steps its own after each step)."""
        return self.scheds.values() if self.optimises else ()

    resume_keys = ("model", "data")

    def run_state(self, epochs_done: int, rng_ranks: Optional[list] = None) -> dict:
        return ckpt.run_state(
            self.run_id(),
            epochs_done,
            self.bad_images,
            self._data_state(epochs_done),
            self.scaler,
            rng_ranks,
            model=self.modules.state_dict(),
            **self._optim_state(),
        )

    def run_id(self) -> ckpt.RunId:
        return ckpt.RunId(self.engine, self.cfg, self.classnames, self._train_counts(), self.data_fingerprint)

    def _optim_state(self) -> dict:
        """One optimiser: ``optim`` and ``sched``, as every checkpoint before several optimisers
        had; several (Dassl's baselines): ``optims`` and ``scheds`` by name, as the Dassl engine."""
        if len(self.optims) == 1:
            return {"optim": self.optim.state_dict(), "sched": ckpt.sched_state(self.sched)}
        return {
            "optims": {n: o.state_dict() for n, o in self.optims.items()},
            "scheds": {n: ckpt.sched_state(s) for n, s in self.scheds.items()},
        }

    def _load_optim_state(self, state: dict) -> None:
        if len(self.optims) == 1:
            self.optim.load_state_dict(state["optim"])
            ckpt.load_sched_state(self.sched, state["sched"])
            return
        for name, optim in self.optims.items():
            optim.load_state_dict(state["optims"][name])
            ckpt.load_sched_state(self.scheds[name], state["scheds"][name])

    def _train_counts(self) -> Dict[str, int]:
        u = self.splits["train_u"] if self.is_da else None
        return ckpt.train_counts(
            self.sources,
            (it.domain for it in self.splits["train_x"]),
            self.cfg.DATASET.TARGET_DOMAINS,
            len(u) if u is not None else None,
        )

    def _loaders(self):
        return [ld for ld in (self.train_loader_x, self.train_loader_u) if ld is not None]

    def _data_state(self, epochs_done: int) -> dict:
        """The samplers' (seed, next epoch) and the loaders' generators. Every draw is
        derived from these, so they are all the data pipeline's randomness."""
        return {
            "sampler_seed": self.seed,
            "next_epoch": epochs_done,
            "loader_generators": [ld.generator.get_state() for ld in self._loaders()],
        }

    def load_run_state(self, state: dict) -> None:
        self.modules.load_state_dict(state["model"])
        self._load_optim_state(state)
        for loader, gen in zip(self._loaders(), state["data"]["loader_generators"]):
            loader.generator.set_state(gen)

    def resume_if_exists(self) -> int:
        directory = self.cfg.RESUME or self.cfg.OUTPUT_DIR
        done = self.checkpointer.resume(directory)
        if done is not None:
            return done
        if self.cfg.RESUME:
            raise DAELConfigError(f"--resume {directory}: no {CKPT} there; give the OUTPUT_DIR of an earlier run")
        print("No checkpoint found, train from scratch")
        return 0

    def saved_model(self, state: dict, path: str) -> dict:
        """The weights of a loaded checkpoint ``state`` (read from ``path``), by module-prefixed name."""
        if "model" not in state:
            raise ckpt.CheckpointError(
                f"{path} is not a checkpoint of dael-plugin's built-in engine; evaluate it with --engine dassl"
            )
        return dict(state["model"])

    def load_model(self, directory: str, epoch: Optional[int] = None, name: Optional[str] = None) -> int:
        """Load weights for evaluation (the last checkpoint, epoch ``epoch``'s or the file ``name``,
        e.g. a protocol's ``model-best-<protocol>.pth.tar``); returns its completed-epoch count."""
        name = name or (CKPT if epoch is None else f"model.pth.tar-{epoch}")
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise DAELConfigError(f"no checkpoint {path}; pass --model-dir <OUTPUT_DIR of a run> (and --load-epoch N)")
        state = ckpt.load_checkpoint(path)
        model = self.saved_model(state, path)
        order = ckpt.check_loaded_run(state, self.cfg, path, self.engine, self.classnames)
        if order is not None:  # the experts of this run's sources, by name
            heads = ckpt.reorder_experts({k[2:]: v for k, v in model.items() if k.startswith("E.")}, order)
            model.update({f"E.{k}": v for k, v in heads.items()})
        ckpt.load_weights(self.modules, model, path)
        self.loaded_epoch = int(state.get("epoch", 0))
        print(f"Loaded {path} (epoch {self.loaded_epoch})")
        return self.loaded_epoch

    # -- the loop ----------------------------------------------------------
    def eval_split_each_epoch(self) -> str:
        return "val" if self.val_loader is not None else "test"

    def train(self) -> None:
        cfg = self.cfg
        self.start_epoch = self.resume_if_exists()
        self.writer = SummaryWriter(os.path.join(cfg.OUTPUT_DIR, "tensorboard")) if self.world.is_main else None
        hooks.run(self.hooks, "before_train")
        self._run_start, self._batches_run = time.time(), 0
        for self.epoch in range(self.start_epoch, cfg.OPTIM.MAX_EPOCH):
            self.run_epoch()
            hooks.run(self.hooks, "after_epoch")
        hooks.run(self.hooks, "after_train")
        end_sync_batch_norm(self.modules)
        print("Finish training")
        if not cfg.TEST.NO_TEST:
            print("Deploy the last-epoch model")
            self.test()
        # As Dassl's after_train: the wall time of this process's part of the run.
        print(f"Elapsed: {datetime.timedelta(seconds=round(time.time() - self._run_start))}")
        if self.writer is not None:
            self.writer.close()

    def _batches(self):
        """This epoch's ``(batch_x, batch_u)`` pairs; ``self.num_batches`` says how many
        (``TRAIN.COUNT_ITER``, as Dassl's epoch counts them: engine/loop.epoch_batches)."""
        loaders = (self.train_loader_x, self.train_loader_u)
        self.num_batches, batches = epoch_batches(loaders, self.epoch, self.cfg.TRAIN.COUNT_ITER)
        return batches

    def run_epoch(self, log: Optional[EpochLog] = None) -> None:
        """One epoch, on either engine: ``TRAIN.COUNT_ITER``'s batches, the step of each, and what
        ``log`` prints and writes around them (:class:`ProgressLog`: the built-in engine's bar and
        lines; the Dassl engine gives Dassl's, dassl_adapter/method_trainer.py)."""
        self.modules.train()
        pairs = self._batches()
        log = log or ProgressLog(self)
        log.start(self.num_batches)

        def batches():
            # Dassl's names: a trainer whose update depends on the run's step (DANN's reversal
            # weight, SE's EMA rate) reads self.epoch * self.num_batches + self.batch_idx
            for self.batch_idx, (batch_x, batch_u) in enumerate(pairs):
                note_bad(self.bad_images, batch_x, batch_u)
                log.fetched()
                yield batch_x, batch_u
                self._batches_run += 1
                log.stepped()

        def diverged(done: int) -> Exception:
            log.close()
            return divergence_error(self.epoch + 1, done, self.cfg.OPTIM.LR, self.cfg.OUTPUT_DIR)

        freq = self.cfg.TRAIN.PRINT_FREQ
        log.end(train_epoch(batches(), self.num_batches, self.forward_backward, self.guard, freq, log.report, diverged))

    def _write(self, tag: str, value: float) -> None:
        if self.writer is not None:
            self.writer.add_scalar(tag, value, self.epoch)

    @torch.no_grad()
    def test(self, split: Optional[str] = None) -> float:
        self.modules.eval()
        split, loader = pick_eval_split(split or self.cfg.TEST.SPLIT, self.val_loader, self.test_loader)
        print(f"Evaluate on the *{split}* set")

        tally, skipped = evaluate_experts(
            self.predict_experts, loader, self.device, self.bad_images, show_progress(), self.ensemble_mask
        )
        if tally.total == 0:
            raise DAELConfigError(
                f"no readable image in the {split} split; run with --check-data to list the bad files"
            )
        yt, yp = (t.numpy() for t in tally.labels())  # Dassl's evaluator's lines, without Dassl
        test = self.cfg.TEST
        results, lines = classification_results(yt, yp, self.classnames, bool(test.PER_CLASS_RESULT))
        print("\n".join(lines))
        acc = results["accuracy"]
        self.mean_class_accuracy, self.macro_f1 = mean_class_accuracy(yt, yp), results["macro_f1"]
        ordered = tally.in_item_order(len(self.splits[split] or ()))
        self.wilds_metrics = report_official(self.cfg.DATASET.NAME, self.cfg.DATASET.ROOT, split, ordered)
        if test.COMPUTE_CMAT and self.world.is_main:
            print(f"Confusion matrix is saved to {save_confusion_matrix(yt, yp, self.cfg.OUTPUT_DIR)}")
        if "perclass_accuracy" in results:
            self._write(f"{split}/perclass_accuracy", results["perclass_accuracy"])
        if skipped:
            print(f"* unreadable images left out: {skipped}")
        names = self.sources if self.num_experts > 1 else []
        self.per_class_accuracy, self.expert_accuracy = report_experts(
            tally, self.classnames, names, self._write, split
        )
        self._write(f"{split}/accuracy", acc)
        self.last_accuracy = acc
        return acc
