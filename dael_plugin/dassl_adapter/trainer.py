"""DAEL as a Dassl trainer: a thin adapter over ``dael_plugin.core``.

One class serves ``--trainer DAEL`` and ``--trainer DAELDG``. ``DAEL`` runs
domain adaptation when the dataset gives unlabeled target data
(``train_u``) and domain generalisation otherwise; ``DAELDG`` always runs
domain generalisation and never reads target training data.

On top of Dassl's loop it adds what long runs need: a "last" checkpoint
after every epoch with the RNG states and the config (exact resume), loads
with ``weights_only=True``, a divergence check read only at ``PRINT_FREQ``
and at the end of an epoch, and unreadable images replaced by path.

Long because it is the one Dassl trainer class, whose methods are Dassl's hooks (data loaders,
model, epoch, checkpoints, test), each overridden where Dassl's own would be wrong or slow; the
shared logic they call is in engine/.
"""

from __future__ import annotations

import datetime
import os.path as osp
import time
from typing import List, Optional, Set

import torch
from dassl.data import DataManager
from dassl.engine import TrainerXU
from dassl.engine.trainer import SimpleNet
from dassl.optim import build_lr_scheduler, build_optimizer
from dassl.utils import AverageMeter, count_num_param
from torch.utils.data import DataLoader
from yacs.config import CfgNode as CN

from dael_plugin.config import (
    check_dael_cfg,
    execution_from_cfg,
    hparams_from_cfg,
    trainer_node,
)
from dael_plugin.core import DAEL, build_heads
from dael_plugin.dassl_adapter.checks import check_dataset_cfg
from dael_plugin.dassl_adapter.evaluate import dassl_test
from dael_plugin.dassl_adapter.records import build_selection, source_val_split
from dael_plugin.dassl_adapter.robust_data import RobustDatasetWrapper
from dael_plugin.data.classes import classes_by_domain, say_class_table
from dael_plugin.data.fingerprint import dataset_fingerprint
from dael_plugin.data.loaders import seeded_loader, train_batches
from dael_plugin.engine import checkpoint as ckpt
from dael_plugin.engine import distributed, hooks
from dael_plugin.engine.execution import cuda_settings
from dael_plugin.engine.guard import FiniteGuard, divergence_error
from dael_plugin.engine.hooks import DivergenceCheck, EpochRecords, HookBase, LastCheckpoint, StepSchedulers
from dael_plugin.engine.loop import (
    end_sync_batch_norm,
    local_share,
    next_cycled,
    note_bad,
    sync_batch_norm,
    train_epoch,
)
from dael_plugin.engine.results import TrainerFacts
from dael_plugin.engine.step import DeviceMeters, format_meters, make_step, prepare_model
from dael_plugin.engine.strategy import Strategy
from dael_plugin.errors import DAELConfigError
from dael_plugin.transforms.host import build_train_views, check_transform_names

__all__ = ["DAELTrainer", "load_dassl_checkpoints"]


