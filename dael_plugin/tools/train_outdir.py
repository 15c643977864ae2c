"""The output folder's identity: made writable, a finished run not trained again (unless
``--retrain`` moves its files aside; another engine or config is refused), and the run's data
fingerprint for ``results.json``. The lock itself is engine/runlock.py's."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

from yacs.config import CfgNode as CN

from dael_plugin.about import ENGINES
from dael_plugin.data.fingerprint import dataset_fingerprint
from dael_plugin.engine.checkpoint import LAST
from dael_plugin.errors import DAELConfigError


def prepare_output_dir(path: str) -> None:
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


def finished_run(cfg: CN, args: argparse.Namespace, engine: str) -> bool:
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


def run_fingerprint(trainer, cfg: CN) -> dict:
    """The run's data fingerprint (data/fingerprint.py): the plugin's trainers made it when they
    read the data; Dassl's own baselines get it here from their dataset."""
    fp = trainer.data_fingerprint
    return fp if fp is not None else dataset_fingerprint(cfg, trainer.dm.dataset)
