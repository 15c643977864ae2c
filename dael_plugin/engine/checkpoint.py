"""Checkpoints shared by both engines: atomic saves, safe loads, RNG states, config checks.

- :func:`save_checkpoint` writes through :mod:`dael_plugin.engine.atomic`, so a run killed
  mid-save, or a full disk, leaves the previous checkpoint whole.
- :func:`load_checkpoint` always uses ``torch.load(..., weights_only=True)``:
  tensors and plain containers only, never pickled code. A file that needs
  more, or that is truncated, is one :class:`CheckpointError` line naming it.
- :func:`rng_state` / :func:`set_rng_state` hold torch, CUDA, numpy and
  Python random states as tensors and numbers, so they load with
  ``weights_only=True`` too.
- :func:`config_diff` lists the keys, between a checkpoint's config and the
  current one, that change training; resume refuses when there are any.

Long because every check a resume or an evaluation makes on a checkpoint (safe load, config,
classes, data, engine, experts' order, RNG states) reads the same state dict, and each refusal must
name the same file in the same words on both engines.
"""

from __future__ import annotations

import collections
import os
import pickle
import random
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import yaml
from yacs.config import CfgNode as CN

from dael_plugin.backbones.record import weights_record
from dael_plugin.backbones.weights import sha256_of as file_sha256
from dael_plugin.config.keys import TRAINER_NODES
from dael_plugin.config.table import DATASET_KEYS, IN_EVERY_CHECKPOINT, KEYS, SELECTION_KEYS, TOP_KEYS
from dael_plugin.core.hparams import ALL_CLASS_MASK_PARTS, CLASS_MASK_PARTS
from dael_plugin.data.items import named_domain
from dael_plugin.engine.atomic import save_torch
from dael_plugin.engine.results_reader import WHERE_AND_HOW_KEYS, flatten, with_execution
from dael_plugin.errors import DAELConfigError

LAST = "checkpoint.pth.tar"  # the "last" checkpoint, rewritten after every epoch
FORMAT = "dael_plugin/2"

# Keys that may differ on resume: where things are, how they are logged or
# evaluated, and how many loader processes there are (each draw is seeded
# from (seed, epoch, position), so the worker count does not change a run).
RESUME_FREE_KEYS = WHERE_AND_HOW_KEYS + ("TEST.",)


# Keys added after a checkpoint was written: what the code that wrote it did without them
# (``legacy`` in config/table.py). A checkpoint without the key is compared with this value.
LEGACY_VALUES = {
    f"TRAINER.{node}.{key.name}": key.legacy
    for node in TRAINER_NODES
    for key in KEYS
    if key.legacy is not IN_EVERY_CHECKPOINT
}
LEGACY_VALUES.update({key.name: key.legacy for key in TOP_KEYS})
LEGACY_VALUES.update({f"DATASET.{key.name}": key.legacy for key in DATASET_KEYS})
LEGACY_VALUES.update({f"SELECTION.{key.name}": key.legacy for key in SELECTION_KEYS})
# Dassl's keys the built-in engine took up later (Dassl's checkpoints have always held them)
LEGACY_VALUES.update({"MODEL.INIT_WEIGHTS": "", "DATALOADER.K_TRANSFORMS": 1})


class CheckpointError(DAELConfigError):
    """A checkpoint that cannot or must not be loaded; the message names the file."""


def save_checkpoint(state: dict, path: str) -> str:
    """Write ``state`` to ``path`` atomically (:mod:`dael_plugin.engine.atomic`: temporary file, fsync,
    rename; a full disk is one line and leaves the previous checkpoint whole)."""
    return save_torch(path, state)


RESUME_FIX = "delete it to start this run fresh, or restore it from a backup"


