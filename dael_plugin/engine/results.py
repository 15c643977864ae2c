"""``results.json``: one record per run, the same schema on both engines.

Sweeps aggregate these records instead of regex-parsing ``log.txt``.

- A training run writes ``results.json`` only when it finished.
- ``--eval-only`` writes ``results_eval.json`` (with the checkpoint's epoch)
  and never touches the training record.
- A diverged run writes ``failed.json`` instead, which no aggregation reads
  as a result; a later successful run into the folder removes it.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import AbstractSet, Dict, List, Optional, Sequence

from yacs.config import CfgNode as CN

from dael_plugin.engine.distributed import world
from dael_plugin.engine.results_reader import FAILED

SCHEMA_VERSION = 1


def code_version() -> str:
    """``git describe`` of the plugin's checkout where it is one, else the package version."""
    from dael_plugin.about import __version__

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "-C", here, "describe", "--always", "--dirty", "--tags"], capture_output=True, text=True, timeout=5
        )
        if out.returncode == 0 and out.stdout.strip():
            return f"{__version__} ({out.stdout.strip()})"
    except (OSError, subprocess.SubprocessError):
        pass
    return __version__


def library_version(name: str) -> Optional[str]:
    """The version of library ``name`` as this process sees it, without importing it when the run
    has not: ``import timm`` alone costs about a second of CPU (its model zoo), paid by every
    training process whose backbone is not timm's. A module already imported gives its own
    ``__version__``; otherwise its installed distribution's metadata does, where Python would find
    the module; None where it would not."""
    import importlib.metadata
    import importlib.util
    import sys

    mod = sys.modules.get(name)
    if mod is not None:
        return str(getattr(mod, "__version__", "installed"))
    try:
        if importlib.util.find_spec(name) is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "installed"  # importable, but not from an installed distribution (a path on PYTHONPATH)


def provenance(cfg: CN) -> Dict[str, object]:
    """What a table cell needs to be traced back to its run: the merged config and
    its hash, the code and library versions, and the device."""
    import torch

    from dael_plugin.about import HAS_DASSL

    versions = {"torch": torch.__version__}
    for name in ("torchvision", "timm", "dassl"):
        versions[name] = None if name == "dassl" and not HAS_DASSL else library_version(name)
    use_cuda = bool(cfg.get("USE_CUDA", True)) and torch.cuda.is_available()
    device = f"cuda: {torch.cuda.get_device_name(0)}" if use_cuda else f"cpu: {os.cpu_count()} cores"
    text = cfg.dump()
    # The thread count changes float sums, so a run's trajectory: a sweep pins it, a hand-run
    # command follows the core count.
    threads = {"torch": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}
    return {
        "code_version": code_version(),
        "versions": versions,
        "device": device,
        "threads": threads,
        "config_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "config": text,
    }


def backbone_weights(cfg: CN, engine: str) -> dict:
    """The run's ``backbone_weights`` record (:mod:`dael_plugin.backbones.record`)."""
    from dael_plugin.backbones.record import weights_record

    b = cfg.MODEL.BACKBONE
    return weights_record(str(b.NAME), bool(b.get("PRETRAINED", False)), str(b.get("WEIGHTS", "") or ""), engine)


class TrainerFacts:
    """What the commands (train, ``--check-data``, ``--select``) and the records read of every
    trainer, on both engines, with their defaults: the plugin's trainers set them as they run
    (engine/trainer.py, dassl_adapter/trainer.py); Dassl's own trainers keep the defaults
    (dassl_adapter/records.DasslFacts), which ``results.json`` shows as empty fields."""

    is_da = False  # trained on unlabeled target data: "DA" in the log, results.json and the tables
    data_fingerprint: Optional[dict] = None  # the images read (data/fingerprint.py); None: not taken yet
    source_val_info: Optional[dict] = None  # the records' source validation split, where there is one
    classes_held: Optional[list] = None  # which classes each source holds (category shift); None: not read
    expert_accuracy: Sequence[float] = ()  # the last test's, per expert
    per_class_accuracy: Optional[Dict[str, Dict[str, float]]] = None  # the last test's
    mean_class_accuracy: Optional[float] = None  # the last test's mean over its classes (VisDA's figure)
    macro_f1: Optional[float] = None  # the last test's macro F1 over its classes (iWildCam-WILDS's figure)
    wilds_metrics: Optional[Dict[str, float]] = None  # the last test's by WILDS's own evaluation (a WILDS dataset)
    bad_images: AbstractSet[str] = frozenset()  # unreadable images left out
    ensemble_mask = None  # the (K, C) table of which expert knows which class, where the ensemble reads one
    own_records = False  # writes its own per-epoch records and best models (the plugin's trainers)

    @property
    def fast_path_check(self) -> Optional[Dict[str, object]]:
        """The first-step check of DAEL's fused pass (engine/first_step_check.py), where this
        process ran one."""
        return None


