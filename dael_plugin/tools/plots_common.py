"""What the figure tools share: the run records (one reader with collect), a run's DAEL keys
from its recorded config, "every other design key at the paper's default", and the one
atomic writer of a figure (PNG and PDF)."""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

from dael_plugin.engine.atomic import write_bytes
from dael_plugin.engine.results_reader import read_records


def records(root: str, warn=print) -> List[dict]:
    """The run records under ``root`` (one reader with collect: :mod:`dael_plugin.engine.results_reader`); a
    file that is not a record is skipped with a warning naming it."""
    walk = read_records(root)
    for problem in walk.problems:
        warn(problem.warning())
    return [dict(r.data, _dir=r.dir) for r in walk.records]


def design_value(rec: dict, key: str) -> Optional[str]:
    """A DAEL key's value in the run's merged config (``provenance.config``), else None."""
    import yaml

    text = (rec.get("provenance") or {}).get("config")
    if not text:
        return None
    node = yaml.safe_load(text).get("TRAINER", {}).get(str(rec.get("trainer", "")).upper(), {})
    value = node.get(key)
    return None if value is None else str(value)


def seeds_of_one_setting(recs: List[dict], varied: str, figure: str) -> Tuple[List[dict], Optional[str]]:
    """``recs`` as a figure's seeds: one run per value of the design key ``varied``, target and seed
    (the first folder; another is a rerun of that run), and None. Or ``[]`` and the line that skips
    the figure where they differ in any other setting (engine/results_reader's: epochs, rates, the
    backbone and its weights, the engine, the trainer, the data, the sources for a target), which a
    bar or line would average as if seeds."""
    from dael_plugin.engine.results_reader import Record, differing, mixed_sources

    one: Dict[tuple, dict] = {}
    for r in sorted(recs, key=lambda r: r["_dir"]):
        one.setdefault(
            (design_value(r, varied) if varied else None, tuple(r.get("target_domains") or []), r.get("seed")), r
        )
    runs = [Record(os.path.join(r["_dir"], "results.json"), r) for r in one.values()]
    keys = [k for k in differing(runs) if not (varied and k.startswith("TRAINER.") and k.endswith(f".{varied}"))]
    keys += ["DATASET.SOURCE_DOMAINS"] if mixed_sources(runs) else []
    if not keys:
        return list(one.values()), None
    return [], (
        f"the runs of {figure} differ in {', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}"
        f"{' besides ' + varied if varied else ''}, which it would average as seeds; pass a folder of one "
        "setting (a sweep's <dataset>/ folder, or one with the other runs moved out)"
    )


def save_figure(fig, out: str, name: str) -> List[str]:
    import io

    paths = [os.path.join(out, f"{name}.{ext}") for ext in ("png", "pdf")]
    for p in paths:
        buf = io.BytesIO()
        fig.savefig(buf, bbox_inches="tight", dpi=150, format=p.rsplit(".", 1)[1])
        write_bytes(p, buf.getvalue())
    import matplotlib.pyplot as plt

    plt.close(fig)
    return paths


DESIGN_KEYS = {
    "LOSSES": "losses",
    "WEIGHT_U": "weight_u",
    "CR_MODE": "cr_mode",
    "CLASSIFIER": "classifier",
    "CR_TARGET": "cr_target",
    "PSEUDO_LABEL": "pseudo_label",
    "CR_LOSS": "cr_loss",
    "VIEWS": "views",
}


def others_at_default(rec: dict, key: str) -> bool:
    """Every design key but ``key`` at the paper's default (absent counts as default)."""
    from dael_plugin.core.hparams import DAELHparams

    d = DAELHparams()
    for k, attr in DESIGN_KEYS.items():
        if k == key:
            continue
        v = design_value(rec, k)
        if v is not None and v != str(getattr(d, attr)):
            return False
    return True