def _kind(path: str) -> Optional[str]:
    """What ``path`` holds when it is plainly no PyTorch checkpoint (None when it may be one): a
    checkpoint is a zip archive (``PK``) or, in the legacy format, a pickle (``0x80``)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        return "an empty file"
    if head.startswith(b"PK") or head[:1] == b"\x80":
        return None
    try:
        head.decode("ascii")
        return "a text file"
    except UnicodeDecodeError:
        return f"a file that starts with bytes {head.hex()}"


def load_checkpoint(path: str, map_location: str | torch.device = "cpu", fix: str = RESUME_FIX) -> dict:
    """Load with ``weights_only=True``, to the CPU unless told otherwise (``load_state_dict`` moves
    tensors where their module lives); every failure is one line naming ``path``, with ``fix``
    where the file is damaged (the caller knows whether a fresh start or a rerun is the remedy)."""
    if os.path.lexists(path) and not os.path.isfile(path):
        raise CheckpointError(f"{path} is not a regular file (a FIFO, a device or a folder); move it away")
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path} not found")
    kind = _kind(path)
    if kind is not None:
        raise CheckpointError(f"{path} is not a PyTorch checkpoint ({kind}); {fix}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "Weights only load failed" in str(exc) or "Unsupported" in str(exc) or "global" in str(exc):
            raise CheckpointError(
                f"refusing to load {path}: it holds pickled Python objects beyond tensors and plain "
                "containers, which could run code; load only checkpoints written by dael-plugin or "
                "Dassl, or re-save its tensors with torch.save(state_dict)"
            ) from None
        raise CheckpointError(f"{path} is not a readable checkpoint ({first}); {fix}") from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path} is truncated or corrupt ({first}); {fix}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a checkpoint dict")
    return state


# -- random-number states --------------------------------------------------
def rng_state() -> Dict[str, object]:
    """torch, CUDA, numpy and Python random states, as tensors and numbers."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, py_gauss = random.getstate()
    state: Dict[str, object] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": {"version": int(version), "state": torch.tensor(internal, dtype=torch.int64), "gauss": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, object]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["state"].tolist()), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- scheduler states: loadable with weights_only on every supported torch ---------
def counters_to_dicts(sd: dict) -> dict:
    """``Counter`` values (``MultiStepLR``'s milestones) as dicts, named in ``_dael_counters``:
    torch before 2.4 refuses a ``Counter`` in a weights-only load."""
    sd = dict(sd)
    counters = [k for k, v in sd.items() if isinstance(v, collections.Counter)]
    for k in counters:
        sd[k] = dict(sd[k])
    if counters:
        sd["_dael_counters"] = counters
    return sd


def restore_counters(sd: dict) -> dict:
    sd = dict(sd)
    for k in sd.pop("_dael_counters", []):
        sd[k] = collections.Counter(sd[k])
    return sd


def sched_state(sched: torch.optim.lr_scheduler.LRScheduler) -> dict:
    """The scheduler's state as plain containers: a successor scheduler (Dassl's warmup) as its
    own state, and ``Counter`` values as dicts (:func:`counters_to_dicts`)."""
    sd = dict(sched.state_dict())
    if "successor" in sd and hasattr(sd["successor"], "state_dict"):
        sd["successor"] = sched_state(sd["successor"])
    return counters_to_dicts(sd)


def load_sched_state(sched: torch.optim.lr_scheduler.LRScheduler, sd: dict) -> None:
    sd = restore_counters(sd)
    successor = sd.pop("successor", None)
    if isinstance(successor, dict) and hasattr(sched, "successor"):
        load_sched_state(sched.successor, successor)
        sd["successor"] = sched.successor
    sched.load_state_dict(sd)


# -- config ----------------------------------------------------------------
def comparable_config(cfg: CN, free: Iterable[str] = RESUME_FREE_KEYS) -> str:
    """The config's training-relevant keys as sorted ``KEY=value`` lines: two runs with the same
    text are one run (the keys a resume may change, ``free``, are left out)."""
    now = flatten(yaml.safe_load(cfg.dump()) or {})
    free = tuple(free)
    keep = [k for k in sorted(now) if not any(k == f or (f.endswith(".") and k.startswith(f)) for f in free)]
    return "\n".join(f"{k}={now[k]!r}" for k in keep)


def _class_mask_parts(value: object) -> object:
    """``CLASS_MASKS`` as the parts it turns on, in one order: ``['all']`` and the four parts are one
    setting; a checkpoint written while the key was one bool (before its parts were switches) held False or
    True (all)."""
    if isinstance(value, bool):
        return list(ALL_CLASS_MASK_PARTS) if value else []
    if isinstance(value, (list, tuple)):
        parts = [str(p) for p in value]
        return (
            list(ALL_CLASS_MASK_PARTS)
            if parts == ["all"]
            else [p for p in CLASS_MASK_PARTS if p in parts] + sorted(p for p in parts if p not in CLASS_MASK_PARTS)
        )
    return value