@dataclass(frozen=True)
class Evaluation:
    """What a trainer's last test found beside the ensemble's accuracy: each expert's accuracy, the
    per-class accuracies (``{"ensemble": {class: %}, expert: {...}}``) and the images left out."""

    expert_accuracy: Sequence[float] = ()
    per_class_accuracy: Optional[Dict[str, Dict[str, float]]] = None
    unreadable_images: Sequence[str] = ()
    mean_class_accuracy: Optional[float] = None
    macro_f1: Optional[float] = None
    wilds_metrics: Optional[Dict[str, float]] = None

    @classmethod
    def of(cls, trainer: TrainerFacts) -> "Evaluation":
        """A trainer's (Dassl's own trainers keep the mean class accuracy and the macro F1 alone, from
        Dassl's evaluator: the record says so by empty fields)."""
        return cls(
            list(trainer.expert_accuracy),
            trainer.per_class_accuracy,
            sorted(trainer.bad_images),
            trainer.mean_class_accuracy,
            trainer.macro_f1,
            trainer.wilds_metrics,
        )


def results_record(
    cfg: CN,
    engine: str,
    accuracy: Optional[float],
    evaluation: Evaluation = Evaluation(),
    setting: Optional[str] = None,
    wall_seconds: float = 0.0,
    epochs: Optional[int] = None,
    model_dir: Optional[str] = None,
) -> Dict[str, object]:
    """A run's ``results.json``; ``model_dir``: the run whose model an ``--eval-only`` evaluated
    (None: this run trained it). ``setting``: DA or DG, as the trainer says."""
    eval_only = model_dir is not None
    expert_accuracy, per_class_accuracy = evaluation.expert_accuracy, evaluation.per_class_accuracy
    unreadable_images, mean_class = evaluation.unreadable_images, evaluation.mean_class_accuracy
    sources = list(cfg.DATASET.SOURCE_DOMAINS)
    names: List[str] = (
        sources if len(expert_accuracy) == len(sources) else [f"expert{i}" for i in range(len(expert_accuracy))]
    )
    if len(expert_accuracy) == 1:
        names = ["single"]
    return {
        "schema": SCHEMA_VERSION,
        "trainer": cfg.TRAINER.NAME,
        "engine": engine,
        "dataset": cfg.DATASET.NAME,
        "setting": setting,  # DA (unlabeled target data used) or DG
        "source_domains": sources,
        "target_domains": list(cfg.DATASET.TARGET_DOMAINS),
        "seed": int(cfg.SEED),
        "backbone": cfg.MODEL.BACKBONE.NAME,
        "backbone_weights": backbone_weights(cfg, engine),
        "accuracy": None if accuracy is None else round(float(accuracy), 4),
        # the mean over the test classes of each one's accuracy (Dassl's perclass_accuracy; VisDA's figure)
        "mean_class_accuracy": None if accuracy is None or mean_class is None else round(float(mean_class), 4),
        # the mean over the test classes of each one's F1 (Dassl's macro_f1 and WILDS's F1-macro; iWildCam's figure)
        "macro_f1": None if accuracy is None or evaluation.macro_f1 is None else round(float(evaluation.macro_f1), 4),
        # a WILDS dataset's own evaluation (fractions, as WILDS reports them: FMoW's acc_worst_region, ...)
        "wilds_metrics": None if accuracy is None else evaluation.wilds_metrics,
        "expert_accuracy": {n: round(float(a), 4) for n, a in zip(names, expert_accuracy)},
        # class name -> % for the ensemble; the same per expert under per_class_expert_accuracy
        "per_class_accuracy": (per_class_accuracy or {}).get("ensemble"),
        "per_class_expert_accuracy": {k: v for k, v in (per_class_accuracy or {}).items() if k != "ensemble"} or None,
        "epochs": int(cfg.OPTIM.MAX_EPOCH if epochs is None else epochs),
        "eval_only": bool(eval_only),
        "model_dir": model_dir,
        "unreadable_images": len(unreadable_images),
        "unreadable_image_paths": list(unreadable_images)[:100],
        "wall_seconds": round(float(wall_seconds), 2),
        "output_dir": os.path.abspath(cfg.OUTPUT_DIR),
        "host": socket.gethostname(),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "world_size": world().size,  # processes that trained (or evaluated) it under torchrun
        "provenance": provenance(cfg),
        # resumes onto changed images, accepted with --accept-data-change (empty: the same data throughout)
        "data_changes": _data_changes(eval_only),
    }


def _data_changes(eval_only: bool) -> List[dict]:
    from dael_plugin.engine.checkpoint import data_changes

    return [] if eval_only else data_changes()


def write_results(output_dir: str, record: Dict[str, object], name: str = "results.json") -> str:
    from dael_plugin.engine.atomic import write_json

    return write_json(os.path.join(output_dir, name), record)


def write_failure(output_dir: str, message: str) -> str:
    """Record why a run stopped, where a sweep will look, without a result in it."""
    return write_results(
        output_dir,
        {
            "schema": SCHEMA_VERSION,
            "failed": True,
            "error": message,
            "host": socket.gethostname(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
        name=FAILED,
    )


def remove_failure(output_dir: str) -> None:
    try:
        os.remove(os.path.join(output_dir, FAILED))
    except FileNotFoundError:
        pass
