"""The ``EXECUTION`` node: how a step runs, for every trainer (``engine/strategy.py``), read from
the one key table (``config/table.py``) with DAEL's node's older spellings
(``TRAINER.DAEL.*`` / ``TRAINER.DAELDG.*``) and each trainer's own choices."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Dict, Optional

from yacs.config import CfgNode as CN

from dael_plugin.config.table import (
    BY_NAME,
    DAEL_STEP_KEYS,
    DEFAULTS,
    EXECUTION_DEFAULTS,
    EXECUTION_KEYS,
    TRAINER_NODES,
)
from dael_plugin.errors import DAELConfigError


@dataclass(frozen=True)
class Execution:
    """How the step runs (the ``execution`` keys of ``config/table.py``), with their defaults."""

    fuse_chunks: bool = DEFAULTS["FUSE_CHUNKS"]
    chunk_bn: str = DEFAULTS["CHUNK_BN"]
    prec: str = DEFAULTS["PREC"]
    channels_last: bool = DEFAULTS["CHANNELS_LAST"]
    compile: str = DEFAULTS["COMPILE"]
    fused_optim: bool = DEFAULTS["FUSED_OPTIM"]
    aug_on_device: bool = DEFAULTS["AUG_ON_DEVICE"]


assert {f.name for f in fields(Execution)} == {k.field for k in EXECUTION_KEYS}, "an execution key without a field"


# Measured: on torch 2.4 the compiled fused pass normalises the whole batch at once (dynamo
# ignores the batch-norm layers' chunk settings); 2.5, 2.6, 2.7 and 2.14 give eager's numbers.
COMPILE_FUSED_MIN_TORCH = "2.5"


def check_execution(prec: str, compile_mode: str, prefix: str, fuse_chunks: bool = False) -> None:
    """The execution keys' values, and what the installed torch can run of them."""
    import torch

    for key, value in (("PREC", prec), ("COMPILE", compile_mode)):
        if value not in BY_NAME[key].choices:
            raise DAELConfigError(f"{prefix}.{key}={value!r} is invalid; use one of {list(BY_NAME[key].choices)}")
    if compile_mode != "none" and fuse_chunks and torch.__version__ < COMPILE_FUSED_MIN_TORCH:
        raise DAELConfigError(
            f"{prefix}.COMPILE with the fused pass needs torch >= {COMPILE_FUSED_MIN_TORCH} (this is "
            f"{torch.__version__}, whose compiled fused pass normalises the whole batch at once); "
            f"set {prefix}.FUSE_CHUNKS False or {prefix}.COMPILE none, or upgrade torch"
        )


# Each trainer's own choice of the ``own`` execution keys (EXECUTION's None): DAEL's step was
# measured with them on; a trainer that states nothing runs as Dassl's trainers do.
PLAIN_EXECUTION: Dict[str, bool] = {"CHANNELS_LAST": False, "FUSED_OPTIM": False}


# A trainer's Execution with nothing set: how Dassl's trainers run (PLAIN_EXECUTION's choices).
PLAIN_RUN = Execution(**{BY_NAME[k].field: v for k, v in PLAIN_EXECUTION.items()})


def _execution_values(cfg: CN, own: Optional[Dict[str, bool]]) -> Dict[str, object]:
    """Each execution key's value: ``EXECUTION.<KEY>`` where set, else the trainer node's older
    spelling (``TRAINER.DAEL.<KEY>`` / ``TRAINER.DAELDG.<KEY>``: DAEL's node, whose defaults are
    DAEL's own choices), else the trainer's own choice (``own``, for the keys whose EXECUTION
    default is None) or the default. The two spellings set to different values are one line."""
    name = str(cfg.TRAINER.NAME).upper()
    alias = cfg.TRAINER.get(name) if name in TRAINER_NODES else None
    top = cfg.get("EXECUTION")
    own = dict(PLAIN_EXECUTION if own is None else own)
    values = {}
    for key in EXECUTION_KEYS:
        raw = top.get(key.name, EXECUTION_DEFAULTS[key.name]) if top is not None else None
        given = raw is not None and raw != EXECUTION_DEFAULTS[key.name]
        mine = key.read(top) if given else None
        older = key.read(alias) if alias is not None and key.name in alias else None
        older_given = older is not None and older != key.default
        if given and older_given and mine != older:
            raise DAELConfigError(
                f"EXECUTION.{key.name}={mine!r} and TRAINER.{name}.{key.name}={older!r} disagree (the second is "
                f"the older spelling of the first): set one of them"
            )
        if given:
            values[key.name] = mine
        elif older is not None:  # DAEL's node: its value (for an own key, DAEL's own choice)
            values[key.name] = older
        elif key.own:
            values[key.name] = bool(own.get(key.name, key.default))
        else:
            values[key.name] = key.default
        if key.choices and values[key.name] not in key.choices:
            spelling = f"EXECUTION.{key.name}" if given else f"TRAINER.{name}.{key.name}"
            raise DAELConfigError(f"{spelling}={values[key.name]!r} is invalid; use one of {list(key.choices)}")
    return values


def execution_from_cfg(cfg: CN, own: Optional[Dict[str, bool]] = None, trainer: str = "") -> Execution:
    """The run's :class:`Execution` (``EXECUTION.*``, for every trainer; ``own``: the trainer's
    choices where EXECUTION says None, see :func:`_execution_values`). ``trainer``: the name to
    give in the one line that refuses DAEL's step keys to a trainer without that step."""
    values = _execution_values(cfg, own)
    e = Execution(**{BY_NAME[k].field: v for k, v in values.items()})
    check_execution(e.prec, e.compile, "EXECUTION", e.fuse_chunks)
    if trainer:
        for k in DAEL_STEP_KEYS:
            if values[k] != BY_NAME[k].default:
                raise DAELConfigError(
                    f"EXECUTION.{k}={values[k]!r}: {trainer} has no DAEL step (its per-domain chunks and views "
                    f"on the device), which the key sets; remove it"
                )
    return e


def resolve_execution(cfg: CN, own: Optional[Dict[str, bool]] = None, trainer: str = "") -> Execution:
    """:func:`execution_from_cfg`, written back into ``EXECUTION`` (and the trainer node's older
    spellings), before the config is frozen: the run's record and its checkpoint hold the values
    it ran with, whichever spelling set them."""
    e = execution_from_cfg(cfg, own, trainer)
    name = str(cfg.TRAINER.NAME).upper()
    for key in EXECUTION_KEYS:
        value = getattr(e, key.field)
        cfg.EXECUTION[key.name] = value
        if name in TRAINER_NODES and name in cfg.TRAINER and key.name in cfg.TRAINER[name]:
            cfg.TRAINER[name][key.name] = value
    return e
