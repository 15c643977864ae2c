"""The one reader of run records (``results.json``), for tables and figures alike.

A sweep's folders hold one record per finished run. :func:`read_records`
walks a folder and returns the records it can read, plus, for each file it
cannot (truncated, not JSON, not a mapping, no accuracy: engine/record_checks.py), a :class:`Problem`
naming it: one bad file never costs the table or the figures, and it is never
silently dropped either. :func:`setting_key` says which runs share a
setting: everything in the merged config that changes a result, except the
seed and the target (and the sources that go with it; runs of one setting on other
sources for one target are told apart by the domains each read, :func:`row_labels`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from dael_plugin.engine.record_checks import read_record

RESULTS = "results.json"
FAILED = "failed.json"
# A sweep's files in each run folder (tools/sweep_plan.py, tools/launchers.py)
LOG = "sweep_log.txt"  # a run's stdout and stderr, in its directory
JOB = "sweep_job.txt"  # the Slurm job id a run was last submitted as
IDENTITY = "sweep_run.json"  # everything that changes the run's result: a relaunch must match it

# Config keys of where a run's files are and how it logs, never of what it computes (each draw is
# seeded from (seed, epoch, position), so the worker count does not change a run either); the
# resume comparison leaves them out too (engine/checkpoint.py's RESUME_FREE_KEYS).
WHERE_AND_HOW_KEYS = (
    "OUTPUT_DIR",
    "RESUME",
    "DATASET.ROOT",
    "VERBOSE",
    "USE_CUDA",
    "DATALOADER.NUM_WORKERS",
    "DATALOADER.TEST.",
    "TRAIN.PRINT_FREQ",
    "TRAIN.CHECKPOINT_FREQ",
)
# What a run recorded before the top-level EXECUTION node ran with, key by key: DAEL's node's
# older spelling (TRAINER.DAEL.* / TRAINER.DAELDG.*) where the record has it, else these (every
# other trainer ran so; tests/test_strategy.py holds them to config/table.py's legacy values).
EXECUTION_BEFORE = {
    "FUSE_CHUNKS": True,
    "CHUNK_BN": "auto",
    "PREC": "fp32",
    "CHANNELS_LAST": False,
    "COMPILE": "none",
    "FUSED_OPTIM": False,
    "AUG_ON_DEVICE": False,
}


def with_execution(flat: Dict[str, object]) -> Dict[str, object]:
    """A flattened config with ``EXECUTION.*`` as the run ran, for a record or checkpoint written
    before the node existed (and the older spellings left out: the node says it once)."""
    own = f"TRAINER.{str(flat.get('TRAINER.NAME', '')).upper()}."
    out = dict(flat)
    for name, before in EXECUTION_BEFORE.items():
        if out.get(f"EXECUTION.{name}") is None:  # absent, or the trainer's own (not yet resolved)
            out[f"EXECUTION.{name}"] = flat.get(own + name, before)
        for node in ("TRAINER.DAEL.", "TRAINER.DAELDG."):
            out.pop(node + name, None)
    return out


# Config keys that never change a run's result, or that tell runs of one setting apart.
NOT_SETTING = ("SEED", "DATASET.SOURCE_DOMAINS", "DATASET.TARGET_DOMAINS") + WHERE_AND_HOW_KEYS


@dataclass
class Record:
    path: str  # the results.json
    data: dict

    @property
    def dir(self) -> str:
        return os.path.dirname(self.path)

    @property
    def target(self) -> str:
        return ",".join(self.data.get("target_domains") or [])

    @property
    def config(self) -> dict:
        """The run's merged config (``provenance.config``), or {} for records without one."""
        if "_config" not in self.__dict__:
            import yaml

            text = (self.data.get("provenance") or {}).get("config")
            try:
                self.__dict__["_config"] = (yaml.safe_load(text) or {}) if text else {}
            except yaml.YAMLError:
                self.__dict__["_config"] = {}
        return self.__dict__["_config"]


@dataclass
class Problem:
    path: str
    why: str

    def warning(self) -> str:
        return f"warning: skipping {self.path}: {self.why}"


@dataclass
class Walk:
    records: List[Record] = field(default_factory=list)
    problems: List[Problem] = field(default_factory=list)
    failed: List[str] = field(default_factory=list)  # folders with failed.json and no record
    pending: List[str] = field(default_factory=list)  # sweep run folders with neither