def config_diff(saved_yaml: str, cfg: CN, free: Iterable[str] = RESUME_FREE_KEYS) -> List[Tuple[str, object, object]]:
    """``(key, checkpoint value, current value)`` for each training-relevant difference."""
    saved = flatten(yaml.safe_load(saved_yaml) or {})
    now = flatten(yaml.safe_load(cfg.dump()) or {})
    for key, value in LEGACY_VALUES.items():
        if key in now and key not in saved:
            saved[key] = value
    saved, now = with_execution(saved), with_execution(now)  # EXECUTION.* once, whichever spelling
    own = f"TRAINER.{str(now.get('TRAINER.NAME', '')).upper()}."
    for key in now:  # another trainer's node, added to the engine later, cannot change this run
        if key not in saved and key.startswith("TRAINER.") and key.count(".") == 2 and not key.startswith(own):
            saved[key] = now[key]
    for flat in (saved, now):
        for node in TRAINER_NODES:
            key = f"TRAINER.{node}.CLASS_MASKS"
            if key in flat:
                flat[key] = _class_mask_parts(flat[key])
    free = tuple(free)
    out = []
    for key in sorted(set(saved) | set(now)):
        if any(key == f or (f.endswith(".") and key.startswith(f)) for f in free):
            continue
        if saved.get(key, "<absent>") != now.get(key, "<absent>"):
            out.append((key, saved.get(key, "<absent>"), now.get(key, "<absent>")))
    return out


def check_resume_config(state: dict, cfg: CN, path: str) -> None:
    """Refuse a resume whose config changes training; the message lists the keys."""
    saved = state.get("config")
    if not isinstance(saved, str):
        return
    diff = config_diff(saved, cfg)
    moved = state.get("source_model") or {}
    if any(k == "MODEL.INIT_WEIGHTS" for k, _, _ in diff) and moved.get("sha256"):
        now = str(cfg.MODEL.INIT_WEIGHTS)
        if now and os.path.isfile(now) and file_sha256(now) == moved["sha256"]:  # the same file, moved
            diff = [d for d in diff if d[0] != "MODEL.INIT_WEIGHTS"]
    check_same_weights(state, cfg, path)
    was = state.get("trainer")
    if was and str(was) != str(cfg.TRAINER.NAME):  # another method into this folder: say that first
        done = isinstance(state.get("epoch"), int) and state["epoch"] >= int(cfg.OPTIM.MAX_EPOCH)
        raise CheckpointError(
            f"{path} is a {was} run{' that finished' if done else ''} ({state.get('epoch', '?')} epochs), not "
            f"{cfg.TRAINER.NAME}: pass another --output-dir for the {cfg.TRAINER.NAME} run"
        )
    if diff:
        shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diff[:8])
        more = f" (and {len(diff) - 8} more)" if len(diff) > 8 else ""
        raise CheckpointError(
            f"cannot resume from {path}: the config differs from the checkpoint's in {shown}{more}; "
            "rerun with the checkpoint's settings to resume, or pass a new --output-dir to start fresh"
        )


def check_same_weights(state: dict, cfg: CN, path: str) -> None:
    """Refuse a resume where the file the backbone started from now holds other weights: training
    goes on from the checkpoint's, so the run's record would name weights it never read."""
    saved = state.get("backbone_weights")
    if not isinstance(saved, dict) or not saved.get("sha256") or not saved.get("file"):
        return  # a checkpoint from before the record, or a random start
    b = cfg.MODEL.BACKBONE
    engine = str(state.get("engine") or "builtin")
    now = weights_record(str(b.NAME), bool(b.get("PRETRAINED", False)), str(b.get("WEIGHTS", "") or ""), engine)
    if now.get("sha256") and now["sha256"] != saved["sha256"]:
        raise CheckpointError(
            f"cannot resume from {path}: the run started from the weights in {saved['file']} (sha256 "
            f"{saved['sha256'][:12]}), and {now.get('file')} now holds others (sha256 {now['sha256'][:12]}); "
            "put the run's file back to resume, or pass a new --output-dir to start fresh"
        )


def checkpoint_epoch(path: str) -> Optional[int]:
    """The completed-epoch count stored in ``path``, or None when it cannot be read."""
    try:
        return int(load_checkpoint(path).get("epoch"))
    except (DAELConfigError, TypeError, ValueError):
        return None