class DAELTrainer(TrainerFacts, TrainerXU):
    """Domain Adaptive Ensemble Learning (Zhou et al.), on Dassl's machinery."""

    replaced_builtins: tuple = ()  # Dassl's own trainers this class replaced (set by register_into_dassl())
    own_records = True  # writes its own records (records.with_records leaves it as it is)

    @property
    def uses_target(self) -> bool:
        """A DA method, whose run is DA where the data has a target train split: DAEL; DAELDG never
        uses target data (Dassl's is a ``TrainerX``). The built-in engine's DAEL says the same."""
        return str(self.cfg.TRAINER.NAME).upper() != "DAELDG"

    def __init__(self, cfg: CN):
        if self.replaced_builtins:
            print(
                f"dael_plugin: this run uses dael_plugin's DAELTrainer, which replaced Dassl's built-in "
                f"trainer(s) {list(self.replaced_builtins)}"
            )
        self.hparams = hparams_from_cfg(cfg)
        self.execution = execution_from_cfg(cfg)
        self.guard = FiniteGuard()
        self.bad_images: Set[str] = set()
        self.checkpointer = LastCheckpoint()  # Dassl's before_train resumes from it (resume_model_if_exist)
        cuda_settings(cfg)  # also under Dassl's own tools/train.py
        super().__init__(cfg)
        self.expert_accuracy: List[float] = []
        self.selection = self._build_selection()
        # After each epoch, in this order (engine/hooks.py, as the built-in engine's trainer): the
        # divergence check, the schedulers, Dassl's own after_epoch (its evaluation and epoch
        # files), the epoch's record, then the "last" checkpoint
        self.hooks = hooks.bind(
            self,
            [
                DivergenceCheck(),
                StepSchedulers(),
                DasslsAfterEpoch(),
                EpochRecords(self.selection) if self.selection is not None else None,
                self.checkpointer,
            ],
        )

    def check_cfg(self, cfg: CN):
        check_dael_cfg(cfg)
        check_dataset_cfg(cfg)
        node = trainer_node(cfg)
        name = str(cfg.TRAINER.NAME).upper()
        check_transform_names(cfg.INPUT.TRANSFORMS, "INPUT.TRANSFORMS")
        check_transform_names(node.STRONG_TRANSFORMS, f"TRAINER.{name}.STRONG_TRANSFORMS")

    def build_data_loader(self):
        cfg = self.cfg
        node = trainer_node(cfg)
        views = build_train_views(cfg, node, self.hparams.num_views, self.execution.aug_on_device)
        # Dassl's DataManager builds its own source loader, which this trainer replaces below; built
        # with Dassl's domain sampler it would stop a source domain smaller than its share of a batch
        # with "Sample larger than population" before the plugin's sampler can say so in one line.
        dm_cfg = cfg.clone()
        dm_cfg.defrost()
        dm_cfg.DATALOADER.TRAIN_X.SAMPLER = "RandomSampler"
        dm = DataManager(dm_cfg, custom_tfm_train=views, dataset_wrapper=RobustDatasetWrapper)
        self.data_fingerprint = dataset_fingerprint(cfg, dm.dataset)  # before the held-out split, as builtin
        distributed.check_same_run(cfg, self.data_fingerprint)  # every rank: rank 0's settings and data
        self._source_val_split(dm.dataset)
        # Training loaders with Dassl's epochs but per-draw seeding and long-lived workers.
        has_target = dm.train_loader_u is not None
        self.is_da = has_target and self.uses_target
        self.data_seed = int(cfg.SEED) if cfg.SEED >= 0 else int(torch.randint(2**62, (1,)))
        self.train_loader_x = self._train_loader(dm.dataset.train_x, views, domains=True)
        # DG on a DA dataset keeps Dassl's target loader, which it never iterates.
        self.train_loader_u = (
            self._train_loader(dm.dataset.train_u, views, domains=False) if self.is_da else dm.train_loader_u
        )
        self.val_loader = _shard_test(dm.val_loader)
        self.test_loader = _shard_test(dm.test_loader)
        w = distributed.world()
        if w.distributed:  # each process takes its share of every chunk of every batch
            for loader in self._seeded_loaders():
                loader.batch_sampler.set_shard(w.rank, w.size)
        self.num_classes = dm.num_classes
        self.num_source_domains = dm.num_source_domains
        # which classes each source holds (DATASET.CATEGORY_SHIFT: they may differ; else all of them)
        self.classes_held = classes_by_domain(dm.dataset.train_x, self.num_source_domains, self.num_classes)
        self.lab2cname = dm.lab2cname
        if bool(cfg.DATASET.get("CATEGORY_SHIFT", False)) and distributed.world().is_main:
            say_class_table(self.classes_held, cfg.DATASET.SOURCE_DOMAINS, self._classnames())
        self.dm = dm
        print(f"DAEL setting: {'domain adaptation (L_u on)' if self.is_da else 'domain generalisation (no L_u)'}")
        if has_target and not self.is_da:
            print(f"{cfg.TRAINER.NAME} runs domain generalisation: the target train split is unused")

    # -- model selection: the source validation split and the per-epoch records ----------
    def _source_val_split(self, dataset) -> None:
        """With records on (``SELECTION.EVAL_FREQ``): dassl_adapter/records.py."""
        source_val_split(self, dataset)

    def _build_selection(self):
        return build_selection(
            self, self.algorithm.features_and_experts, self.is_da, self.hparams.conf_thre, self._save_best
        )

    def _save_best(self, path: str) -> None:
        ckpt.save_checkpoint(ckpt.model_state(self.run_state(self.epoch + 1)), path)

    def before_train(self):
        super().before_train()  # Dassl's: the resume (resume_model_if_exist), the writer, the clock
        hooks.run(self.hooks, "before_train")

    def _train_loader(self, data_source, views, domains: bool) -> DataLoader:
        """Dassl's training loader with the built-in engine's seeded batches (Dassl's
        ``RandomDomainSampler`` epochs for the sources) and long-lived workers
        (data/loaders.seeded_loader), over Dassl's items and dataset wrapper."""
        c = self.cfg.DATALOADER
        x = c.TRAIN_X
        batch = x.BATCH_SIZE if domains or c.TRAIN_U.SAME_AS_X else c.TRAIN_U.BATCH_SIZE
        sampler = x.SAMPLER if domains else ""
        batches = train_batches([d.domain for d in data_source], batch, self.data_seed, sampler, x.N_DOMAIN)
        data = RobustDatasetWrapper(self.cfg, data_source, transform=views, is_train=True)
        return seeded_loader(
            data, batches, c.NUM_WORKERS, torch.cuda.is_available() and self.cfg.USE_CUDA, self.data_seed
        )

    def _seeded_loaders(self) -> List[DataLoader]:
        return [self.train_loader_x] + ([self.train_loader_u] if self.is_da else [])

    def _set_epoch(self) -> None:
        for loader in self._seeded_loaders():
            loader.batch_sampler.set_epoch(self.epoch)

    def build_model(self):
        from dael_plugin.dassl_adapter.backbones import register_timm_backbone

        cfg = self.cfg
        # The config is at hand here, so a timm backbone's local weights are honoured
        # even when Dassl's own tools/train.py built this trainer.
        register_timm_backbone(
            cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.get("WEIGHTS", ""), tuple(int(v) for v in cfg.INPUT.SIZE)
        )
        print("Building F")
        self.F = SimpleNet(cfg, cfg.MODEL, 0)
        self.F.to(self.device)
        print(f"# params: {count_num_param(self.F):,}")
        self.strategy = Strategy(self.execution, self.device)  # EXECUTION.* (engine/strategy.py)
        prepare_model(self.strategy, self.F, cfg)
        fuse_optim = self.strategy.optimizer  # FUSED_OPTIM: PyTorch's fused kernels, where it has them
        self.optim_F = fuse_optim(build_optimizer(self.F, cfg.OPTIM))
        self.sched_F = build_lr_scheduler(self.optim_F, cfg.OPTIM)
        self.register_model("F", self.F, self.optim_F, self.sched_F)

        print("Building E")
        self.E = build_heads(self.F.fdim, self.num_classes, self.num_source_domains, self.hparams)
        self.E.to(self.device)
        print(f"# params: {count_num_param(self.E):,}")
        sync_batch_norm(self.F)  # under torchrun: statistics over every shard, per domain chunk
        self.optim_E = fuse_optim(build_optimizer(self.E, *_expert_optim_args(self.E, cfg.OPTIM)))
        self.sched_E = build_lr_scheduler(self.optim_E, cfg.OPTIM)
        self.register_model("E", self.E, self.optim_E, self.sched_E)
        e = self.execution
        mask = torch.tensor(self.classes_held, device=self.device) if self.hparams.reads_class_table else None
        self.algorithm = DAEL(
            self.F, self.E, self.hparams, fuse_chunks=e.fuse_chunks, chunk_bn=e.chunk_bn, class_mask=mask
        )
        self.step = make_step(
            self.strategy,
            self.algorithm,
            [self.optim_F, self.optim_E],
            self.num_source_domains,
            self.split_batch_size(),
            self.is_da,
            self.guard,
            cfg,
        )

    def split_batch_size(self) -> int:
        """Images per domain chunk in this process's share of a batch (all of it in one process)."""
        n_domain = self.cfg.DATALOADER.TRAIN_X.N_DOMAIN
        return local_share(
            self.cfg.DATALOADER.TRAIN_X.BATCH_SIZE // (n_domain if n_domain > 0 else self.num_source_domains)
        )

    # -- a distributed run: rank 0 alone writes ---------------------------------
    def init_writer(self, log_dir):
        if distributed.world().is_main:
            super().init_writer(log_dir)

    def save_model(self, epoch, directory, is_best=False, val_result=None, model_name=""):
        if distributed.world().is_main:
            super().save_model(epoch, directory, is_best=is_best, val_result=val_result, model_name=model_name)
        distributed.barrier()  # a "best" model is read back by every process after training

    def run_epoch(self):
        """Dassl's ``TrainerXU``/``TrainerX`` epoch with the meters on the device.

        Dassl's ``MetricMeter`` reads every loss on the host after every step,
        which makes the host wait for the device each step. Here the running
        sums stay on the device and are read (with the divergence flag) only at
        ``PRINT_FREQ``, where the log line, in Dassl's format, and the
        TensorBoard scalars are written.
        """
        self.set_model_mode("train")
        self._set_epoch()
        batch_time, data_time = AverageMeter(), AverageMeter()
        n_x = len(self.train_loader_x)
        if self.is_da:
            n_u = len(self.train_loader_u)
            count = self.cfg.TRAIN.COUNT_ITER
            self.num_batches = {"train_x": n_x, "train_u": n_u, "smaller_one": min(n_x, n_u)}[count]
        else:
            self.num_batches = n_x
        it_x = iter(self.train_loader_x)
        it_u = iter(self.train_loader_u) if self.is_da else None
        freq = self.cfg.TRAIN.PRINT_FREQ
        clock = {"end": time.time()}

        def batches():
            nonlocal it_x, it_u
            for self.batch_idx in range(self.num_batches):
                batch_x, it_x = next_cycled(it_x, self.train_loader_x)
                batch_u = None
                if it_u is not None:
                    batch_u, it_u = next_cycled(it_u, self.train_loader_u)
                data_time.update(time.time() - clock["end"])
                yield batch_x, batch_u
                clock["end"] = time.time()

        def step(batch_x, batch_u):
            out = self.forward_backward(batch_x, batch_u)
            batch_time.update(time.time() - clock["end"])
            return out

        def report(i: int, meters: DeviceMeters) -> None:
            if (i + 1) % freq and self.num_batches >= freq:
                return  # Dassl's lines: every PRINT_FREQ batches, or every batch of a short epoch
            last, avg = meters.read()
            remain = self.num_batches - i - 1 + (self.max_epoch - self.epoch - 1) * self.num_batches
            eta = datetime.timedelta(seconds=int(batch_time.avg * remain))
            print(
                f"epoch [{self.epoch + 1}/{self.max_epoch}] batch [{i + 1}/{self.num_batches}] "
                f"time {batch_time.val:.3f} ({batch_time.avg:.3f}) data {data_time.val:.3f} "
                f"({data_time.avg:.3f}) {format_meters(avg, last)} lr {self.get_current_lr():.4e} eta {eta}"
            )
            n_iter = self.epoch * self.num_batches + i
            for k, v in avg.items():
                self.write_scalar("train/" + k, v, n_iter)
            self.write_scalar("train/lr", self.get_current_lr(), n_iter)

        def diverged(done: int) -> Exception:
            return divergence_error(self.epoch + 1, done, self.cfg.OPTIM.LR, self.output_dir)

        train_epoch(batches(), self.num_batches, step, self.guard, freq, report, diverged)

    def forward_backward(self, batch_x, batch_u: Optional[dict] = None):
        note_bad(self.bad_images, batch_x, batch_u)
        return self.step(batch_x, batch_u if self.is_da else None)

    def detect_anomaly(self, loss):
        # Dassl's check syncs the host every step and raises a bare RuntimeError;
        # FiniteGuard flags it on the device and is read at PRINT_FREQ instead.
        pass

    def after_epoch(self):
        hooks.run(self.hooks, "after_epoch")

    # -- what the hooks read (engine/hooks.py) ---------------------------------
    def trained_modules(self):
        return self._models.values()

    def schedulers(self):
        return [s for s in self._scheds.values() if s is not None]

    resume_keys = ("models",)

    def run_state(self, epochs_done: int, rng_ranks: Optional[list] = None) -> dict:
        names = self.get_model_names()
        return ckpt.run_state(
            self.run_id(),
            epochs_done,
            self.bad_images,
            {"sampler_seed": self.data_seed, "next_epoch": epochs_done},
            self.strategy.scaler,
            rng_ranks,
            models={n: self._models[n].state_dict() for n in names},
            optims={n: self._optims[n].state_dict() for n in names if self._optims[n] is not None},
            scheds={n: ckpt.sched_state(self._scheds[n]) for n in names if self._scheds[n] is not None},
        )

    def run_id(self) -> ckpt.RunId:
        return ckpt.RunId("dassl", self.cfg, self._classnames(), self._train_counts(), self.data_fingerprint)

    def load_run_state(self, state: dict) -> None:
        for name in self.get_model_names():
            self._models[name].load_state_dict(state["models"][name])
            if name in state.get("optims", {}):
                self._optims[name].load_state_dict(state["optims"][name])
            if name in state.get("scheds", {}):
                ckpt.load_sched_state(self._scheds[name], state["scheds"][name])
        if "data" in state:  # the draws continue from the checkpoint's seed
            self.data_seed = int(state["data"]["sampler_seed"])
            for loader in self._seeded_loaders():
                loader.batch_sampler.seed = self.data_seed
                loader.generator.manual_seed(self.data_seed)

    def resume_model_if_exist(self, directory):
        done = self.checkpointer.resume(directory)
        if done is not None:
            return done
        if any(osp.isfile(osp.join(directory, n, "checkpoint")) for n in self.get_model_names()):
            epoch = load_dassl_checkpoints(self, directory, None, resume=True)
            print(
                f"Resuming from Dassl-format checkpoints in {directory} (epoch {epoch}): they hold no RNG "
                "states, so this resume is not bitwise identical to an uninterrupted run"
            )
            return epoch
        return 0

    def _train_counts(self) -> dict:
        data = self.dm.dataset
        return ckpt.train_counts(
            self.cfg.DATASET.SOURCE_DOMAINS,
            (d.domain for d in data.train_x),
            self.cfg.DATASET.TARGET_DOMAINS,
            len(data.train_u) if self.is_da and data.train_u is not None else None,
        )

    def _classnames(self) -> List[str]:
        return [self.lab2cname.get(i, str(i)) for i in range(self.num_classes)]

    def load_model(self, directory, epoch=None, name=None):
        """The last checkpoint, Dassl's epoch ``epoch`` files, or the file ``name`` (a protocol's
        ``model-best-<protocol>.pth.tar``) of ``directory``; returns its epoch count. Called by Dassl's
        ``after_train`` under ``TEST.FINAL_MODEL best_val``: the ``model-best.pth.tar`` files that
        Dassl's ``after_epoch`` saved at the best validation result, as Dassl's own ``load_model``."""
        if self._deploying_best:
            return load_dassl_checkpoints(self, directory)
        path = osp.join(directory, name or ckpt.LAST)
        if name is not None or (epoch is None and osp.isfile(path)):
            state = ckpt.load_checkpoint(path)
            order = ckpt.check_loaded_run(state, self.cfg, path, "dassl", self._classnames())
            if "models" not in state:
                raise ckpt.CheckpointError(
                    f"{path} is not a Dassl-engine checkpoint of dael-plugin; evaluate it with --engine builtin"
                )
            for name in self.get_model_names():
                weights = state["models"].get(name, {})
                weights = ckpt.reorder_experts(weights, order) if name == "E" else weights
                ckpt.load_weights(self._models[name], weights, path, what=f"model {name}")
            print(f"Loaded {path} (epoch {state['epoch']})")
            return int(state["epoch"])
        return load_dassl_checkpoints(self, directory, epoch)

    _deploying_best = False

    def after_train(self):
        end_sync_batch_norm(self.F)  # before Dassl's final test, which uses running statistics
        # Dassl's after_train deploys the best validation model with load_model(OUTPUT_DIR), which
        # without this flag read the last checkpoint: the last epoch's model, under Dassl's line
        # "Deploy the model with the best val performance"
        self._deploying_best = self.cfg.TEST.FINAL_MODEL == "best_val"
        try:
            super().after_train()
        finally:
            self._deploying_best = False

    @property
    def ensemble_mask(self):
        return self.algorithm.ensemble_mask

    @property
    def fast_path_check(self):
        return self.step.fast_path_check

    def model_inference(self, input):
        return self.algorithm.predict(input)

    def test(self, split=None):
        names = list(self.cfg.DATASET.SOURCE_DOMAINS) if self.E.num_experts > 1 else ["single"]
        return dassl_test(self, split, self.algorithm.predict_experts, names)