def read_records(root: str) -> Walk:
    """Every run record under ``root`` (sorted by path), the files that are not, and the sweep
    run folders without a record (failed or not finished)."""
    out = Walk()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not d.startswith("replaced-"))
        if RESULTS in filenames:
            path = os.path.join(dirpath, RESULTS)
            data, why = read_record(path)
            if why is not None:
                out.problems.append(Problem(path, why))
            else:
                out.records.append(Record(path, data))
        elif FAILED in filenames:
            out.failed.append(dirpath)
        elif LOG in filenames:
            out.pending.append(dirpath)
    return out


def setting_of(data: dict) -> str:
    """DA or DG, as the run's record says (the trainer's ``uses_target`` and the data); a record from
    before the run integrity work, which says neither, was DG for these two trainers alone."""
    return data.get("setting") or ("DG" if data.get("trainer") in ("DAELDG", "Vanilla") else "DA")


def flatten(d, prefix: str = "") -> Dict[str, object]:
    """A nested mapping (a config read from YAML or JSON) by dotted key."""
    flat: Dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update(flatten(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def weights_identity(record: Optional[dict]) -> Optional[str]:
    """A short name for the weights a ``backbone_weights`` record says a run started from (collect
    keeps runs of other weights in other rows); None for a record without one."""
    if not isinstance(record, dict):
        return None
    if record.get("sha256"):
        return f"sha256:{str(record['sha256'])[:12]}"
    if record.get("timm"):
        return f"timm:{record['timm']}"
    if record.get("dassl"):
        return f"dassl:{record['dassl']}{':pretrained' if record.get('pretrained') else ''}"
    return "random"


def _named(rec: Record, key: str, field: str) -> list:
    ds = rec.config.get("DATASET") if isinstance(rec.config, dict) else None
    return list((ds.get(key) if isinstance(ds, dict) else None) or rec.data.get(field) or [])


def domains_read(rec: Record) -> Optional[Tuple[str, ...]]:
    """The domains a run read, its sources and targets together (sorted); None where the record
    names no sources."""
    sources = _named(rec, "SOURCE_DOMAINS", "source_domains")
    if not sources:
        return None
    return tuple(sorted({str(d) for d in sources + _named(rec, "TARGET_DOMAINS", "target_domains")}))


def mixed_sources(records: Sequence[Record]) -> bool:
    """Whether runs of one setting read other sources for one target (PACS's ``art_painting photo
    -> sketch`` beside ``art_painting cartoon photo -> sketch``; WILDS's hospitals as the sources
    beside its one source ``train``): then they are no seeds of one cell, and each set of domains
    they read is a row of its own. A leave-one-domain-out sweep (other sources for each target) and
    a sweep of fixed sources for several targets mix none."""
    seen: Dict[str, set] = defaultdict(set)
    for rec in records:
        seen[rec.target].add(tuple(sorted(str(d) for d in _named(rec, "SOURCE_DOMAINS", "source_domains"))))
    return any(len(v) > 1 for v in seen.values())


def setting_items(rec: Record) -> Dict[str, object]:
    """The config keys and values that make the run's setting (engine included; the weights the
    backbone started from, where the record names them: the same file name with other contents,
    or timm's weights of another tag, is another setting)."""
    flat = {
        k: v
        for k, v in with_execution(flatten(rec.config)).items()
        if not any(k == n or (n.endswith(".") and k.startswith(n)) for n in NOT_SETTING)
    }
    flat["engine"] = rec.data.get("engine")
    weights = weights_identity(rec.data.get("backbone_weights"))
    if weights is not None:
        flat["weights"] = weights
        flat.pop("MODEL.BACKBONE.WEIGHTS", None)  # the file's contents say it, not where it lay
    return flat


def setting_key(rec: Record) -> str:
    """A short hash of :func:`setting_items` (of a record written before records kept their config:
    of what it says, the engine and the weights)."""
    text = json.dumps(setting_items(rec), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def differing(records: List[Record]) -> List[str]:
    """The setting keys whose values differ between ``records``."""
    items = [setting_items(r) for r in records]
    keys = sorted(set().union(*items))
    return [k for k in keys if len({json.dumps(i.get(k), default=str) for i in items}) > 1]


def _row_label(rec_dir: str, root: str, trainer: str) -> str:
    """``trainer[/override]`` from the sweep layout ``<dataset>/<trainer>[/<setting>]/<target>/seed<N>``."""
    rel = os.path.relpath(rec_dir, root).split(os.sep)
    if len(rel) >= 4 and rel[-1].startswith("seed") and rel[1] == trainer:
        return "/".join(rel[1:-2])
    return str(trainer)


def _setting_names(label: str, by_setting: Dict[str, List[Record]]) -> Dict[str, str]:
    if len(by_setting) == 1:
        return {k: label for k in by_setting}
    firsts = [recs[0] for recs in by_setting.values()]
    keys = differing(firsts)
    # Name the rows by what a reader set: the engine first, then keys every record has (a key only
    # one engine's config holds, such as Dassl's K_TRANSFORMS, says nothing about the setting).
    every = [setting_items(r) for r in firsts]
    shared = [k for k in keys if k != "engine" and all(k in i for i in every)]
    if "engine" in keys:
        keys = ["engine"] + shared
    else:
        keys = shared or keys
    names = {}
    for key, recs in by_setting.items():
        items = setting_items(recs[0])
        shown = ", ".join(f"{k.rsplit('.', 1)[-1]}={items.get(k)}" for k in keys[:3])
        names[key] = f"{label} [{shown}{', ...' if len(keys) > 3 else ''}]"
    return names


def row_labels(records: Sequence[Record], root: str, domains: bool = True) -> Dict[int, str]:
    """Each record's row, by ``id``, as the tables and ``--select`` name it: the sweep layout's
    ``trainer[/setting]`` (else the trainer), and records of one such label with other settings
    told apart by the keys that differ (``DAEL [MAX_EPOCH=15]``), and runs of one setting on other
    sources for one target (:func:`mixed_sources`) by the domains each read (``DAEL [domains=[...]]``).
    ``domains=False``: those share their setting's label (leave-one-domain-out's runs on fewer sources)."""
    groups: Dict[tuple, Dict[str, List[Record]]] = defaultdict(lambda: defaultdict(list))
    for rec in records:
        table = (rec.data.get("dataset"), setting_of(rec.data))
        groups[(table, _row_label(rec.dir, root, str(rec.data.get("trainer"))))][setting_key(rec)].append(rec)
    out: Dict[int, str] = {}
    for (_, label), by_setting in groups.items():
        names = _setting_names(label, by_setting)
        for key, recs in by_setting.items():
            split = domains and mixed_sources(recs)
            out.update(
                (id(rec), f"{names[key]} [domains={list(domains_read(rec) or [])}]" if split else names[key])
                for rec in recs
            )
    return out


__all__ = [
    "check_metric",
    "differing",
    "domains_read",
    "mixed_sources",
    "metric_heading",
    "metric_value",
    "no_value",
    "Problem",
    "read_records",
    "Record",
    "REPORTED",
    "row_labels",
    "setting_items",
    "setting_key",
    "setting_of",
    "Walk",
    "weights_identity",
    "WILDS_PREFIX",
]


# What a table cell may hold (collect's --metric): a results.json field, and each epoch record's
# field of the same figure (select's --select reads the chosen epoch's)
REPORTED = {
    "accuracy": ("target_test_accuracy", "accuracy"),
    "mean_class_accuracy": ("target_test_mean_class_accuracy", "mean_class_accuracy"),
    "macro_f1": ("target_test_macro_f1", "macro_f1"),
}
WILDS_PREFIX = "wilds:"  # --metric wilds:<figure>: results.json's wilds_metrics (data/wilds_formats.py)


def metric_value(data: dict, metric: str) -> Optional[float]:
    """A record's ``metric`` in percent: its field, or (``wilds:<name>``) WILDS's figure, a fraction."""
    if metric.startswith(WILDS_PREFIX):
        value = (data.get("wilds_metrics") or {}).get(metric[len(WILDS_PREFIX) :])
        return None if value is None else 100.0 * float(value)
    return None if data.get(metric) is None else float(data[metric])


def no_value(rec, metric: str) -> str:
    """The one line of a record without the ``metric`` a table asks for."""
    if not metric.startswith(WILDS_PREFIX):
        return f"{rec.path} records no {metric} (written before the plugin recorded it); rerun it, or collect --metric accuracy"
    figures = sorted(rec.data.get("wilds_metrics") or {})
    held = f"it holds {', '.join(WILDS_PREFIX + f for f in figures)}" if figures else "it holds no WILDS figure"
    return f"{rec.path} records no WILDS figure {metric[len(WILDS_PREFIX) :]!r} ({held}); pick one of those"


def metric_heading(metric: str) -> str:
    return f"WILDS's {metric[len(WILDS_PREFIX) :]}" if metric.startswith(WILDS_PREFIX) else metric.replace("_", " ")


def check_metric(metric: str) -> str:
    """``--metric``'s value: a results.json field a cell may hold, or ``wilds:<figure>``."""
    if metric in REPORTED or (metric.startswith(WILDS_PREFIX) and len(metric) > len(WILDS_PREFIX)):
        return metric
    raise ValueError(f"{metric!r}: one of {', '.join(REPORTED)}, or wilds:<figure> (wilds:acc_avg, ...)")