def saved_seed(state: dict) -> Optional[int]:
    """The SEED the run of a loaded checkpoint ran with (its recorded config), or None where none
    is recorded or the config does not parse (the resume's or evaluation's own checks say why)."""
    try:
        seed = (yaml.safe_load(state.get("config") or "") or {}).get("SEED")
    except (yaml.YAMLError, AttributeError):
        return None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 else None


# -- what an evaluation loads ------------------------------------------------
_FAMILIES = ({"DAEL", "DAELDG"},)


def _family(trainer: str) -> str:
    name = str(trainer).upper()
    return next(("/".join(sorted(f)) for f in _FAMILIES if name in f), name)


def check_loaded_run(
    state: dict, cfg: CN, path: str, engine: str, classnames: Optional[Sequence[str]] = None
) -> Optional[List[int]]:
    """Compare a checkpoint with the run that loads it for evaluation: which engine wrote it, the
    trainer, the backbone, the classes and the source domains. A mismatch is one line naming the
    file. Sources in another order are mapped by name: returns, for each of this run's experts,
    the index of the checkpoint's expert of the same domain (None when the order is the same)."""
    writer = state.get("engine")
    if writer is not None and writer != engine:
        raise CheckpointError(f"{path} was written by the {writer} engine; evaluate it with --engine {writer}")
    saved = yaml.safe_load(state.get("config") or "") or {}
    if not saved:
        return None  # written before checkpoints held their config: nothing to compare
    checks = [
        ("trainer", _family(saved.get("TRAINER", {}).get("NAME", "")), _family(cfg.TRAINER.NAME)),
        (
            "backbone (MODEL.BACKBONE.NAME)",
            saved.get("MODEL", {}).get("BACKBONE", {}).get("NAME"),
            cfg.MODEL.BACKBONE.NAME,
        ),
    ]
    if classnames is not None and state.get("classnames") is not None:
        checks.append(("classes", list(state["classnames"]), list(classnames)))
    for what, was, now in checks:
        if was != now:
            raise CheckpointError(
                f"{path} holds a run with another {what} ({was!r}, this run {now!r}); "
                "evaluate it with the settings of the run that wrote it"
            )
    was = list(saved.get("DATASET", {}).get("SOURCE_DOMAINS", []))
    now = list(cfg.DATASET.SOURCE_DOMAINS)
    if sorted(was) != sorted(now):
        raise CheckpointError(
            f"{path} has experts for source domains {was}, not {now}; pass --source-domains {' '.join(was)}"
        )
    if was == now:
        return None
    print(f"dael_plugin: {path} has its experts in the order {was}; mapped by domain name to {now}")
    return [was.index(d) for d in now]


def load_weights(module: torch.nn.Module, weights: dict, path: str, what: str = "this model") -> None:
    """``module.load_state_dict(weights)`` read from ``path`` for evaluation or resume, on either
    engine: weights that do not fit (other keys or shapes) are one line naming the file."""
    try:
        module.load_state_dict(weights)
    except (KeyError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0][:200]
        raise CheckpointError(
            f"{path} does not fit {what} ({first}); check --trainer and MODEL.BACKBONE.NAME against the run "
            "that wrote it"
        ) from None


def reorder_experts(head_state: dict, order: Optional[List[int]]) -> dict:
    """The expert heads' state (``weight`` (K, C, D), ``bias`` (K, C)) with its experts in ``order``."""
    if order is None:
        return head_state
    index = torch.tensor(order)
    return {
        k: (v.index_select(0, index) if k in ("weight", "bias") and v.dim() >= 2 and v.shape[0] == len(order) else v)
        for k, v in head_state.items()
    }


# -- the run state both engines save and resume ---------------------------------------
def gather_rng() -> list:
    """Every process's RNG states, in rank order (called by all processes, before rank 0 saves)."""
    from dael_plugin.engine.distributed import gather_objects

    return gather_objects(rng_state())


RESUME_ONLY = ("optim", "sched", "optims", "scheds", "rng", "rng_ranks", "scaler")


def model_state(state: dict) -> dict:
    """A run state without what only a resume reads (optimiser, schedulers, RNG, fp16's scaler):
    a protocol's chosen model, for evaluation and shipping, at about a third of the size with SGD's
    momentum. It loads for ``--eval-only`` as the last checkpoint does."""
    return {k: v for k, v in state.items() if k not in RESUME_ONLY}