class DasslsAfterEpoch(HookBase):
    """Dassl's own ``after_epoch``: its evaluation (``TEST.FINAL_MODEL best_val``) and its epoch
    files (``TRAIN.CHECKPOINT_FREQ``), between the plugin's hooks."""

    def after_epoch(self) -> None:
        super(DAELTrainer, self.trainer).after_epoch()


def load_dassl_checkpoints(trainer, directory: str, epoch: Optional[int] = None, resume: bool = False) -> int:
    """Dassl's ``TrainerBase.load_model`` without its crash, with ``weights_only=True``.

    Dassl formats ``val_result`` with ``:.1f``, which fails on checkpoints saved
    with ``val_result=None`` (every run without a validation split, i.e. the
    usual DA and DG runs). The CLI's ``--eval-only`` uses this for any Dassl
    trainer that does not override ``load_model``. Checkpoints of Dassl's own
    DAEL load into the plugin's trainer: its experts are converted as they
    load (``ExpertHeads`` accepts ``linears.<k>.*``). Returns the epoch.
    """
    if not directory:
        raise DAELConfigError("no --model-dir given; pass the OUTPUT_DIR of a run")
    epoch_done = 0
    for name in trainer.get_model_names():
        folder = osp.join(directory, name)
        if resume or epoch is None:
            marker = osp.join(folder, "checkpoint")
            if resume and osp.isfile(marker):
                with open(marker) as f:
                    model_file = f.readline().strip()
            else:
                model_file = "model-best.pth.tar" if osp.isfile(osp.join(folder, "model-best.pth.tar")) else None
                if model_file is None and osp.isfile(marker):
                    with open(marker) as f:
                        model_file = f.readline().strip()
        else:
            model_file = f"model.pth.tar-{epoch}"
        path = osp.join(folder, model_file or "model-best.pth.tar")
        if not osp.exists(path):
            raise DAELConfigError(
                f"no checkpoint {path}; pass --model-dir <OUTPUT_DIR of a run> and --load-epoch <epoch>"
            )
        state = ckpt.load_checkpoint(path)
        ckpt.load_weights(trainer._models[name], state.get("state_dict", {}), path, what=f"model {name}")
        if resume:
            if state.get("optimizer") is not None and trainer._optims[name] is not None:
                trainer._optims[name].load_state_dict(state["optimizer"])
            if state.get("scheduler") is not None and trainer._scheds[name] is not None:
                ckpt.load_sched_state(trainer._scheds[name], state["scheduler"])
        epoch_done = int(state.get("epoch", 0))
        print(f"Load {path} to {name} (epoch={epoch_done}, val_result={state.get('val_result')})")
    return epoch_done


