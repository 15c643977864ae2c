"""The plugin's methods on the Dassl engine: each method of the plugin's registry that Dassl lacks
(a ``--plugin`` method of the user's own), and DAEL and DAELDG (dassl_adapter/trainer.py, which
builds the model as Dassl's own DAEL does). Dassl's dataset classes read the data
(``DATASET_REGISTRY``, its ``DataManager``), Dassl's ``train()`` drives the epochs (its
``TrainerXU`` epoch: ``TRAIN.COUNT_ITER``, its log line) and Dassl's evaluator scores the test.
Inside, the method object is the one the built-in engine builds (engine/trainer.py, with the items
Dassl read): its step with every ``EXECUTION`` option and its hooks (checkpoint and exact resume,
the per-epoch records), so nothing of the method is written twice. Its backbones are Dassl's,
built as Dassl's ``SimpleNet`` builds them (any name in Dassl's ``BACKBONE_REGISTRY``).

Dassl's own trainers keep their names: a method gets a trainer only under a name Dassl's
``TRAINER_REGISTRY`` does not hold (:func:`register_method_trainers`). Under torchrun each process runs
its share, as on the built-in engine (the method shards the loaders and wraps its modules in DDP).
"""

from __future__ import annotations

import datetime
import time
from typing import Dict, List, Optional

from dassl.config import get_cfg_default
from dassl.data import DataManager
from dassl.engine import TRAINER_REGISTRY, TrainerXU
from dassl.utils import AverageMeter
from yacs.config import CfgNode as CN

from dael_plugin.config.defaults import check_supported_values
from dael_plugin.config.keys import full_keys, key_value
from dael_plugin.dassl_adapter.backbones import build_dassl_backbone
from dael_plugin.dassl_adapter.evaluate import dassl_test
from dael_plugin.data.items import Item
from dael_plugin.engine import distributed, hooks
from dael_plugin.engine.loop import EpochLog, end_sync_batch_norm, note_bad
from dael_plugin.engine.results import TrainerFacts
from dael_plugin.engine.seed import draw_seed
from dael_plugin.engine.step import DeviceMeters, format_meters
from dael_plugin.engine.trainer import set_random_seed
from dael_plugin.errors import DAELConfigError
from dael_plugin.methods import TRAINERS, build_trainer
from dael_plugin.transforms.host import build_test_transform