@dataclass(frozen=True)
class RunId:
    """What makes a checkpoint this run's: :func:`run_state` writes it and :func:`read_resumable`
    refuses a checkpoint that differs (another engine, a config key that shapes the run, other
    classes, other training images per domain or another data fingerprint)."""

    engine: str
    cfg: Any
    classnames: Sequence[str]
    train_counts: Optional[Dict[str, int]] = None
    data_fingerprint: Optional[dict] = None


def run_state(
    run: RunId,
    epochs_done: int,
    bad_images: Iterable[str],
    data: dict,
    scaler: Any = None,
    rng_ranks: Optional[list] = None,
    **weights: Any,
) -> dict:
    """A "last" checkpoint: the engine's ``weights`` (model, optimiser and scheduler states, by the
    engine's own keys) plus what exact resume needs, the same for both engines: the format, the
    RNG states, the config, the data pipeline's state, the unreadable images and fp16's scaler."""
    from dael_plugin.engine.distributed import world

    rng_ranks = rng_ranks if rng_ranks is not None else [rng_state()]
    engine, cfg = run.engine, run.cfg
    state = {
        "format": FORMAT,
        "engine": engine,
        "trainer": cfg.TRAINER.NAME,
        "epoch": epochs_done,
        **weights,
        "rng": rng_ranks[0],
        "config": cfg.dump(),
        "backbone_weights": weights_record(
            str(cfg.MODEL.BACKBONE.NAME),
            bool(cfg.MODEL.BACKBONE.get("PRETRAINED", False)),
            str(cfg.MODEL.BACKBONE.get("WEIGHTS", "") or ""),
            engine,
        ),
        "data": data,
        "bad_images": sorted(bad_images),
        "classnames": list(run.classnames),
        "world_size": world().size,
    }
    if run.train_counts is not None:  # training images per domain: a resume onto other data is refused
        state["train_counts"] = dict(run.train_counts)
    if run.data_fingerprint is not None:  # which images, per split and domain (data/fingerprint.py)
        state["data_fingerprint"] = run.data_fingerprint
    if len(rng_ranks) > 1:  # each process's own streams (device views, dropout) continue on resume
        state["rng_ranks"] = rng_ranks
    if scaler is not None:  # fp16's loss scale and its growth counter: resume continues them
        state["scaler"] = scaler.state_dict()
    if _DATA_CHANGES:  # a resume onto changed data, accepted: every later checkpoint carries it
        state["data_changes"] = data_changes()
    return state


def read_resumable(path: str, run: RunId, needs: Sequence[str]) -> dict:
    """Load a "last" checkpoint for exact resume, or refuse it in one line: another engine's, an
    older format, one without ``needs``, or one whose config differs in a key that shapes the run.

    Everything loads to the CPU: the RNG states, NumPy's keys and the loaders' generator states
    must stay CPU tensors, and ``load_state_dict`` moves weights and optimiser states to their
    parameters' device."""
    state = load_checkpoint(path)
    engine = run.engine
    if state.get("engine") not in (None, engine):
        raise CheckpointError(
            f"{path} was written by the {state['engine']} engine; resume it with "
            f"--engine {state['engine']}, or pass a new --output-dir"
        )
    missing = [k for k in ("rng", *needs) if k not in state]
    if state.get("format") != FORMAT or missing:
        raise CheckpointError(
            f"{path} was written by an older dael-plugin or another engine and cannot be "
            "resumed exactly; pass a new --output-dir to start fresh (it still loads with "
            "--eval-only)"
        )
    check_resume_config(state, run.cfg, path)
    check_same_data(state, path, run.classnames, run.train_counts, run.data_fingerprint)
    from dael_plugin.engine.distributed import world

    saved, now = int(state.get("world_size", 1)), world().size
    if saved != now:
        raise CheckpointError(
            f"{path} was written by a run on {saved} process(es) and this run has {now}; "
            f"resume it with torchrun --nproc_per_node {saved}"
            + (" (or without torchrun)" if saved == 1 else "")
            + ", or pass a new --output-dir"
        )
    return state


