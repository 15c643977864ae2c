"""``results.json``: one record per run, the same schema on both engines.

Sweeps aggregate these records (see ``scripts/collect_results.py``) instead
of regex-parsing ``log.txt``.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Dict, List, Optional, Sequence

SCHEMA_VERSION = 1


def results_record(
    cfg,
    engine: str,
    accuracy: Optional[float],
    expert_accuracy: Sequence[float] = (),
    wall_seconds: float = 0.0,
    epochs: Optional[int] = None,
    eval_only: bool = False,
) -> Dict[str, object]:
    sources = list(cfg.DATASET.SOURCE_DOMAINS)
    names: List[str] = sources if len(expert_accuracy) == len(sources) else [f"expert{i}" for i in range(len(expert_accuracy))]
    if len(expert_accuracy) == 1:
        names = ["single"]
    return {
        "schema": SCHEMA_VERSION,
        "trainer": cfg.TRAINER.NAME,
        "engine": engine,
        "dataset": cfg.DATASET.NAME,
        "source_domains": sources,
        "target_domains": list(cfg.DATASET.TARGET_DOMAINS),
        "seed": int(cfg.SEED),
        "backbone": cfg.MODEL.BACKBONE.NAME,
        "accuracy": None if accuracy is None else round(float(accuracy), 4),
        "expert_accuracy": {n: round(float(a), 4) for n, a in zip(names, expert_accuracy)},
        "epochs": int(cfg.OPTIM.MAX_EPOCH if epochs is None else epochs),
        "eval_only": bool(eval_only),
        "wall_seconds": round(float(wall_seconds), 2),
        "output_dir": os.path.abspath(cfg.OUTPUT_DIR),
        "host": socket.gethostname(),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def write_results(output_dir: str, record: Dict[str, object]) -> str:
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "results.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path
