"""Dataset checks against Dassl's registry, with one-line errors."""

from __future__ import annotations

import difflib
import os
from typing import Optional

from dassl.data.datasets import DATASET_REGISTRY
from yacs.config import CfgNode as CN

from dael_plugin.errors import DAELConfigError


def check_dataset_cfg(cfg: CN) -> None:
    name = cfg.DATASET.NAME
    names = DATASET_REGISTRY.registered_names()
    if name not in names:
        close = difflib.get_close_matches(str(name), list(names), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DAELConfigError(f"unknown dataset DATASET.NAME={name!r}{hint}; registered datasets: {sorted(names)}")
    domains = list(getattr(DATASET_REGISTRY.get(name), "domains", []) or [])
    if domains:
        for d in list(cfg.DATASET.SOURCE_DOMAINS) + list(cfg.DATASET.TARGET_DOMAINS):
            if d not in domains:
                close = difflib.get_close_matches(str(d), domains, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise DAELConfigError(f"dataset {name} has no domain {d!r}{hint}; its domains are {domains}")


def check_trainer_cfg(cfg: CN) -> None:
    from dassl.engine import TRAINER_REGISTRY

    names = TRAINER_REGISTRY.registered_names()
    if cfg.TRAINER.NAME not in names:
        close = difflib.get_close_matches(str(cfg.TRAINER.NAME), list(names), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise DAELConfigError(f"unknown trainer {cfg.TRAINER.NAME!r}{hint}; Dassl has {sorted(names)}")
    trainer = TRAINER_REGISTRY.get(cfg.TRAINER.NAME)
    check_target_data(cfg, trainer)
    check_domains_named(cfg, trainer)
    check_views(cfg, trainer)
    if trainer.__module__ == "dassl.engine.ssl.fixmatch" and "lab2cname" not in vars(trainer):
        raise DAELConfigError(
            "Dassl 0.6.3's FixMatch stops as it is built (its build_data_loader sets no lab2cname, which its "
            "evaluator reads: AttributeError); use --engine builtin, whose FixMatch is Dassl's step"
        )
    check_numpy_transforms(cfg, trainer)
    sampler = cfg.DATALOADER.TRAIN_X.SAMPLER
    if sampler == "CyclingDomainSampler" and not TRAINER_REGISTRY.get(cfg.TRAINER.NAME).__module__.startswith(
        "dael_plugin"
    ):
        raise DAELConfigError(
            f"DATALOADER.TRAIN_X.SAMPLER {sampler} is the plugin's own; Dassl's {cfg.TRAINER.NAME} builds Dassl's "
            "samplers only: use RandomDomainSampler, or --engine builtin"
        )


# Dassl 0.6.3's transforms that call NumPy's ``np.int``, gone since NumPy 1.24: its randaugment
# (in SolarizeAdd, one of the operations it draws) and its AutoAugment policies (as each is built)
DASSL_NP_INT = ("randaugment", "imagenet_policy", "cifar10_policy", "svhn_policy")


def check_numpy_transforms(cfg: CN, trainer: type) -> None:
    """Dassl's own trainers build Dassl's transforms: under a NumPy without ``np.int``, those of
    :data:`DASSL_NP_INT` stop the run in a traceback (randaugment at the first SolarizeAdd it
    draws, mid-epoch); one line instead. The plugin's methods build the plugin's transforms, which
    compute Dassl's operations (transforms/dassl_pil.py)."""
    import numpy as np

    if hasattr(np, "int") or not trainer.__module__.startswith("dassl."):
        return
    node = cfg.TRAINER.get(str(cfg.TRAINER.NAME).upper())
    lists = [("INPUT.TRANSFORMS", cfg.INPUT.TRANSFORMS)]
    if isinstance(node, CN) and "STRONG_TRANSFORMS" in node:
        lists.append((f"TRAINER.{str(cfg.TRAINER.NAME).upper()}.STRONG_TRANSFORMS", node.STRONG_TRANSFORMS))
    for key, names in lists:
        bad = [n for n in names if n in DASSL_NP_INT]
        if bad:
            raise DAELConfigError(
                f"{key} {list(names)}: Dassl 0.6.3's {bad[0]} calls np.int, which NumPy {np.__version__} no longer has "
                f"(its {cfg.TRAINER.NAME} would stop in a traceback once it draws the operation); use --engine builtin, "
                "whose transforms compute Dassl's operations, or Dassl's randaugment2 or randaugment_fixmatch"
            )


# Dassl 0.6.3's trainers with an output per source domain (``num_source_domains``: experts, a
# domain classifier's classes, classifier pairs)
DASSL_PER_SOURCE_DOMAIN = ("DAEL", "M3SDA", "CrossGrad", "DAELDG", "DDAIG")


def check_domains_named(cfg: CN, trainer: type) -> None:
    """On a dataset that names one source of many metadata domains (WILDS: data/wilds_formats.py),
    Dassl's trainers of :data:`DASSL_PER_SOURCE_DOMAIN` index their outputs by the metadata's
    domain numbers and stop in a traceback (CrossGrad: ``Target 1 is out of bounds``): one line.
    The plugin's own trainers say it themselves (BuiltinTrainer.check_domains_named)."""
    from dael_plugin.data.folders import official_split
    from dael_plugin.data.wilds_formats import is_wilds

    if trainer.__module__.startswith("dassl.") and trainer.__name__ in DASSL_PER_SOURCE_DOMAIN:
        split = official_split(cfg.DATASET.NAME)
        if split is not None and tuple(cfg.DATASET.SOURCE_DOMAINS) == tuple(split[0]):
            hint = (
                ", or name its train split's metadata domains with --source-domains"
                if is_wilds(cfg.DATASET.NAME)
                else ""
            )
            raise DAELConfigError(
                f"Dassl's {cfg.TRAINER.NAME} learns one output per source domain, and {cfg.DATASET.NAME} brings its "
                f"own split of one source, {list(split[0])} (a WILDS train split's metadata domains would index past "
                f"it): train a method without per-domain outputs on it (Vanilla, DomainMix; SourceOnly, FixMatch){hint}"
            )


# Dassl 0.6.3's trainers that read DATALOADER.K_TRANSFORMS views of an image (each asserts it)
DASSL_MULTI_VIEW = ("SE", "CDAC", "MixMatch")


def check_views(cfg: CN, trainer: type) -> None:
    """``DATALOADER.K_TRANSFORMS`` above 1 makes each batch's ``img`` a list of views, which only
    Dassl's trainers that read the key take (:data:`DASSL_MULTI_VIEW`); Dassl's others stop at
    their first batch with ``'list' object has no attribute 'to'``: one line instead."""
    if int(cfg.DATALOADER.K_TRANSFORMS) == 1 or not trainer.__module__.startswith("dassl."):
        return  # the plugin's trainers check the key themselves; a user's reads it as it means to
    if trainer.__name__ not in DASSL_MULTI_VIEW:
        raise DAELConfigError(
            f"DATALOADER.K_TRANSFORMS={cfg.DATALOADER.K_TRANSFORMS}: Dassl's {cfg.TRAINER.NAME} takes one view "
            "of each image (its steps read a tensor, not a list of views); set it to 1"
        )


def check_target_data(cfg: CN, trainer: type) -> None:
    """A Dassl ``TrainerXU`` (SourceOnly, M3SDA, MME, ...) iterates target batches in every epoch, and
    on a dataset without an unlabeled target split it stops with ``TypeError: object of type
    'NoneType' has no len()``: one line instead (for the datasets the plugin knows; the plugin's
    DAEL runs DG there)."""
    from dassl.engine import TrainerXU

    from dael_plugin.data.folders import DATASETS

    entry = DATASETS.get(str(cfg.DATASET.NAME))
    if entry is None or entry.unlabeled_target or not issubclass(trainer, TrainerXU):
        return
    if trainer.__module__.startswith("dael_plugin"):
        return
    raise DAELConfigError(
        f"Dassl's {cfg.TRAINER.NAME} is a domain adaptation trainer (a TrainerXU: it reads target batches) and "
        f"{cfg.DATASET.NAME} has no unlabeled target data; use a DA dataset config, or a DG trainer (Vanilla "
        "for SourceOnly)"
    )


def check_backbone_cfg(cfg: CN) -> None:
    """An unknown MODEL.BACKBONE.NAME is one line here, not Dassl's ValueError mid-construction."""
    from dassl.modeling.backbone import BACKBONE_REGISTRY

    name = cfg.MODEL.BACKBONE.NAME
    if not name:
        return  # Dassl's trainers that build no backbone
    names = BACKBONE_REGISTRY.registered_names()
    if name not in names:
        close = difflib.get_close_matches(str(name), [n for n in list(names)], n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise DAELConfigError(
            f"MODEL.BACKBONE.NAME={name!r} is not a backbone Dassl has{hint}; use one of its "
            "backbones or timm_<any timm model>"
        )


def check_backbone_weights(cfg: CN) -> None:
    """``MODEL.BACKBONE.WEIGHTS`` is read on this engine for timm backbones and the plugin's own;
    Dassl's own backbones load Dassl's pretrained weights (``PRETRAINED``) and would ignore it."""
    from dael_plugin.backbones import OWN_BACKBONES, TIMM_PREFIX

    name, weights = str(cfg.MODEL.BACKBONE.NAME), str(cfg.MODEL.BACKBONE.get("WEIGHTS", "") or "")
    if weights and not name.startswith(TIMM_PREFIX) and name not in OWN_BACKBONES:
        raise DAELConfigError(
            f"MODEL.BACKBONE.WEIGHTS {weights} would be ignored by Dassl's own {name} (it reads its own pretrained "
            f"weights, MODEL.BACKBONE.PRETRAINED); run it with --engine builtin, which reads the file, or name "
            f"timm_{name}"
        )


def check_dassl_data(cfg: CN) -> None:
    """Dassl's own readers of the datasets the plugin also reads (Digit5, DomainNet, PACS, ...)
    fail on missing or partial data with a traceback, or, for a class folder missing from one
    domain, shift the labels silently: the plugin's reader of the same files goes first and says
    what is wrong in one line. It reads file lists only (no image), with its own RNG."""
    from dael_plugin.dassl_adapter.datasets import is_plugin_dataset
    from dael_plugin.data.folders import builtin_datasets, dataset_options, load_splits
    from dael_plugin.data.images import not_regular_files

    name = cfg.DATASET.NAME
    if name not in builtin_datasets() or is_plugin_dataset(name):  # the plugin's own ones read once, later
        return
    splits = load_splits(
        name,
        cfg.DATASET.ROOT,
        cfg.DATASET.SOURCE_DOMAINS,
        cfg.DATASET.TARGET_DOMAINS,
        max(cfg.SEED, 0),
        bool(cfg.DATASET.get("CATEGORY_SHIFT", False)),
        dataset_options(cfg.DATASET),
    )
    # Dassl's Datum asserts os.path.isfile(impath): a FIFO, a device link or a folder named like
    # an image would stop its reader with a bare AssertionError (the plugin's own datasets keep
    # such entries and replace them when read, as the built-in engine does for every dataset).
    paths = [it.impath for key in ("train_x", "train_u", "val", "test") for it in (splits.get(key) or [])]
    odd = not_regular_files(list(dict.fromkeys(paths)))
    if odd:
        raise DAELConfigError(
            f"{len(odd)} of the {name} images are not regular files (a FIFO, a device, a folder named like an "
            f"image; first: {', '.join(odd[:3])}), and Dassl's reader of {name} stops on them; delete or replace "
            "them, or run with --engine builtin, which replaces each with another image of its domain"
        )


def check_run_names(cfg: CN, data: bool = True) -> None:
    """The names a run gives (trainer, dataset, domains, backbone), checked before its output
    folder or log exists: a typo costs one line and leaves nothing behind; ``data``: the dataset's
    file lists too."""
    from dael_plugin.dassl_adapter.backbones import register_own_backbones, register_timm_backbone
    from dael_plugin.dassl_adapter.datasets import register_datasets
    from dael_plugin.dassl_adapter.method_trainer import (
        check_method_trainer_cfg,
        has_method_trainer,
        register_method_trainers,
    )

    # A timm backbone (and its local weights file) registered by name (``import dael_plugin`` did the rest),
    # and the backbones and datasets a --plugin registered since.
    register_timm_backbone(
        cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.get("WEIGHTS", ""), tuple(int(v) for v in cfg.INPUT.SIZE)
    )
    register_own_backbones()
    register_datasets()
    register_method_trainers()  # the plugin's methods Dassl lacks (a --plugin method)
    check_trainer_cfg(cfg)
    if has_method_trainer(cfg.TRAINER.NAME):
        check_method_trainer_cfg(cfg)
    check_dataset_cfg(cfg)
    check_backbone_cfg(cfg)
    check_backbone_weights(cfg)
    check_dassl_stops(cfg)
    if data:
        check_dassl_data(cfg)


def check_dassl_stops(cfg: CN) -> None:
    """Values with which every Dassl trainer stops in a traceback: one line instead."""
    import inspect

    import torch

    if cfg.INPUT.NO_TRANSFORM:
        raise DAELConfigError(
            "INPUT.NO_TRANSFORM True: Dassl's loaders then hand PIL images to torch's collate, which cannot batch "
            "them (every trainer stops at its first batch); remove it"
        )
    takes_verbose = "verbose" in inspect.signature(torch.optim.lr_scheduler.LRScheduler.__init__).parameters
    if cfg.OPTIM.WARMUP_EPOCH > 0 and not takes_verbose:
        raise DAELConfigError(
            f"OPTIM.WARMUP_EPOCH={cfg.OPTIM.WARMUP_EPOCH}: Dassl's warm-up schedulers pass verbose to torch's "
            f"LRScheduler, which torch {torch.__version__} no longer takes (every trainer stops as it builds "
            "its scheduler); remove it"
        )
    if cfg.TRAINER.NAME == "CDAC" and cfg.TRAIN.COUNT_ITER == "train_u":
        raise DAELConfigError(
            "TRAIN.COUNT_ITER train_u: Dassl's CDAC stops with an AttributeError as it builds its model (it reads "
            "len_train_loader_u, which it never sets); use train_x or smaller_one, or --engine builtin, whose "
            "CDAC counts the target loader's batches"
        )
    check_dassl_builders(cfg)


def check_dassl_builders(cfg: CN) -> None:
    """Dassl's own optimiser and scheduler builders on a one-weight model, and its evaluator names:
    another OPTIM.NAME, LR_SCHEDULER or TEST.EVALUATOR (or a value torch's optimiser refuses, as an
    ADAM_BETA of 1.5) stops every trainer with a ValueError as it is built, after the data is read."""
    from dassl.evaluation import EVALUATOR_REGISTRY
    from dassl.optim import build_lr_scheduler, build_optimizer
    from torch import nn

    optim = cfg.OPTIM.clone()
    optim.defrost()
    optim.STAGED_LR = False  # its layer names are the model's: the trainer's own build checks them
    optim.WARMUP_EPOCH = 0  # check_dassl_stops's
    try:
        build_lr_scheduler(build_optimizer(nn.Linear(1, 1), optim), optim)
    except ValueError as exc:
        raise DAELConfigError(f"OPTIM: Dassl refuses it: {exc}") from None
    names = EVALUATOR_REGISTRY.registered_names()
    if cfg.TEST.EVALUATOR not in names:
        close = difflib.get_close_matches(str(cfg.TEST.EVALUATOR), list(names), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DAELConfigError(f"TEST.EVALUATOR={cfg.TEST.EVALUATOR!r} is not an evaluator Dassl has{hint}: {names}")


def sampler_refusal(exc: ValueError, cfg: CN) -> Optional[str]:
    """One line where Dassl's domain sampler (``dassl/data/samplers.py``) cannot draw its first
    batch as it builds (``random.sample`` of more images than a source domain holds, or of more
    domains than there are); None for any other ValueError, whose stack stays."""
    import traceback

    last = [f.filename.replace(os.sep, "/") for f in traceback.extract_tb(exc.__traceback__)][-2:]
    if not any(f.endswith("dassl/data/samplers.py") for f in last):  # (then random.sample's own frame)
        return None
    x = cfg.DATALOADER.TRAIN_X
    domains = f"{x.N_DOMAIN} of the" if x.N_DOMAIN > 0 else "all the"
    return (
        f"Dassl's {x.SAMPLER} cannot draw its first batch of {x.BATCH_SIZE}, an equal share from {domains} domains "
        f"of the sources {list(cfg.DATASET.SOURCE_DOMAINS)}: a domain holds fewer training images than its share, "
        f"or DATALOADER.TRAIN_X.N_DOMAIN exceeds the domains ({exc}); lower DATALOADER.TRAIN_X.BATCH_SIZE or N_DOMAIN"
    )


def check_cfg_refusal(exc: AssertionError, name: str) -> Optional[str]:
    """One line for an assertion of a Dassl trainer's own ``check_cfg`` (the config it needs: M3SDA's
    RandomDomainSampler), naming the assertion; None for any other assertion, whose stack stays."""
    import linecache
    import traceback

    frame = traceback.extract_tb(exc.__traceback__)[-1]
    if frame.name != "check_cfg":
        return None
    lines = range(frame.lineno, (frame.end_lineno or frame.lineno) + 1)
    said = " ".join(linecache.getline(frame.filename, i).strip() for i in lines)
    why = f" ({exc})" if str(exc) else ""
    return (
        f"{name} refuses this config: its check_cfg asserts `{said}`{why}; set that key (its config file under "
        "Dassl's configs/trainers sets it)"
    )
