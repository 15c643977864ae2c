"""What a run record (``results.json``) must be before a table, a selection or a figure reads it:
JSON, a mapping, an accuracy in [0, 100], the fields that place it in a table (dataset, trainer,
seed, setting, domains) of their types, a data fingerprint, expert accuracies and a config of their
shapes. A record that is not is named with what is wrong (engine/results_reader.py's Problem),
never a traceback in the reader and never read as a setting it is not."""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Optional, Tuple


def read_record(path: str) -> Tuple[Optional[dict], Optional[str]]:
    """A run record and None, or None and why it is no record to read."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block open() until a writer comes
            return None, "not a regular file"
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        return None, f"truncated or not JSON ({exc.msg} at character {exc.pos})"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"unreadable ({type(exc).__name__})"
    if not isinstance(data, dict):
        return None, f"holds a JSON {type(data).__name__}, not a run record"
    if "accuracy" not in data or not isinstance(data.get("target_domains"), list):
        return None, "not a run record (no accuracy or target_domains)"
    wrong = _wrong_field(data)
    if wrong:
        return None, f"{wrong} (an edited or foreign record)"
    acc = data["accuracy"]
    if acc is None:
        return None, "accuracy is null (a run with TEST.NO_TEST, or an edited record): nothing to average"
    if isinstance(acc, bool) or not isinstance(acc, (int, float)) or not math.isfinite(acc) or not 0 <= acc <= 100:
        return None, f"accuracy {acc!r} is not a percentage from 0 to 100 (an edited or foreign record)"
    if "data" in data and not _is_fingerprint(data["data"]):
        return None, "its data fingerprint is not {split: {domain: {images, sha256}}} (an edited record)"
    for key in ("expert_accuracy",):  # read by collect's expert columns and plots.py's experts figure
        value = data.get(key)
        if value is not None and not _percentages(value):
            return None, f"{key} is not a mapping of names to percentages from 0 to 100 (an edited record)"
    for key in ("mean_class_accuracy", "macro_f1"):  # collect --metric
        value = data.get(key)
        if value is not None and not _percentages({key: value}):
            return None, f"{key} {value!r} is not a percentage from 0 to 100 (an edited record)"
    figures = data.get("wilds_metrics")  # collect --metric wilds:<figure>
    if figures is not None and not (isinstance(figures, dict) and all(is_number(v) for v in figures.values())):
        return None, "wilds_metrics is not a mapping of WILDS's figure names to numbers (an edited record)"
    provenance = data.get("provenance") or {}
    config = provenance.get("config") if isinstance(provenance, dict) else 0
    if config is not None and not _config_mapping(config):  # a run's setting: collect's rows, the figures
        return None, "its provenance.config is not the run's config as YAML (an edited record)"
    return data, None


def _wrong_field(data: dict) -> Optional[str]:
    """What is wrong with the fields that place a record in a table (its dataset, trainer, seed,
    setting and domains), or None."""
    names = lambda v: isinstance(v, list) and all(isinstance(d, str) for d in v)  # noqa: E731
    checks = (
        ("dataset", lambda v: isinstance(v, str), "a name"),
        ("trainer", lambda v: isinstance(v, str), "a name"),
        ("seed", lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)), "a whole number"),
        ("setting", lambda v: v in (None, "DA", "DG"), "DA or DG"),
        ("target_domains", lambda v: names(v) and bool(v), "a list of domain names"),
        ("source_domains", lambda v: v is None or names(v), "a list of domain names"),
    )
    for key, ok, what in checks:
        if (key in data or key in ("dataset", "trainer")) and not ok(data.get(key)):
            return f"{key} is {data.get(key)!r}, not {what}"
    return None


def _config_mapping(text) -> bool:
    import yaml

    try:
        return isinstance(text, str) and isinstance(yaml.safe_load(text) or {}, dict)
    except yaml.YAMLError:
        return False


def _percentages(value) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and is_number(v) and math.isfinite(v) and 0 <= v <= 100 for k, v in value.items()
    )


def is_number(v) -> bool:
    """A JSON number (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_fingerprint(fp) -> bool:
    return isinstance(fp, dict) and all(
        isinstance(doms, dict)
        and all(
            isinstance(v, dict) and isinstance(v.get("images"), int) and isinstance(v.get("sha256"), str)
            for v in doms.values()
        )
        for doms in fp.values()
    )
