"""Per-epoch records (``SELECTION.EVAL_FREQ``) on the Dassl engine for Dassl's own baselines
(M3SDA, MME, SourceOnly, ...), so that every trainer of a sweep is chosen under the same protocol
from the same kind of records (engine/selection.py) as the plugin's methods on that engine, whose records
are their own (dassl_adapter/method_trainer.py).

A baseline is Dassl's class with :class:`BaselineRecords` put in front of it
(:func:`with_records`): Dassl's training loop and losses are untouched; the held-out source split
is taken out of ``train_x`` before the first epoch and the source loader rebuilt without it, and
after each epoch the record is written before Dassl's own checkpoint (so a run stopped between
the two redoes that epoch, and its record, on resume).
"""

from __future__ import annotations

import os.path as osp
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from dael_plugin.data.folders import own_val, sources_val
from dael_plugin.engine import checkpoint as ckpt
from dael_plugin.engine import distributed, hooks
from dael_plugin.engine.hooks import EpochRecords
from dael_plugin.engine.results import TrainerFacts
from dael_plugin.engine.selection import EvaluatedModel, Selection, record_loaders, split_sources
from dael_plugin.errors import DAELConfigError

Encode = Callable[[torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]


def eval_freq(cfg) -> int:
    """SELECTION.EVAL_FREQ as set (-1: auto, resolved once the data is read; engine/selection.py)."""
    sel = cfg.get("SELECTION", None)
    return int(sel.get("EVAL_FREQ", 0)) if sel is not None else 0


def source_val_split(trainer, dataset) -> None:
    """The trainer's source validation split (``source_val_items``, ``source_val_info``) and its
    resolved ``eval_freq``; a held-out part leaves ``dataset.train_x`` before any training loader
    reads it."""
    cfg = trainer.cfg
    train, held, info, freq = split_sources(
        cfg.get("SELECTION", None),
        dataset.train_x,
        sources_val(cfg.DATASET.NAME, dataset.val),
        max(int(cfg.SEED), 0),
        cfg.DATASET.SOURCE_DOMAINS,
        cfg.DATASET.ROOT,
    )
    if len(train) != len(dataset.train_x):
        dataset._train_x = train  # DatasetBase.train_x reads it
    trainer.source_val_items, trainer.source_val_info, trainer.eval_freq = held, info, freq


def items_loader(cfg, items, template: DataLoader) -> DataLoader:
    """A test-time loader over ``items`` with ``template``'s dataset wrapper and transform (this
    process's share under torchrun)."""
    base = template.dataset
    ds = type(base)(cfg, items, transform=base.transform, is_train=False)
    w = distributed.world()
    return DataLoader(
        ds,
        batch_size=cfg.DATALOADER.TEST.BATCH_SIZE,
        sampler=distributed.test_indices(len(ds)) if w.distributed else None,
        shuffle=False,
        num_workers=cfg.DATALOADER.NUM_WORKERS,
        pin_memory=torch.cuda.is_available() and cfg.USE_CUDA,
    )


def build_selection(
    trainer, encode: Encode, is_da: bool, conf_thre: float, save_best: Callable[[str], None]
) -> Optional[Selection]:
    """The records of a Dassl-engine ``trainer`` (None with ``EVAL_FREQ`` 0)."""
    cfg = trainer.cfg
    if trainer.eval_freq <= 0:
        return None
    sel = cfg.SELECTION
    cap, seed = int(sel.TARGET_CAP), max(int(cfg.SEED), 0)
    data = trainer.dm.dataset
    template = trainer.test_loader
    loaders = record_loaders(
        lambda items: items_loader(cfg, items, template),
        trainer.source_val_items,
        data.train_x,
        data.train_u or None,
        template,
        cap,
        seed,
        own_val(cfg.DATASET.NAME, data.val),
    )
    model = EvaluatedModel(
        encode,
        trainer.device,
        loaders,
        lambda: trainer.set_model_mode("eval"),
        save_best,
        trainer.bad_images,
        trainer.ensemble_mask,
    )
    return Selection.from_cfg(cfg, trainer.eval_freq, trainer.num_classes, conf_thre, is_da, model)


# -- Dassl's baselines --------------------------------------------------------------------------
def baseline_encoder(trainer) -> Optional[Encode]:
    """``x -> (features, classifiers' probabilities (N, K, C))`` for a Dassl trainer whose
    ``model_inference`` the plugin knows, such that the mean over K is exactly the softmax of what
    ``model_inference`` predicts (a test holds it for M3SDA, MME and SourceOnly). None otherwise.

    - the default (``self.model``, a ``SimpleNet``: SourceOnly, Vanilla, DANN, SE, AdaBN, ...):
      ``model(x, return_feature=True)``, one classifier;
    - M3SDA: ``F``, then each source's classifier (the first of its pair at test time), K of them;
    - MME and CDAC: ``C(F(x))``; MCD: ``C1(F(x))``;
    - CrossGrad and DDAIG (DG): their label net ``F``, a ``SimpleNet`` like the default's ``model``."""
    from dassl.engine import TrainerX

    method = type(trainer).model_inference
    owner = method.__qualname__.split(".")[0]
    simple = "model" if method is TrainerX.model_inference else "F" if owner in ("CrossGrad", "DDAIG") else None
    if simple is not None and isinstance(getattr(trainer, simple, None), nn.Module):

        def encode(x):
            logits, feats = getattr(trainer, simple)(x, return_feature=True)
            return feats, F.softmax(logits, 1)[:, None]

        return encode
    if owner == "M3SDA" and isinstance(getattr(trainer, "C", None), nn.ModuleList):

        def encode(x):
            feats = trainer.F(x)
            # K separate Dassl modules (M3SDA's PairClassifiers): one call each, at evaluation only
            return feats, torch.stack([F.softmax(c(feats), 1) for c in trainer.C], 1)

        return encode
    head = {"MME": "C", "CDAC": "C", "MCD": "C1"}.get(owner)
    if head is not None and isinstance(getattr(trainer, head, None), nn.Module):

        def encode(x):
            feats = trainer.F(x)
            return feats, F.softmax(getattr(trainer, head)(feats), 1)[:, None]

        return encode
    return None


class DasslFacts(TrainerFacts):
    """Put in front of a Dassl trainer class by :func:`with_facts`: what the commands read of a
    trainer (engine/results.TrainerFacts), Dassl's own trainers keeping the defaults but for the
    setting, which is DA when the trainer reads unlabeled target data."""

    @property
    def is_da(self) -> bool:
        from dassl.engine import TrainerXU

        return isinstance(self, TrainerXU) and self.train_loader_u is not None


class BaselineRecords(DasslFacts):
    """Put in front of a Dassl trainer class by :func:`with_records`: the source validation split
    and the per-epoch records, with Dassl's own training loop."""

    def build_data_loader(self):
        super().build_data_loader()
        self.bad_images = set()
        dataset = self.dm.dataset
        before = len(dataset.train_x)
        # The data fingerprint before the held-out part leaves train_x, as the plugin's trainers
        # take it on both engines (taken after it, one table's runs read as "different images").
        from dael_plugin.data.fingerprint import dataset_fingerprint

        self.data_fingerprint = dataset_fingerprint(self.cfg, dataset)
        source_val_split(self, dataset)
        if len(dataset.train_x) != before:  # the held-out images go out of Dassl's source loader
            from dassl.data.data_manager import build_data_loader

            old, c = self.train_loader_x, self.cfg.DATALOADER.TRAIN_X
            self.train_loader_x = build_data_loader(
                self.cfg,
                sampler_type=c.SAMPLER,
                data_source=dataset.train_x,
                batch_size=c.BATCH_SIZE,
                n_domain=c.N_DOMAIN,
                n_ins=c.N_INS,
                tfm=old.dataset.transform,
                is_train=True,
                dataset_wrapper=type(old.dataset),
            )
            self.dm.train_loader_x = self.train_loader_x

    def build_model(self):
        super().build_model()
        self.selection = None
        if self.eval_freq <= 0:
            return
        encode = baseline_encoder(self)
        if encode is None and eval_freq(self.cfg) < 0:  # auto: a trainer the records cannot read
            print(
                f"dael_plugin: no per-epoch records for Dassl's {self.cfg.TRAINER.NAME} (its prediction is not one "
                "the plugin can split into features and classifiers)"
            )
            self.eval_freq = 0
            return
        if encode is None:
            raise DAELConfigError(
                f"SELECTION.EVAL_FREQ {eval_freq(self.cfg)}: per-epoch records are not available for Dassl's "
                f"trainer {self.cfg.TRAINER.NAME} (the plugin does not know how its prediction splits into features "
                "and classifiers); set SELECTION.EVAL_FREQ 0"
            )
        dael = self.cfg.TRAINER.get("DAEL", None)
        conf_thre = float(dael.CONF_THRE) if dael is not None and "CONF_THRE" in dael else 0.95
        self.selection = build_selection(self, encode, self.is_da, conf_thre, self._save_best)

    def _save_best(self, path: str) -> None:
        """A protocol's chosen model: every registered model's weights, with the epoch."""
        names = self.get_model_names()
        state = {
            "engine": "dassl",
            "trainer": str(self.cfg.TRAINER.NAME),
            "epoch": self.epoch + 1,
            "models": {n: self._models[n].state_dict() for n in names},
        }
        ckpt.save_checkpoint(state, path)

    def before_train(self):
        super().before_train()
        self.record_hooks = hooks.bind(self, [EpochRecords(self.selection)] if self.selection is not None else [])
        hooks.run(self.record_hooks, "before_train")  # the records of epochs this run redoes go

    def after_epoch(self):
        hooks.run(self.record_hooks, "after_epoch")  # before Dassl's checkpoint of this epoch
        super().after_epoch()


def with_records(cls: type) -> type:
    """Dassl trainer class ``cls`` with per-epoch records (same name, same registry entry)."""
    return _in_front(BaselineRecords, cls)


def with_facts(cls: type) -> type:
    """Dassl trainer class ``cls`` with what the commands read of a trainer, and no records."""
    return _in_front(DasslFacts, cls)


def _in_front(mixin: type, cls: type) -> type:
    if issubclass(cls, (mixin, TrainerFacts)):  # the plugin's own trainer, or done already
        return cls
    return type(cls.__name__, (mixin, cls), {"__doc__": cls.__doc__, "__module__": cls.__module__})


def load_best(trainer, directory: str, protocol: str) -> int:
    """Load ``model-best-<protocol>.pth.tar`` of ``directory`` into a Dassl-engine trainer (the
    plugin's DAEL or a baseline); returns its epoch."""
    from dael_plugin.engine.selection import best_name

    path = osp.join(directory, best_name(protocol))
    if not osp.isfile(path):
        raise DAELConfigError(
            f"no {path}: that run kept no model for protocol {protocol!r} (it needs SELECTION.EVAL_FREQ > 0 "
            "and the protocol in SELECTION.KEEP_BEST)"
        )
    state = ckpt.load_checkpoint(path)
    models = state.get("models")
    if not isinstance(models, dict):
        raise ckpt.CheckpointError(f"{path} is not a Dassl-engine checkpoint; evaluate it with --engine builtin")
    wrote, now = str(state.get("trainer", "")), str(trainer.cfg.TRAINER.NAME)
    if wrote.upper() != now.upper():
        raise ckpt.CheckpointError(f"{path} holds a {wrote} run, this run is {now}; pass --trainer {wrote}")
    for name in trainer.get_model_names():
        if name not in models:
            raise ckpt.CheckpointError(f"{path} has no weights for model {name}; check --trainer against its run")
        ckpt.load_weights(trainer._models[name], models[name], path, what=f"model {name}")
    print(f"Loaded {path} (protocol {protocol}, epoch {state.get('epoch')})")
    return int(state.get("epoch", 0))
