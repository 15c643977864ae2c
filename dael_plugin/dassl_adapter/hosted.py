"""A method of the plugin's registry that Dassl lacks (a ``--plugin`` method of the user's own) on
the Dassl engine: Dassl's dataset classes read the data (``DATASET_REGISTRY``, its ``DataManager``),
Dassl's ``train()`` drives the epochs and Dassl's evaluator scores the test. Inside, the method
object is the one the built-in engine builds (engine/trainer.py, with the items Dassl read): its
epoch, its step with every ``EXECUTION`` option, and its hooks (checkpoint and exact resume, the
per-epoch records), so nothing of the method is written twice. Its backbones are Dassl's, built
as Dassl's ``SimpleNet`` builds them (any name in Dassl's ``BACKBONE_REGISTRY``).

Dassl's own trainers keep their names: a method is hosted only under a name Dassl's
``TRAINER_REGISTRY`` does not hold (:func:`register_hosted`). Under torchrun each process hosts
its share, as on the built-in engine (the method shards the loaders and wraps its modules in DDP).
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional

from dassl.config import get_cfg_default
from dassl.data import DataManager
from dassl.engine import TRAINER_REGISTRY, TrainerXU
from yacs.config import CfgNode as CN

from dael_plugin.config.defaults import SUPPORTED_VALUES
from dael_plugin.config.keys import full_keys, key_value
from dael_plugin.dassl_adapter.backbones import build_dassl_backbone
from dael_plugin.dassl_adapter.evaluate import dassl_test
from dael_plugin.dassl_adapter.robust_data import RobustDatasetWrapper
from dael_plugin.data.items import Item
from dael_plugin.engine import distributed, hooks
from dael_plugin.engine.loop import end_sync_batch_norm
from dael_plugin.engine.results import TrainerFacts
from dael_plugin.errors import DAELConfigError
from dael_plugin.methods import TRAINERS, build_trainer


class HostedMethod(TrainerFacts, TrainerXU):
    """Dassl's ``TrainerXU`` around one of the plugin's methods (``self.method``)."""

    own_records = True  # the method's hooks write them

    def __init__(self, cfg: CN, eval_only: bool = False) -> None:
        self.eval_only = eval_only
        super().__init__(cfg)  # Dassl's: check_cfg, build_data_loader, build_model, the evaluator

    def check_cfg(self, cfg: CN) -> None:
        check_hosted_cfg(cfg)  # train.py checked it before the output folder; Dassl's tools/train.py here

    def build_data_loader(self) -> None:
        # Dassl's DataManager reads the data; Dassl's domain sampler would stop a source smaller than
        # its share of a batch before the method's sampler says so in one line (as the DAEL trainer).
        dm_cfg = self.cfg.clone()
        dm_cfg.defrost()
        dm_cfg.DATALOADER.TRAIN_X.SAMPLER = "RandomSampler"
        dm = DataManager(dm_cfg, dataset_wrapper=RobustDatasetWrapper)
        self.dm, self.lab2cname = dm, dm.lab2cname
        self.num_classes, self.num_source_domains = dm.num_classes, dm.num_source_domains
        # Dassl's data and Dassl's backbones (every name in its BACKBONE_REGISTRY, as its SimpleNet)
        self.method = build_trainer(
            self.cfg, eval_only=self.eval_only, splits=dassl_splits(dm), backbones=build_dassl_backbone
        )
        m = self.method
        m.engine = "dassl"  # in its checkpoints: resumed and evaluated on this engine
        self.train_loader_x, self.train_loader_u = m.train_loader_x, m.train_loader_u
        self.val_loader, self.test_loader = m.val_loader, m.test_loader

    def build_model(self) -> None:
        for name, module in self.method.modules.items():  # Dassl's set_model_mode and model names
            self.register_model(name, module)

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
        self.method.epoch = self.epoch
        self.method.run_epoch()

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


def check_hosted_cfg(cfg: CN) -> None:
    """The values a hosted method's loop reads as the built-in engine does, and no value set for a
    key of Dassl's it would ignore (a run that silently ignores one looks like the run it names)."""
    name = cfg.TRAINER.NAME
    for key, allowed in SUPPORTED_VALUES.items():
        value = key_value(cfg, key)
        if value not in allowed:
            raise DAELConfigError(f"{key}={value!r}: {name} takes {list(allowed)} on either engine")
    dassls = get_cfg_default()
    for key in unread_dassl_keys():
        value, default = key_value(cfg, key), key_value(dassls, key)
        if value != default:
            raise DAELConfigError(
                f"{key}={value!r}: {name} runs the plugin's own loop, which does not read {key} on either "
                f"engine (Dassl's own trainers do); remove it (Dassl's default: {default!r})"
            )


def unread_dassl_keys() -> List[str]:
    """Dassl's config keys that a hosted method would ignore: those the built-in engine's config
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


_HOSTED: Dict[str, type] = {}


def register_hosted() -> None:
    """Every method of the plugin's registry under a name Dassl's ``TRAINER_REGISTRY`` lacks,
    hosted (a ``--plugin`` method registered since the last call included)."""
    for name in TRAINERS:
        if name in TRAINER_REGISTRY.registered_names():
            continue
        _HOSTED[name] = type(name, (HostedMethod,), {"__doc__": HostedMethod.__doc__, "__module__": __name__})
        TRAINER_REGISTRY.register(_HOSTED[name])


def is_hosted(name: str) -> bool:
    register_hosted()
    return name in _HOSTED
