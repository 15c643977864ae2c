"""``scripts/train.py``: Dassl's train CLI, on Dassl or on the built-in engine.

The flags are those of Dassl's ``tools/train.py``, plus ``--engine``. Config
flow, as in Dassl: defaults -> ``add_dael_config`` -> dataset config file ->
method config file -> command-line flags -> trailing ``KEY VALUE`` opts ->
``clean_cfg`` for the trainer actually run.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from typing import List, Optional

from yacs.config import CfgNode as CN

from dael_plugin.about import ENGINES
from dael_plugin.backbones.timm_backbone import check_timm_backbone
from dael_plugin.config import TRAINER_NODES, add_dael_config, check_run_values
from dael_plugin.config.keys import check_other_node, hparams_from_cfg, loader_bytes
from dael_plugin.data.fingerprint import dataset_fingerprint, one_digest
from dael_plugin.engine import distributed
from dael_plugin.engine.atomic import remove_stale_temps
from dael_plugin.engine.checkpoint import LAST, accept_data_change, checkpoint_epoch
from dael_plugin.engine.execution import (
    cap_host_memory,
    cuda_settings,
    is_host_oom,
    pin_cpu_threads,
    restore_host_memory,
)
from dael_plugin.engine.results import (
    remove_failure,
    results_record,
    write_failure,
    write_results,
)
from dael_plugin.engine.runlock import BusyError, ClashError, RunLock
from dael_plugin.errors import EXIT_BUSY, EXIT_CLASH, DAELConfigError, NonFiniteLossError, Terminated, say

EXIT_OOM = 4  # out of device or host memory: one line with the settings to lower
EXIT_LOST_PEER = 5  # under torchrun: another process of the job died or stalled


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train DAEL or a Dassl baseline (dael-plugin).")
    p.add_argument("--root", type=str, default="", help="path to dataset (required)")
    p.add_argument("--output-dir", type=str, default="", help="output directory")
    p.add_argument("--resume", type=str, default="", help="checkpoint directory (from which the training resumes)")
    p.add_argument("--seed", type=int, default=None, help="a non-negative value fixes the seed")
    p.add_argument("--source-domains", type=str, nargs="+", help="source domains for DA/DG")
    p.add_argument("--target-domains", type=str, nargs="+", help="target domains for DA/DG")
    p.add_argument("--transforms", type=str, nargs="+", help="data augmentation methods (INPUT.TRANSFORMS)")
    p.add_argument("--config-file", type=str, default="", help="path to the method config file")
    p.add_argument("--dataset-config-file", type=str, default="", help="path to the dataset config file")
    p.add_argument(
        "--trainer", type=str, default="", help="name of trainer (required: DAEL, DAELDG, SourceOnly, M3SDA, ...)"
    )
    p.add_argument("--backbone", type=str, default="", help="name of CNN backbone (e.g. timm_resnet18)")
    p.add_argument("--head", type=str, default="", help="name of head")
    p.add_argument("--eval-only", action="store_true", help="evaluation only")
    p.add_argument("--model-dir", type=str, default="", help="load model from this directory for eval-only mode")
    p.add_argument("--load-epoch", type=int, help="load model weights at this epoch for evaluation")
    p.add_argument(
        "--select",
        type=str,
        default="",
        metavar="PROTOCOL",
        help="with --eval-only: evaluate the model that PROTOCOL chose during the run (its "
        "model-best-PROTOCOL.pth.tar in --model-dir, kept with SELECTION.EVAL_FREQ; docs/selection.md)",
    )
    p.add_argument("--no-train", action="store_true", help="do not call trainer.train()")
    p.add_argument(
        "--engine", choices=ENGINES, default="auto", help="auto: Dassl when importable, else the built-in engine"
    )
    p.add_argument(
        "--eval-each-epoch",
        action="store_true",
        help="built-in engine: also evaluate after every epoch (on the validation split where "
        "the dataset has one, else on the target test split, which is then said in the log)",
    )
    p.add_argument(
        "--check-data",
        action="store_true",
        help="decode every image of the run's splits before training and print images per domain, split "
        "and class; stop with the list of bad files",
    )
    p.add_argument(
        "--hash-pixels",
        action="store_true",
        help="with --check-data: also a SHA-256 of the image bytes per split and domain, in results.json "
        "(the data fingerprint itself hashes paths and labels only)",
    )
    p.add_argument(
        "--accept-data-change",
        action="store_true",
        help="resume although the images differ from those the checkpoint's run read (its data "
        "fingerprint); without it such a resume is refused. Changed classes are always refused",
    )
    p.add_argument(
        "--retrain",
        action="store_true",
        help="train again into an OUTPUT_DIR whose run finished (its files move to "
        "OUTPUT_DIR/replaced-<time>/); without it, rerunning a finished run does nothing",
    )
    p.add_argument("opts", default=None, nargs=argparse.REMAINDER, help="modify config options using the command-line")
    return p


def choose_engine(requested: str) -> str:
    from dael_plugin.about import HAS_DASSL as has_dassl

    if requested == "dassl" and not has_dassl:
        raise DAELConfigError(
            "--engine dassl: Dassl is not installed; install it by hand (see README) or use --engine builtin"
        )
    engine = requested if requested != "auto" else ("dassl" if has_dassl else "builtin")
    why = "requested" if requested != "auto" else ("Dassl is importable" if has_dassl else "Dassl is not installed")
    print(f"dael_plugin: engine = {engine} ({why})")
    return engine


def _merge_file(cfg: CN, path: str, engine: str) -> dict:
    """Merge a config file as data: YAML read as data (:mod:`dael_plugin.config.strict_yaml`), never
    imported (yacs's ``merge_from_file`` would import a ``.py`` file and run it)."""
    from dael_plugin.config.strict_yaml import load_config_file

    if path.endswith(".py"):
        raise DAELConfigError(
            f"config file {path} is a Python file; config files are YAML, read as data and "
            "never run: write its KEY: value pairs to a .yaml file"
        )
    loaded = load_config_file(path)  # no aliases, no duplicate keys, a small regular file
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise DAELConfigError(
            f"config file {path} holds a {type(loaded).__name__}, not a mapping of KEY: value; "
            "see configs/ for examples"
        )
    try:
        cfg.merge_from_other_cfg(CN(loaded))  # yacs decodes the values as merge_from_file does
    except KeyError as exc:
        raise DAELConfigError(_key_error(exc, engine, f"config file {path}", cfg)) from None
    except (ValueError, AssertionError, TypeError) as exc:
        raise DAELConfigError(
            f"config file {path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    return loaded


def _key_error(exc: Exception, engine: str, where: str, cfg: Optional[CN] = None) -> str:
    msg = str(exc.args[0]) if exc.args else str(exc)
    key = msg.split(":", 1)[-1].strip() if "Non-existent" in msg else msg
    close = difflib.get_close_matches(key, _full_keys(cfg), n=1, cutoff=0.8) if cfg is not None else []
    if engine == "builtin":
        from dael_plugin.config.dassl_keys import DASSL_KEYS

        if key in DASSL_KEYS:  # one of Dassl's keys, which this engine lacks: the fix is the engine
            return (
                f"{where} sets {key}, one of Dassl's keys, which the built-in engine does not support; "
                "remove it, or install Dassl and use --engine dassl"
            )
    if close:  # a typo: the fix is the spelling, whatever the engine
        return f"{where} sets {key}, which is not a config key; did you mean {close[0]}?"
    return f"{where} sets {key}, which is not a config key (keys are upper case, e.g. OPTIM.LR)"


def _full_keys(node: CN, prefix: str = "") -> List[str]:
    keys = []
    for k, v in node.items():
        keys += _full_keys(v, f"{prefix}{k}.") if isinstance(v, CN) else [prefix + k]
    return keys


def reset_cfg(cfg: CN, args: argparse.Namespace) -> None:
    if args.root:
        cfg.DATASET.ROOT = args.root
    if args.output_dir:
        cfg.OUTPUT_DIR = args.output_dir
    if args.resume:
        cfg.RESUME = args.resume
    if args.seed is not None:
        cfg.SEED = args.seed
    if args.source_domains:
        cfg.DATASET.SOURCE_DOMAINS = args.source_domains
    if args.target_domains:
        cfg.DATASET.TARGET_DOMAINS = args.target_domains
    if args.transforms:
        cfg.INPUT.TRANSFORMS = args.transforms
    if args.trainer:
        cfg.TRAINER.NAME = args.trainer
    if args.backbone:
        cfg.MODEL.BACKBONE.NAME = args.backbone
    if args.head:
        if "HEAD" not in cfg.MODEL:
            raise DAELConfigError("--head is not supported by the built-in engine; use --engine dassl")
        cfg.MODEL.HEAD.NAME = args.head


def _coerce_opts(cfg: CN, opts: List[str]) -> List[str]:
    """What yacs would refuse as a type mismatch, read as meant (nothing yacs accepts changes):
    ``TRAINER.DAEL.WEIGHT_U 0`` is 0.0 for a float key, and a list key given bare words,
    ``TRAINER.DAEL.CLASS_MASKS all`` or ``SELECTION.KEEP_BEST im,oracle``, is that list."""
    out = list(opts)
    for i in range(0, len(out) - 1, 2):
        node, parts = cfg, str(out[i]).split(".")
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, CN) else None
        current = node.get(parts[-1]) if isinstance(node, CN) else None
        value = str(out[i + 1])
        if isinstance(current, float) and not isinstance(current, bool) and re.fullmatch(r"[-+]?\d+", value):
            out[i + 1] = str(float(value))
        elif isinstance(current, (list, tuple)) and re.fullmatch(r"[A-Za-z_][\w.\-]*(,[A-Za-z_][\w.\-]*)*", value):
            out[i + 1] = repr(value.split(","))
    return out


def setup_cfg(args: argparse.Namespace, engine: str) -> CN:
    if engine == "dassl":
        from dassl.config import clean_cfg, get_cfg_default

        cfg = get_cfg_default()
    else:
        from dael_plugin.builtin.defaults import get_builtin_cfg

        cfg = get_builtin_cfg()
        clean_cfg = _clean_cfg
    add_dael_config(cfg)
    if args.dataset_config_file:
        _merge_file(cfg, args.dataset_config_file, engine)
    method = _merge_file(cfg, args.config_file, engine) if args.config_file else {}
    reset_cfg(cfg, args)
    _check_method_file_fits(method, args.config_file, str(cfg.TRAINER.NAME))
    _check_list_flags(args)
    opts = list(args.opts or [])
    if opts and opts[0] == "--":
        opts = opts[1:]
    flags = [o for o in opts[::2] if o.startswith("--")]
    if flags:
        raise DAELConfigError(
            f"flag {flags[0]} comes after the trailing KEY VALUE options, where it would be read as a config "
            "key; put every --flag before the first KEY VALUE pair"
        )
    if len(opts) % 2:
        raise DAELConfigError(f"trailing options must be KEY VALUE pairs, got {opts}")
    try:
        cfg.merge_from_list(_coerce_opts(cfg, opts))
    except (KeyError, AssertionError) as exc:  # yacs asserts on unknown keys here
        raise DAELConfigError(_key_error(exc, engine, "the command line", cfg)) from None
    except ValueError as exc:
        said = str(exc)
        raise DAELConfigError(f"the command line: {said[:300]}{' ...' if len(said) > 300 else ''}") from None
    if not cfg.TRAINER.NAME:
        raise DAELConfigError("no trainer given; pass --trainer DAEL (or DAELDG, SourceOnly, M3SDA, MME, ...)")
    if not str(cfg.DATASET.ROOT).strip():
        raise DAELConfigError(
            "no dataset root given; pass --root DIR (the folder that holds the dataset; the embedded set "
            "is generated there on first use). Nothing is written into the current directory"
        )
    check_run_values(cfg)
    fresh = get_cfg_default() if engine == "dassl" else get_builtin_cfg()
    check_other_node(cfg, add_dael_config(fresh))
    if str(cfg.TRAINER.NAME).upper() in TRAINER_NODES:
        hparams_from_cfg(cfg)  # DAEL's values (weights, switches) before the output folder is made
    if engine == "builtin":
        _check_builtin_values(cfg)
    check_timm_backbone(cfg.MODEL.BACKBONE.NAME)  # before either engine reads any data
    clean_cfg(cfg, cfg.TRAINER.NAME)
    cfg.freeze()
    return cfg


def _check_method_file_fits(method: dict, path: str, trainer: str) -> None:
    """A DAEL method config given to the other DAEL trainer (a DA ``TRAINER.DAEL`` file with
    ``--trainer DAELDG``, or the reverse) would be dropped by ``clean_cfg``: the run would train
    on the defaults without a word."""
    nodes = (
        [k for k in (method.get("TRAINER") or {}) if k in TRAINER_NODES]
        if isinstance(method.get("TRAINER"), dict)
        else []
    )
    if not nodes or trainer.upper() not in TRAINER_NODES or trainer.upper() in nodes:
        return  # (another trainer's own node, e.g. M3SDA's, is that trainer's business)
    setting = "dg" if trainer.upper() == "DAELDG" else "da"
    raise DAELConfigError(
        f"config file {path} configures TRAINER.{nodes[0]}, but --trainer {trainer} reads TRAINER.{trainer.upper()}: "
        f"pass the {trainer} method config (configs/trainers/{setting}/{trainer.lower()}/<dataset>.yaml)"
    )


def _clean_cfg(cfg: CN, trainer: str) -> None:
    for key in list(cfg.TRAINER.keys()):
        if key not in ("NAME", trainer.upper()):
            cfg.TRAINER.pop(key, None)


def _check_builtin_values(cfg: CN) -> None:
    from dael_plugin.builtin.defaults import SUPPORTED_VALUES

    for key, allowed in SUPPORTED_VALUES.items():
        node = cfg
        for part in key.split("."):
            node = node[part]
        if node not in allowed:
            raise DAELConfigError(
                f"{key}={node!r} is not supported by the built-in engine (it supports {list(allowed)}); "
                "change it, or use --engine dassl"
            )


def settings_digest(cfg: CN) -> str:
    """What makes a run this run: its config without the keys that only say how to run it (the same
    ones a resume may change, engine/checkpoint.py), hashed."""
    import hashlib

    from dael_plugin.engine.checkpoint import comparable_config

    return hashlib.sha256(comparable_config(cfg).encode()).hexdigest()[:16]


def _say_config(cfg: CN, extra: str = "") -> None:
    """The whole config (and Dassl's system info) to the run's log file; a few lines on the terminal:
    what trains on what, for how long, and where the rest is written."""
    from dael_plugin.builtin.runlog import log_only

    logged = log_only("** Config **\n" + str(cfg) + "\n" + extra)
    if not logged:
        return
    batch = cfg.DATALOADER.TRAIN_X.BATCH_SIZE
    target = list(cfg.DATASET.TARGET_DOMAINS)
    print(
        f"{cfg.TRAINER.NAME} on {cfg.DATASET.NAME}: sources {list(cfg.DATASET.SOURCE_DOMAINS)} -> target {target}; "
        f"backbone {cfg.MODEL.BACKBONE.NAME}, {cfg.OPTIM.MAX_EPOCH} epoch{'s' if cfg.OPTIM.MAX_EPOCH != 1 else ''} "
        f"of batch {batch} at lr {cfg.OPTIM.LR}, "
        f"seed {cfg.SEED}"
    )
    print(f"the whole config is in {logged}")


def system_info() -> str:
    """The log's system block on the Dassl engine, in place of Dassl's ``collect_env_info``:
    that one runs ``pip list`` and ``nvidia-smi`` in subprocesses at every run start (0.5 s of
    CPU, and what it says is in results.json's provenance anyway)."""
    import platform

    import PIL
    import torch
    import torchvision

    lines = [
        f"Python {platform.python_version()} on {platform.platform()}",
        f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()})",
        f"torchvision {torchvision.__version__}, Pillow {PIL.__version__}",
    ]
    try:
        import dassl

        lines.append(f"Dassl {getattr(dassl, '__version__', '?')} at {os.path.dirname(dassl.__file__)}")
    except ImportError:
        pass
    if torch.cuda.is_available():
        lines += [f"GPU {i}: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    else:
        lines.append(f"no CUDA GPU; {os.cpu_count()} CPUs")
    return "\n".join(lines)


def _run_dassl(cfg: CN, args: argparse.Namespace) -> dict:
    from dassl.engine import build_trainer
    from dassl.utils import set_random_seed, setup_logger

    from dael_plugin.dassl_adapter import prepare_cfg
    from dael_plugin.dassl_adapter.records import eval_freq, with_records

    if cfg.SEED >= 0:
        print(f"Setting fixed seed: {cfg.SEED}")
        set_random_seed(cfg.SEED)
    if distributed.world().is_main:
        setup_logger(cfg.OUTPUT_DIR)
    _say_threads()
    cuda_settings(cfg)  # every trainer, Dassl's baselines too
    _say_config(cfg, "** System info **\n{}\n".format(system_info()))
    prepare_cfg(cfg)  # done by _check_names already; kept for callers of _run_dassl alone
    if args.eval_only or eval_freq(cfg) == 0:
        trainer = build_trainer(cfg)
    else:  # Dassl's baselines write the same per-epoch records as DAEL (dassl_adapter/records.py)
        from dassl.engine import TRAINER_REGISTRY

        print(f"Loading trainer: {cfg.TRAINER.NAME}")
        trainer = with_records(TRAINER_REGISTRY.get(cfg.TRAINER.NAME))(cfg)
    if cfg.TEST.FINAL_MODEL == "best_val" and getattr(trainer, "val_loader", None) is None:
        raise DAELConfigError(_BEST_VAL_WITHOUT_VAL.format(dataset=cfg.DATASET.NAME))
    if bool(cfg.DATASET.get("CATEGORY_SHIFT", False)) and not hasattr(trainer, "classes_held"):
        # Dassl's own trainers (SourceOnly, M3SDA, ...): the same line as the plugin's trainers print
        from dael_plugin.data.classes import classes_by_domain, describe

        dm = trainer.dm
        held = classes_by_domain(dm.dataset.train_x, dm.num_source_domains, dm.num_classes)
        names = [dm.lab2cname.get(i, str(i)) for i in range(dm.num_classes)]
        if distributed.world().is_main:
            print("Category shift: " + "; ".join(describe(held, cfg.DATASET.SOURCE_DOMAINS, names)))
    recorded = {}
    original_test = trainer.test

    def recording_test(*a, **k):
        result = original_test(*a, **k)
        recorded["accuracy"] = result
        return result

    trainer.test = recording_test  # every trainer's final test result reaches results.json
    return {"trainer": trainer, "recorded": recorded}


_BEST_VAL_WITHOUT_VAL = (
    "TEST.FINAL_MODEL best_val: dataset {dataset} has no validation split, so 'best' would be chosen on the "
    "target test set (test leakage); set TEST.FINAL_MODEL last_step"
)


def _setting(trainer) -> str:
    """DA when the run trained on unlabeled target data, else DG (for the tables)."""
    if hasattr(trainer, "is_da"):
        return "DA" if trainer.is_da else "DG"
    from dassl.engine import TrainerXU  # a Dassl baseline

    return "DA" if isinstance(trainer, TrainerXU) and getattr(trainer, "train_loader_u", None) is not None else "DG"


def _check_select(args: argparse.Namespace) -> None:
    from dael_plugin.core.validators import SCORED_PROTOCOLS

    if not args.eval_only:
        raise DAELConfigError(
            f"--select {args.select} goes with --eval-only --model-dir <OUTPUT_DIR of a run> (it evaluates the model "
            "a protocol chose); to choose among finished runs, use scripts/collect.py --select"
        )
    if args.load_epoch is not None:
        raise DAELConfigError("--select and --load-epoch both name the weights to evaluate; pass one")
    if args.select not in SCORED_PROTOCOLS:
        raise DAELConfigError(
            f"--select {args.select}: not a protocol that keeps a model; choose from {', '.join(SCORED_PROTOCOLS)} "
            "(the last epoch's model is the default)"
        )


def _load_for_eval(trainer, engine: str, args: argparse.Namespace) -> Optional[int]:
    """Load the weights to evaluate; returns the checkpoint's epoch count."""
    if not os.path.isdir(args.model_dir):
        raise DAELConfigError(f"--model-dir {args.model_dir} is not a directory; give the OUTPUT_DIR of a run")
    if args.select:
        from dael_plugin.engine.selection import best_name, check_chosen_model

        name = best_name(args.select)
        path = os.path.join(args.model_dir, name)
        if not os.path.lexists(path):
            raise DAELConfigError(
                f"no {path}: that run kept no model for --select {args.select} (it "
                "needs SELECTION.EVAL_FREQ > 0 and the protocol in SELECTION.KEEP_BEST)"
            )
        check_chosen_model(
            path, args.select, args.model_dir, trainer.cfg.SEED, getattr(trainer, "data_fingerprint", None)
        )
        if engine == "dassl" and not getattr(trainer, "selection_built_in", False):  # a Dassl baseline
            from dael_plugin.dassl_adapter.records import load_best

            return load_best(trainer, args.model_dir, args.select)
        return trainer.load_model(args.model_dir, name=name)
    if engine == "dassl":
        from dassl.engine.trainer import TrainerBase

        from dael_plugin.dassl_adapter.trainer import load_dassl_checkpoints

        if type(trainer).load_model is TrainerBase.load_model:  # Dassl's, which crashes on val_result=None
            return load_dassl_checkpoints(trainer, args.model_dir, args.load_epoch)
    return trainer.load_model(args.model_dir, epoch=args.load_epoch)


def _terminate(signum, _frame):
    raise Terminated(signum)


def _worker_terminated(exc: BaseException) -> bool:
    """A data-loader worker stopped by SIGTERM: a scheduler (``scancel``, ``timeout``, a job's
    cgroup) signals every process of the run at once, and the main process can see its worker's
    death (torch's SIGCHLD check) before its own SIGTERM."""
    return "DataLoader worker" in str(exc) and "killed by signal: Terminated" in str(exc)


def _stop_listening(sigchld) -> None:
    """Stopping: a second SIGTERM (the rest of a group-wide one) must not interrupt the cleanup,
    and the loaders' dead workers no longer concern anyone (torch's SIGCHLD check would otherwise
    raise again from wherever the interpreter is, down to its exit hooks).

    ``signal.signal`` first runs the handlers of signals already pending, with the handlers being
    replaced: torch's SIGCHLD check can raise the worker's error from the very call that removes
    it, and a late SIGTERM its ``Terminated``. Each such signal is spent once it has run, so the
    swap is retried until it goes through."""
    for _ in range(64):
        try:
            signal.signal(signal.SIGCHLD, sigchld if sigchld is not None else signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            return
        except Terminated:
            continue
        except RuntimeError as exc:
            if not _worker_terminated(exc):
                raise


PATH_FLAGS = ("root", "output_dir", "resume", "model_dir", "config_file", "dataset_config_file")


def _expand_user(args: argparse.Namespace) -> None:
    """``~`` in every path flag, as a shell would have expanded it unquoted (``--output-dir '~/x'``
    made a folder named ``~`` in the current directory while ``--root`` expanded it)."""
    for name in PATH_FLAGS:
        value = getattr(args, name, None)
        if isinstance(value, str) and value.startswith("~"):
            setattr(args, name, os.path.expanduser(value))


_KEY_LIKE = re.compile(r"^[A-Z][A-Z0-9_]*(\.[A-Z0-9_]+)+$")


def _check_list_flags(args: argparse.Namespace) -> None:
    """A ``KEY VALUE`` pair typed after a list flag is swallowed by it (``--target-domains blend
    OPTIM.MAX_EPOCH 3`` reads three domains): name it, with the two ways to write it."""
    for flag in ("source_domains", "target_domains", "transforms"):
        values = getattr(args, flag, None) or []
        keys = [v for v in values if _KEY_LIKE.match(v)]
        if keys:
            name = "--" + flag.replace("_", "-")
            at = values.index(keys[0])
            raise DAELConfigError(
                f"{name} {' '.join(values)}: {keys[0]!r} is a config key, read as one of {name}'s values because "
                f"{name} takes a list; end the list with -- ({name} {' '.join(values[:at])} -- "
                f"{' '.join(values[at:])}) or put the KEY VALUE pairs last, after a flag that takes one value"
            )


def torch_distributed():
    import torch.distributed

    return torch.distributed


def _oom_types() -> tuple:
    import torch

    return (torch.OutOfMemoryError, MemoryError)


def _out_of_memory(exc: BaseException, state: dict) -> str:
    """One line for an out-of-memory stop: where, and what to lower. A smaller batch is another
    run, so it needs another output directory; the same command resumes this one."""
    import torch

    cfg = state.get("cfg")
    on_gpu = isinstance(exc, torch.OutOfMemoryError)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
    now = ""
    if cfg is not None:
        d = cfg.DATALOADER
        u = d.TRAIN_X.BATCH_SIZE if d.TRAIN_U.SAME_AS_X else d.TRAIN_U.BATCH_SIZE
        now = (
            f" (now DATALOADER.TRAIN_X.BATCH_SIZE {d.TRAIN_X.BATCH_SIZE}, TRAIN_U {u}, TEST {d.TEST.BATCH_SIZE}, "
            f"NUM_WORKERS {d.NUM_WORKERS}, INPUT.SIZE {tuple(cfg.INPUT.SIZE)})"
        )
    lower = (
        "the batch sizes or INPUT.SIZE, or use TRAINER.DAEL.PREC bf16"
        if on_gpu
        else ("the batch sizes, INPUT.SIZE or DATALOADER.NUM_WORKERS")
    )
    return (
        f"out of {'GPU' if on_gpu else 'host'} memory ({first}): lower {lower}{now}; a new setting is another "
        "run, so give it another --output-dir (the same command resumes this one from its last checkpoint)"
    )


def _oom_exit(exc: BaseException, state: dict) -> int:
    line = _out_of_memory(exc, state)
    if state.get("output_dir"):
        write_failure(state["output_dir"], line)
    say(f"error: {line}")
    return EXIT_OOM


def main(argv: Optional[List[str]] = None) -> int:
    from dael_plugin.builtin.runlog import close_logger

    args = build_parser().parse_args(argv)
    _expand_user(args)
    distributed.quiet_unless_main()  # under torchrun, one process speaks on stdout
    state: dict = {}
    # SIGTERM (scancel, preemption, most schedulers, a sweep that ends) stops the run as Ctrl-C does.
    previous = (
        signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread() else None
    )
    previous_int = None
    if previous is not None and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started with SIGINT ignored (a background job of a script, a pytest-xdist worker's child):
        # Python then leaves it ignored, and the sweep's clean stop (SIGINT) would do nothing.
        previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    sigchld = signal.getsignal(signal.SIGCHLD) if previous is not None else None

    def terminated() -> int:
        if previous is not None:
            _stop_listening(sigchld)
        if distributed.world().is_main:  # torchrun stops every rank: one of them says so
            say(f"terminated (SIGTERM): {_where_to_resume(state.get('output_dir'), args.eval_only)}")
        return 143

    try:
        return _main(args, state)
    except Terminated:
        return terminated()
    except ClashError as exc:
        say(f"error: {exc}")
        return EXIT_CLASH
    except BusyError as exc:
        say(f"error: {exc}")
        return EXIT_BUSY
    except DAELConfigError as exc:
        # Under torchrun every rank reads the same command line and data and stops at the same
        # line: rank 0 says it, once (the others exit 2 too, and torchrun's report names them all).
        if distributed.from_env().is_main:
            say(f"error: {exc}")
        return 2
    except NonFiniteLossError as exc:  # every rank stops at the same read; rank 0 says so
        if distributed.world().is_main:
            if state.get("output_dir"):
                write_failure(state["output_dir"], str(exc))
            say(f"error: {exc}")
        return 3
    except KeyboardInterrupt:
        if distributed.world().is_main:
            say(f"interrupted: {_where_to_resume(state.get('output_dir'), args.eval_only)}")
        return 130
    except _oom_types() as exc:
        return _oom_exit(exc, state)
    except (RuntimeError, getattr(torch_distributed(), "DistError", RuntimeError)) as exc:
        if is_host_oom(exc):  # torch's CPU allocator raises a plain RuntimeError
            return _oom_exit(exc, state)
        if _worker_terminated(exc):
            return terminated()
        if not distributed.lost_peer(exc):
            raise
        # Rank 0 says it, once: another rank that lost rank 0 (which stopped with its own line, or
        # died, which torchrun's report names) stays silent rather than add a second, wrong cause.
        if distributed.world().is_main:
            say(f"error: {distributed.lost_peer_line(exc)}")
        return EXIT_LOST_PEER
    finally:
        if state.get("trainer") is not None:  # its loaders' workers, now, not at a later garbage collection
            from dael_plugin.data.batching import release_loaders

            release_loaders(state.pop("trainer"))
        restore_host_memory(state.pop("memory_cap", None))  # in-process callers (tests) get theirs back
        if state.get("lock") is not None:
            state["lock"].release()
        close_logger()
        distributed.finish()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)


def _fingerprint(trainer, cfg: CN) -> dict:
    """The run's data fingerprint (data/fingerprint.py): the plugin's trainers made it when they
    read the data; Dassl's own baselines get it here from their dataset."""
    fp = getattr(trainer, "data_fingerprint", None)
    return fp if fp is not None else dataset_fingerprint(cfg, trainer.dm.dataset)


def _finished(cfg: CN, args: argparse.Namespace, engine: str) -> bool:
    """A run whose ``results.json`` exists is finished: rerunning its command does nothing (and
    says so) unless ``--retrain`` moves its files aside; another engine or config is refused, as
    on resume."""
    from dael_plugin.engine.checkpoint import check_resume_config, load_checkpoint

    out = cfg.OUTPUT_DIR
    record = os.path.join(out, "results.json")
    if not os.path.isfile(record):
        return False
    try:
        with open(record, encoding="utf-8") as f:
            wrote = json.load(f).get("engine")
    except (OSError, ValueError, AttributeError):
        wrote = None
    if not args.retrain and wrote in ENGINES and wrote != engine:
        raise DAELConfigError(
            f"{out} holds a finished run of the {wrote} engine ({record}) and this command runs the {engine} "
            f"engine: pass --engine {wrote} to keep it, or another --output-dir (--retrain replaces it)"
        )
    if args.retrain:
        aside = os.path.join(out, time.strftime("replaced-%Y%m%d-%H%M%S"))
        keep = {".dael_run.lock", ".dael_run.json", "sweep_log.txt", "sweep_job.txt", "sweep_run.json"}
        os.makedirs(aside)
        for name in sorted(os.listdir(out)):
            if name not in keep and not name.startswith("replaced-"):
                shutil.move(os.path.join(out, name), os.path.join(aside, name))
        print(f"dael_plugin: --retrain: the finished run's files moved to {aside}; training from scratch")
        return False
    last = os.path.join(out, LAST)
    if os.path.isfile(last):
        check_resume_config(load_checkpoint(last), cfg, last)  # another config: refused, listing the keys
    print(
        f"dael_plugin: {out} holds a finished run ({record}); nothing to do. Pass --retrain to train it "
        "again (its files move aside), or another --output-dir"
    )
    return True


def _where_to_resume(output_dir: Optional[str], eval_only: bool = False) -> str:
    if eval_only:
        return "the evaluation stopped before its results_eval.json; the model it read is unchanged: rerun it"
    if not output_dir:
        return "nothing was saved"
    path = os.path.join(output_dir, LAST)
    epoch = checkpoint_epoch(path) if os.path.isfile(path) else None
    if epoch is None:
        return f"no epoch finished, so no checkpoint was saved in {output_dir}"
    return f"the last checkpoint is {path} (epoch {epoch}); rerun the same command to resume"


def _say_threads() -> None:
    """Pin and say the CPU thread count (engine/execution.pin_cpu_threads): it changes float sums,
    so the run; said in the log, and recorded in the provenance."""
    print(f"dael_plugin: {pin_cpu_threads()}")


def _check_names(cfg: CN, engine: str) -> None:
    if engine == "dassl":
        from dael_plugin.dassl_adapter.checks import check_run_names

        check_run_names(cfg)
        return
    from dael_plugin.builtin.trainer import TRAINERS
    from dael_plugin.data.folders import check_dataset_files, check_dataset_names

    if cfg.TRAINER.NAME not in TRAINERS:
        close = difflib.get_close_matches(str(cfg.TRAINER.NAME), list(TRAINERS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise DAELConfigError(
            f"trainer {cfg.TRAINER.NAME!r}{hint} is not available on the built-in engine (it has "
            f"{sorted(TRAINERS)}); install Dassl and use --engine dassl for Dassl's baselines"
        )
    check_dataset_names(cfg.DATASET.NAME, cfg.DATASET.SOURCE_DOMAINS, cfg.DATASET.TARGET_DOMAINS)
    check_dataset_files(
        cfg.DATASET.NAME,
        cfg.DATASET.ROOT,
        cfg.DATASET.SOURCE_DOMAINS,
        cfg.DATASET.TARGET_DOMAINS,
        bool(cfg.DATASET.get("CATEGORY_SHIFT", False)),
    )


def _prepare_output_dir(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise DAELConfigError(f"--output-dir {path} exists and is not a directory; pass a folder path")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise DAELConfigError(
            f"--output-dir {path} cannot be created ({exc.strerror or exc}); pass a writable folder"
        ) from None
    if not os.access(path, os.W_OK):
        raise DAELConfigError(f"--output-dir {path} is not writable; pass a writable folder")


def _main(args: argparse.Namespace, state: dict) -> int:
    engine = choose_engine(args.engine)
    if args.eval_each_epoch and engine != "builtin":
        raise DAELConfigError("--eval-each-epoch is a built-in engine flag; with Dassl, look at the final test")
    if args.eval_only and not args.model_dir:
        raise DAELConfigError(
            "--eval-only needs --model-dir <OUTPUT_DIR of a run>; it never reads the current directory"
        )
    if args.select:
        _check_select(args)
    if engine == "dassl":
        import dael_plugin  # noqa: F401  (registers the trainer, datasets and backbones)
    if args.hash_pixels and not args.check_data:
        raise DAELConfigError("--hash-pixels goes with --check-data (it hashes the bytes that check reads)")
    accept_data_change(args.accept_data_change)
    cfg = setup_cfg(args, engine)
    _check_names(cfg, engine)  # before the output folder, the log and the config dump
    if distributed.from_env().distributed and engine == "dassl" and cfg.TRAINER.NAME not in ("DAEL", "DAELDG"):
        raise DAELConfigError(
            f"Dassl's {cfg.TRAINER.NAME} trainer runs on one process only (Dassl has no "
            "multi-process training); run it without torchrun, or, for SourceOnly, with "
            "--engine builtin"
        )
    w = distributed.init(cfg.USE_CUDA)  # under torchrun: join the run's processes (rank 0 writes)
    state["output_dir"] = cfg.OUTPUT_DIR
    state["cfg"] = cfg
    import torch

    if not (cfg.USE_CUDA and torch.cuda.is_available()):  # a GPU run's out-of-memory is already one line
        state["memory_cap"] = cap_host_memory(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), loader_bytes(cfg))
    finished = False
    if w.is_main:
        _prepare_output_dir(cfg.OUTPUT_DIR)
        state["lock"] = RunLock(cfg.OUTPUT_DIR, settings=settings_digest(cfg)).acquire()
        for path in remove_stale_temps(cfg.OUTPUT_DIR):
            print(f"dael_plugin: removed {path}, left by a write that was killed")
        finished = not args.eval_only and not args.no_train and _finished(cfg, args, engine)
    if distributed.from_main(finished):
        return 0
    start = time.time()
    if engine == "dassl":
        run = _run_dassl(cfg, args)
        trainer, recorded = run["trainer"], run["recorded"]
    else:
        from dael_plugin.builtin.runlog import setup_logger
        from dael_plugin.builtin.trainer import build_builtin_trainer, set_random_seed

        if cfg.SEED >= 0:
            print(f"Setting fixed seed: {cfg.SEED}")
            set_random_seed(cfg.SEED)
        if w.is_main:
            setup_logger(cfg.OUTPUT_DIR)
        _say_threads()
        _say_config(cfg)
        trainer = build_builtin_trainer(cfg, eval_each_epoch=args.eval_each_epoch)
        recorded = {}
    state["trainer"] = trainer
    distributed.seed_ranks(cfg.SEED)
    pixels = None
    if args.check_data:
        from dael_plugin.data.check import check_trainer_data

        pixels = check_trainer_data(trainer, engine, cfg.DATALOADER.NUM_WORKERS, args.hash_pixels)
    epochs = None
    if args.eval_only:
        epochs = _load_for_eval(trainer, engine, args)
        acc = trainer.test()
        recorded["accuracy"] = acc
    elif not args.no_train:
        if w.is_main:
            remove_failure(cfg.OUTPUT_DIR)
        trainer.train()
        if engine == "builtin" and not cfg.TEST.NO_TEST:
            recorded["accuracy"] = trainer.last_accuracy
    else:
        return 0
    if not w.is_main:
        return 0
    record = results_record(
        cfg,
        engine,
        recorded.get("accuracy"),
        getattr(trainer, "expert_accuracy", []) or [],
        setting=_setting(trainer),
        wall_seconds=time.time() - start,
        epochs=epochs,
        eval_only=args.eval_only,
        unreadable_images=sorted(getattr(trainer, "bad_images", ()) or ()),
        model_dir=os.path.abspath(args.model_dir) if args.eval_only else None,
        per_class_accuracy=getattr(trainer, "per_class_accuracy", None),
    )
    record["data"] = _fingerprint(trainer, cfg)
    record["data_digest"] = one_digest(record["data"])
    if pixels is not None:
        record["data_pixels_sha256"] = pixels
    if args.eval_only and args.select:  # the model a protocol chose, and at which epoch
        record["selected_by"] = {"protocol": args.select, "epoch": epochs}
    if getattr(trainer, "source_val_info", None) is not None:  # the records' source validation split
        record["source_val_split"] = trainer.source_val_info
    if not args.eval_only:  # the first-step check of the fused pass (CUDA), where this process ran one
        record["fast_path_check"] = getattr(getattr(trainer, "step", None), "fast_path_check", None)
    path = write_results(cfg.OUTPUT_DIR, record, name="results_eval.json" if args.eval_only else "results.json")
    print(f"dael_plugin: wrote {path}")
    return 0


if __name__ == "__main__":  # python -m dael_plugin.tools.train (what sweeps run)
    sys.exit(main())
