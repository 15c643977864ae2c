"""``SEED -1`` ("a random one"), resolved once for a whole run: by ``scripts/train.py`` before the
config is frozen, and by the Dassl engine's trainer of a method under Dassl's own ``tools/train.py``
(dassl_adapter/method_trainer.py), which leaves ``SEED -1`` unseeded."""

from __future__ import annotations

import hashlib
import os
from typing import Optional

from yacs.config import CfgNode as CN

from dael_plugin.engine.checkpoint import load_checkpoint, saved_seed


def _saved_seed(path: str) -> Optional[int]:
    """The SEED of the checkpoint at ``path`` (``checkpoint.saved_seed``), or None where there is no
    file or it cannot be read (the resume or the evaluation says so itself)."""
    if not os.path.isfile(path):
        return None
    try:
        return saved_seed(load_checkpoint(path))
    except Exception:  # noqa: BLE001 (a damaged checkpoint is said by the resume or evaluation itself)
        return None


def draw_seed(cfg: CN, evaluated: Optional[str] = None) -> Optional[str]:
    """``SEED -1`` ("a random one"): one seed drawn here and used for everything (torch's weights,
    the batches, the views), set in the config so that results.json and the checkpoint record it
    and the run can be repeated. Before, torch was left unseeded while every batch and view was
    drawn from seed 0. Under torchrun every rank draws the same one (from the job's run id).
    ``evaluated``: the ``--model-dir`` of an ``--eval-only``, whose run's seed it takes (the
    held-out source split and ``--select``'s check are that run's). Returns the line that says which
    seed, or None where the config gives one."""
    if int(cfg.SEED) >= 0:
        return None
    if evaluated:
        path = os.path.join(evaluated, "checkpoint.pth.tar")
        saved = _saved_seed(path)
        if saved is not None:
            cfg.SEED = saved
            return f"SEED -1: the seed {saved} of the run evaluated, from {path}"
    last = os.path.join(str(cfg.get("RESUME", "") or cfg.OUTPUT_DIR), "checkpoint.pth.tar")
    saved = _saved_seed(last)
    if saved is not None:  # a resume: the seed the run drew (the same command, run again)
        cfg.SEED = saved
        return f"SEED -1: the seed {saved} this run drew, from {last}"
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id:
        seed = int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "big") % 2**31
    else:
        seed = int.from_bytes(os.urandom(4), "big") % 2**31
    cfg.SEED = seed
    return f"SEED -1: drew seed {seed} (recorded in results.json; pass --seed {seed} to repeat this run)"