def _expert_optim_args(heads, optim_cfg: CN) -> tuple:
    """``build_optimizer``'s config and parameter groups for the experts, with ``OPTIM.STAGED_LR`` as
    Dassl's DAEL has it. Dassl stages the rates by child module: its experts are the child
    ``linears`` (K linear layers), at ``LR`` where ``OPTIM.NEW_LAYERS`` names it and at
    ``LR * BASE_LR_MULT`` otherwise. ``ExpertHeads`` holds the same weights with no child module,
    which Dassl's staging would leave out of every group (experts that never train)."""
    if not optim_cfg.STAGED_LR:
        return optim_cfg, None
    new = [optim_cfg.NEW_LAYERS] if isinstance(optim_cfg.NEW_LAYERS, str) else list(optim_cfg.NEW_LAYERS)
    lr = optim_cfg.LR if "linears" in new else optim_cfg.LR * optim_cfg.BASE_LR_MULT
    plain = optim_cfg.clone()  # the groups given: Dassl would warn that staged_lr is ignored
    plain.defrost()
    plain.STAGED_LR = False
    return plain, [{"params": list(heads.parameters()), "lr": lr}]


def _shard_test(loader: Optional[DataLoader]) -> Optional[DataLoader]:
    """Dassl's evaluation loader over this process's share of the set, in a distributed run
    (the tallies are gathered after the loop); the loader itself otherwise."""
    w = distributed.world()
    if loader is None or not w.distributed:
        return loader
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=distributed.test_indices(len(loader.dataset)),
        num_workers=loader.num_workers,
        pin_memory=loader.pin_memory,
        drop_last=False,
    )