class MethodTrainerXU(TrainerFacts, TrainerXU):
    """Dassl's ``TrainerXU`` around one of the plugin's methods (``self.method``)."""

    own_records = True  # the method's hooks write them

    def __init__(self, cfg: CN, eval_only: bool = False) -> None:
        self.eval_only = eval_only
        if int(cfg.SEED) < 0:  # Dassl's own tools/train.py leaves SEED -1 unseeded
            cfg = cfg.clone()
            cfg.defrost()
            print(draw_seed(cfg))  # one seed for everything, or the resumed run's, as scripts/train.py
            cfg.freeze()
            set_random_seed(cfg.SEED)
        super().__init__(cfg)  # Dassl's: check_cfg, build_data_loader, build_model, the evaluator

    def check_cfg(self, cfg: CN) -> None:
        check_method_trainer_cfg(cfg)  # train.py checked it before the output folder; Dassl's tools/train.py here

    def build_data_loader(self) -> None:
        # Dassl's DataManager reads the data; the loaders it builds are never iterated (the method's
        # train and test). Its domain sampler would stop a source smaller than its share of a batch
        # before the method's sampler says so in one line, and its training transform would refuse
        # the names Dassl lacks: the method builds its own views.
        dm_cfg = self.cfg.clone()
        dm_cfg.defrost()
        dm_cfg.DATALOADER.TRAIN_X.SAMPLER = "RandomSampler"
        plain = build_test_transform(self.cfg)
        dm = DataManager(dm_cfg, custom_tfm_train=plain)
        self.dm, self.lab2cname = dm, dm.lab2cname
        self.num_classes, self.num_source_domains = dm.num_classes, dm.num_source_domains
        self.method = m = self.build_method(dassl_splits(dm))
        m.engine = "dassl"  # in its checkpoints: resumed and evaluated on this engine
        self.val_loader, self.test_loader = m.val_loader, m.test_loader

    def build_method(self, splits: dict):
        """The method object over Dassl's data, with Dassl's backbones (every name in its
        ``BACKBONE_REGISTRY``, as its ``SimpleNet`` builds them)."""
        return build_trainer(self.cfg, eval_only=self.eval_only, splits=splits, backbones=build_dassl_backbone)

    def build_model(self) -> None:
        m = self.method  # Dassl's set_model_mode, model names, save_model and current rate
        for name, module in m.modules.items():
            self.register_model(name, module, m.optims.get(name), m.scheds.get(name))

    # -- Dassl's train(): the method's own resume, epoch and hooks --------------------------
    def resume_model_if_exist(self, directory: str) -> int:
        return self.method.resume_if_exists()  # the "last" checkpoint of RESUME or OUTPUT_DIR, exact

    def init_writer(self, log_dir: str) -> None:
        if distributed.world().is_main:  # under torchrun rank 0 alone writes
            super().init_writer(log_dir)
        self.method.writer = self._writer  # the method's scalars go to Dassl's TensorBoard writer

    def before_train(self) -> None:
        super().before_train()  # Dassl's: the resume, the writer, the clock
        m = self.method
        m.start_epoch = self.start_epoch
        hooks.run(m.hooks, "before_train")
        m._run_start, m._batches_run = time.time(), 0

    def run_epoch(self) -> None:
        """The method's epoch (``TRAIN.COUNT_ITER``, as Dassl's ``TrainerXU`` counts it), with
        Dassl's log lines (:class:`DasslsLog`)."""
        m = self.method
        m.epoch = self.epoch
        m.run_epoch(DasslsLog(self))
        self.num_batches, self.batch_idx = m.num_batches, m.batch_idx

    # Dassl's names for the loaders (the method's; what wraps them, as the bench's timing, too)
    train_loader_x = property(lambda self: self.method.train_loader_x, lambda self, v: self._set("train_loader_x", v))
    train_loader_u = property(lambda self: self.method.train_loader_u, lambda self, v: self._set("train_loader_u", v))

    def _set(self, name: str, loader) -> None:
        setattr(self.method, name, loader)

    def forward_backward(self, batch_x: dict, batch_u: Optional[dict] = None) -> dict:
        m = self.method
        note_bad(m.bad_images, batch_x, batch_u)
        return m.forward_backward(batch_x, batch_u if m.is_da else None)

    def after_epoch(self) -> None:
        hooks.run(self.method.hooks, "after_epoch")  # schedulers, divergence, records, checkpoint

    def after_train(self) -> None:
        hooks.run(self.method.hooks, "after_train")
        end_sync_batch_norm(self.method.modules)
        super().after_train()  # Dassl's: "Finish training", the last-epoch test, the elapsed time

    def test(self, split: Optional[str] = None) -> float:
        m = self.method
        names = m.sources if m.num_experts > 1 else []
        return dassl_test(self, split, m.predict_experts, names)

    def load_model(self, directory: str, epoch: Optional[int] = None, name: Optional[str] = None) -> int:
        return self.method.load_model(directory, epoch=epoch, name=name)

    # -- what the commands read (engine/results.TrainerFacts): the method's ---------------------
    is_da = property(lambda self: self.method.is_da)
    data_fingerprint = property(lambda self: self.method.data_fingerprint)
    source_val_info = property(lambda self: self.method.source_val_info)
    classes_held = property(lambda self: self.method.classes_held)
    bad_images = property(lambda self: self.method.bad_images)
    ensemble_mask = property(lambda self: self.method.ensemble_mask)
    fast_path_check = property(lambda self: self.method.fast_path_check)