def train_counts(
    sources: Sequence[str], x_domains: Iterable[int], targets: Sequence[str], n_target: Optional[int]
) -> Dict[str, int]:
    """Training images per source domain (``x_domains``: each labeled image's source index) and of
    the target's unlabeled split where a DA run reads it: what a resume compares."""
    counts = {str(s): 0 for s in sources}
    for d in x_domains:
        counts[str(sources[named_domain(d, sources)])] += 1
    if n_target is not None:
        counts["target " + "+".join(str(t) for t in targets)] = int(n_target)
    return counts


def _names(items: Sequence[str]) -> str:
    return ", ".join(repr(i) for i in list(items)[:5]) + (" ..." if len(items) > 5 else "")


# ``--accept-data-change``: resume onto images that changed (never onto changed classes)
_ACCEPT_DATA_CHANGE = [False]


# The data changes a resume accepted in this run's history (each: the epoch it resumed from, what
# changed): carried in every later checkpoint and written to results.json, so a result trained on
# two versions of the data says so however often it was resumed since.
_DATA_CHANGES: List[dict] = []


def accept_data_change(accept: bool) -> None:
    """``--accept-data-change`` for this run (set at its start, which also forgets an earlier
    run's changes in this process)."""
    _ACCEPT_DATA_CHANGE[0] = bool(accept)
    _DATA_CHANGES.clear()


def data_changes() -> List[dict]:
    """The accepted data changes of this run so far (see ``_DATA_CHANGES``)."""
    return [dict(c) for c in _DATA_CHANGES]


def check_same_data(
    state: dict,
    path: str,
    classnames: Optional[Sequence[str]],
    train_counts: Optional[Dict[str, int]],
    data_fingerprint: Optional[dict] = None,
) -> None:
    """A resume onto the data its checkpoint was trained on, or one line: a class renamed, added or
    removed would silently permute or break the labels (label i is the i-th class folder), and
    images added, removed or relabelled change every later draw. ``--accept-data-change`` lets a
    resume go on with changed images (the line is then a warning); changed classes, never."""
    fix = "restore the data as it was, or pass a new --output-dir to start fresh"
    saved = state.get("classnames")
    if classnames is not None and saved is not None and list(saved) != list(classnames):
        was, now = list(saved), list(classnames)
        gone, new = [c for c in was if c not in now], [c for c in now if c not in was]
        what = (
            f"class folders gone: {_names(gone)}; new: {_names(new)}"
            if gone or new
            else "the same class folders in another order"
        )
        raise CheckpointError(
            f"cannot resume from {path}: its run was trained on {len(was)} classes and the data now has "
            f"{len(now)} ({what}); labels would change meaning; {fix}"
        )
    from dael_plugin.data.fingerprint import fingerprint_changes

    earlier = state.get("data_changes")
    _DATA_CHANGES[:] = [dict(c) for c in earlier if isinstance(c, dict)] if isinstance(earlier, list) else []
    counts = state.get("train_counts")
    changed = []
    if train_counts is not None and counts is not None and dict(counts) != dict(train_counts):
        changed = [f"{d} {counts.get(d)} -> {n}" for d, n in train_counts.items() if counts.get(d) != n]
    saved_fp = state.get("data_fingerprint")
    if data_fingerprint is not None and saved_fp is not None:
        changed = fingerprint_changes(saved_fp, data_fingerprint) or changed
    if not changed:
        return
    line = f"the images changed since {path} was written ({'; '.join(changed[:3])}{' ...' if len(changed) > 3 else ''})"
    if _ACCEPT_DATA_CHANGE[0]:
        print(f"dael_plugin: warning: {line}; resuming anyway (--accept-data-change): not the same draws")
        _DATA_CHANGES.append({"resumed_at_epoch": int(state.get("epoch", 0)), "changes": [str(c) for c in changed]})
        return
    raise CheckpointError(
        f"cannot resume: {line}; the resumed run would not continue the same draws; {fix}, or pass "
        "--accept-data-change to resume on the data as it is now"
    )


def restore_run_state(state: dict, path: str, scaler: Any, bad_images: set) -> int:
    """Put back the RNG states, fp16's scaler and the unreadable images; returns the epochs done."""
    from dael_plugin.engine.distributed import world

    set_rng_state(state["rng_ranks"][world().rank] if "rng_ranks" in state else state["rng"])
    if scaler is not None and "scaler" in state:
        scaler.load_state_dict(state["scaler"])
    bad_images.update(state.get("bad_images", []))
    print(f"Found checkpoint at {path} (will resume training from epoch {state['epoch'] + 1})")
    return int(state["epoch"])