class DasslsLog(EpochLog):
    """Dassl's ``TrainerXU`` lines: every ``PRINT_FREQ`` batches (every batch of a shorter
    epoch), with its batch and data times and its eta at the epoch's pace, and the meters to its
    TensorBoard writer. Dassl's ``MetricMeter`` reads every loss on the host after every step;
    here they are read where a line is printed (engine/loop.train_epoch)."""

    def __init__(self, dassl_trainer: MethodTrainerXU) -> None:
        self.t = dassl_trainer
        self.batch_time, self.data_time, self.last = AverageMeter(), AverageMeter(), time.time()

    def fetched(self) -> None:
        self.data_time.update(time.time() - self.last)

    def stepped(self) -> None:
        self.batch_time.update(time.time() - self.last)
        self.last = time.time()

    def report(self, i: int, meters: DeviceMeters) -> None:
        t, n = self.t, self.n
        if (i + 1) % t.cfg.TRAIN.PRINT_FREQ and n >= t.cfg.TRAIN.PRINT_FREQ:
            return
        last, avg = meters.read()
        lr = t.method.optim.param_groups[0]["lr"]
        eta = datetime.timedelta(seconds=int(self.batch_time.avg * (n - i - 1 + (t.max_epoch - t.epoch - 1) * n)))
        bt, dt = self.batch_time, self.data_time
        print(
            f"epoch [{t.epoch + 1}/{t.max_epoch}] batch [{i + 1}/{n}] time {bt.val:.3f} ({bt.avg:.3f}) "
            f"data {dt.val:.3f} ({dt.avg:.3f}) {format_meters(avg, last)} lr {lr:.4e} eta {eta}"
        )
        for k, v in avg.items():
            t.write_scalar("train/" + k, v, t.epoch * n + i)
        t.write_scalar("train/lr", lr, t.epoch * n + i)


def check_method_trainer_cfg(cfg: CN) -> None:
    """The values a plugin method's loop on Dassl's reads as the built-in engine does, and no value set for a
    key of Dassl's it would ignore (a run that silently ignores one looks like the run it names)."""
    name = cfg.TRAINER.NAME
    check_supported_values(cfg, "on either engine (it runs the plugin's own loop)", "change it")
    dassls = get_cfg_default()
    for key in unread_dassl_keys():
        value, default = key_value(cfg, key), key_value(dassls, key)
        if value != default:
            raise DAELConfigError(
                f"{key}={value!r}: {name} runs the plugin's own loop, which does not read {key} on either "
                f"engine (Dassl's own trainers do); remove it (Dassl's default: {default!r})"
            )


def unread_dassl_keys() -> List[str]:
    """Dassl's config keys that a plugin method would ignore: those the built-in engine's config
    lacks (its loop never reads them: ``MODEL.HEAD``, ``OPTIM.WARMUP_*``, ``OPTIM.STAGED_LR``, the
    samplers' ``N_INS``, ...), but for ``DATASET.*`` and ``TEST.*``, which Dassl's dataset classes and
    evaluator read around the method, and ``TRAINER.*``, Dassl's own trainers' nodes."""
    from dael_plugin.config import add_dael_config
    from dael_plugin.config.defaults import get_builtin_cfg

    built_in = set(full_keys(add_dael_config(get_builtin_cfg())))
    around = ("DATASET.", "TEST.", "TRAINER.")
    return [k for k in full_keys(get_cfg_default()) if k not in built_in and not k.startswith(around)]


def dassl_splits(dm: DataManager) -> Dict[str, object]:
    """Dassl's dataset as the built-in trainer takes it: its ``Datum`` lists as items, the class
    names by label."""
    data = dm.dataset

    def items(split) -> Optional[list]:
        return [Item(d.impath, d.label, d.domain, d.classname) for d in split] if split else None

    return {
        "classnames": [dm.lab2cname[i] for i in range(dm.num_classes)],
        "train_x": items(data.train_x),
        "train_u": items(data.train_u),
        "val": items(data.val),
        "test": items(data.test),
    }


_TRAINERS_XU: Dict[str, type] = {}


def register_method_trainers() -> None:
    """Every method of the plugin's registry under a name Dassl's ``TRAINER_REGISTRY`` lacks,
    as a trainer (a ``--plugin`` method registered since the last call included)."""
    for name in TRAINERS:
        if name in TRAINER_REGISTRY.registered_names():
            continue
        _TRAINERS_XU[name] = type(
            name, (MethodTrainerXU,), {"__doc__": MethodTrainerXU.__doc__, "__module__": __name__}
        )
        TRAINER_REGISTRY.register(_TRAINERS_XU[name])


def has_method_trainer(name: str) -> bool:
    register_method_trainers()
    return name in _TRAINERS_XU
