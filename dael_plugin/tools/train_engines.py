"""Starting a run on an engine, and what needs the engine's trainer: Dassl's trainer built
(with per-epoch records for Dassl's own baselines), the log's config and system blocks, the
weights an ``--eval-only`` run evaluates (``--select`` included), and DA or DG for the tables."""

from __future__ import annotations

import argparse
import os
from typing import Optional, Tuple

from yacs.config import CfgNode as CN

from dael_plugin.engine import distributed
from dael_plugin.engine.execution import (
    cuda_settings,
    pin_cpu_threads,
)
from dael_plugin.errors import DAELConfigError


def say_threads() -> None:
    """Pin and say the CPU thread count (engine/execution.pin_cpu_threads): it changes float sums,
    so the run; said in the log, and recorded in the provenance."""
    print(f"dael_plugin: {pin_cpu_threads()}")


def say_config(cfg: CN, extra: str = "") -> None:
    """The whole config (and Dassl's system info) to the run's log file; a few lines on the terminal:
    what trains on what, for how long, and where the rest is written."""
    from dael_plugin.engine.runlog import log_only
    from dael_plugin.tools import pixel_stats

    logged = log_only("** Config **\n" + str(cfg) + "\n" + extra)
    if not logged:
        return
    said = pixel_stats.note(cfg)  # the weights' own mean and std, or others
    if said:
        print(said)
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


def run_dassl(cfg: CN, args: argparse.Namespace) -> dict:
    from dassl.engine import TRAINER_REGISTRY
    from dassl.utils import set_random_seed, setup_logger

    from dael_plugin.dassl_adapter import prepare_cfg
    from dael_plugin.dassl_adapter.method_trainer import MethodTrainerXU
    from dael_plugin.dassl_adapter.records import eval_freq, with_facts, with_records

    if cfg.SEED >= 0:
        print(f"Setting fixed seed: {cfg.SEED}")
        set_random_seed(cfg.SEED)
    if distributed.world().is_main:
        setup_logger(cfg.OUTPUT_DIR)
    say_threads()
    cuda_settings(cfg)  # every trainer, Dassl's baselines too
    say_config(cfg, "** System info **\n{}\n".format(system_info()))
    prepare_cfg(cfg)  # done by check_names_and_files already; kept for callers of run_dassl alone
    from dael_plugin.dassl_adapter import checkpoints as dassl_checkpoints

    ds = cfg.DATASET  # MODEL.INIT_WEIGHTS is compared with these (its images: the built-in engine alone)
    dassl_checkpoints.INIT_WEIGHTS_RUN.update(
        dataset=ds.NAME, sources=list(ds.SOURCE_DOMAINS), targets=list(ds.TARGET_DOMAINS), fingerprint=None
    )
    # Dassl's baselines write the same per-epoch records as DAEL (dassl_adapter/records.py); every
    # trainer has what the commands read of it (engine/results.TrainerFacts)
    print(f"Loading trainer: {cfg.TRAINER.NAME}")
    cls = TRAINER_REGISTRY.get(cfg.TRAINER.NAME)
    try:
        if issubclass(cls, MethodTrainerXU):  # the plugin's own method, with its own records
            trainer = cls(cfg, eval_only=args.eval_only)
        else:
            trainer = (with_facts if args.eval_only or eval_freq(cfg) == 0 else with_records)(cls)(cfg)
    except (AssertionError, ValueError) as exc:  # a trainer's check_cfg, Dassl's domain sampler: one line
        from dael_plugin.dassl_adapter.checks import check_cfg_refusal, sampler_refusal

        said = (
            check_cfg_refusal(exc, cfg.TRAINER.NAME) if isinstance(exc, AssertionError) else sampler_refusal(exc, cfg)
        )
        if said is None:
            raise
        raise DAELConfigError(said) from None
    if cfg.MODEL.INIT_WEIGHTS and not args.eval_only and not isinstance(trainer, MethodTrainerXU):
        # The source model's images against this run's (its domains were compared as Dassl loaded it;
        # a method's own build on Dassl's loop compares them all, as on the built-in engine)
        from dael_plugin.dassl_adapter.checkpoints import load_dassl_checkpoint
        from dael_plugin.data.fingerprint import dataset_fingerprint
        from dael_plugin.engine.source_model import check_source_record, source_record

        path = str(cfg.MODEL.INIT_WEIGHTS)
        run = dict(dassl_checkpoints.INIT_WEIGHTS_RUN, fingerprint=dataset_fingerprint(cfg, trainer.dm.dataset))
        record = source_record(path, load_dassl_checkpoint(path))
        if record is not None:
            check_source_record(path, record, **run)
    if cfg.TEST.FINAL_MODEL == "best_val" and trainer.val_loader is None:
        raise DAELConfigError(_BEST_VAL_WITHOUT_VAL.format(dataset=cfg.DATASET.NAME))
    if bool(cfg.DATASET.get("CATEGORY_SHIFT", False)) and trainer.classes_held is None:
        # Dassl's own trainers (SourceOnly, M3SDA, ...): the same line as the plugin's trainers print
        from dael_plugin.data.classes import classes_by_domain, say_class_table

        dm = trainer.dm
        held = classes_by_domain(dm.dataset.train_x, dm.num_source_domains, dm.num_classes)
        names = [dm.lab2cname.get(i, str(i)) for i in range(dm.num_classes)]
        if distributed.world().is_main:
            say_class_table(held, cfg.DATASET.SOURCE_DOMAINS, names)
    recorded = {}
    original_test = trainer.test

    def recording_test(*a, **k):
        result = original_test(*a, **k)
        recorded["accuracy"] = result
        trainer.mean_class_accuracy, trainer.macro_f1 = dassl_class_metrics(trainer.evaluator)
        trainer.wilds_metrics = dassl_wilds_metrics(trainer, *a, **k)
        return result

    trainer.test = recording_test  # every trainer's final test result reaches results.json
    return {"trainer": trainer, "recorded": recorded}


def train_dassl(trainer, cfg: CN) -> None:
    """Dassl's ``train()``. Dassl's own trainers check each loss (``detect_anomaly``) and raise a
    FloatingPointError with its stack at a NaN/inf: that stops the run as the plugin's divergence
    guard does (one line, ``failed.json``, exit 3), never a stack and a folder that looks unfinished."""
    import traceback

    from dael_plugin.engine.guard import divergence_error

    try:
        trainer.train()
    except FloatingPointError as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        if frame.name != "detect_anomaly" or not frame.filename.replace(os.sep, "/").endswith(
            "dassl/engine/trainer.py"
        ):
            raise
        # (Dassl's TrainerX and TrainerXU count the epoch's batches in batch_idx)
        raise divergence_error(trainer.epoch + 1, trainer.batch_idx + 1, cfg.OPTIM.LR, None) from None


def dassl_wilds_metrics(trainer, split: Optional[str] = None):
    """WILDS's own evaluation of the test Dassl's evaluator last saw (engine/evaluate.report_official):
    Dassl's test loader is sequential, so its kept labels and predictions are the split's items in
    order, all of them or (unreadable images left out by the plugin's trainers) fewer, then not run."""
    from dael_plugin.data.wilds_formats import is_wilds
    from dael_plugin.engine.evaluate import report_official

    cfg, ev = trainer.cfg, trainer.evaluator
    if not is_wilds(cfg.DATASET.NAME) or not getattr(ev, "_y_true", None) or distributed.world().distributed:
        return None
    split = "val" if (split or cfg.TEST.SPLIT) == "val" and trainer.val_loader is not None else "test"  # Dassl's
    items = getattr(trainer.dm.dataset, split)
    ordered = (ev._y_true, ev._y_pred) if len(ev._y_true) == len(items) else None
    return report_official(cfg.DATASET.NAME, cfg.DATASET.ROOT, split, ordered)


def dassl_class_metrics(evaluator) -> Tuple[Optional[float], Optional[float]]:
    """The mean class accuracy and the macro F1 of the test Dassl's ``Classification`` evaluator
    last saw (its kept labels and predictions: Dassl's ``perclass_accuracy`` and ``macro_f1``); None
    for another ``TEST.EVALUATOR``, which keeps none (the record then says null)."""
    from dael_plugin.engine.evaluate import macro_f1, mean_class_accuracy

    labels = getattr(evaluator, "_y_true", None)  # (Dassl's Classification's own attributes)
    if not labels:
        return None, None
    return mean_class_accuracy(labels, evaluator._y_pred), macro_f1(labels, evaluator._y_pred)


_BEST_VAL_WITHOUT_VAL = (
    "TEST.FINAL_MODEL best_val: dataset {dataset} has no validation split, so 'best' would be chosen on the "
    "target test set (test leakage); set TEST.FINAL_MODEL last_step"
)


def run_setting(trainer) -> str:
    """DA when the run trained on unlabeled target data, else DG (for the tables)."""
    return "DA" if trainer.is_da else "DG"


def load_for_eval(trainer, engine: str, args: argparse.Namespace) -> Optional[int]:
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
        check_chosen_model(path, args.select, args.model_dir, trainer.cfg.SEED, trainer.data_fingerprint)
        if engine == "dassl" and not trainer.own_records:  # a Dassl baseline
            from dael_plugin.dassl_adapter.records import load_best

            return load_best(trainer, args.model_dir, args.select)
        return trainer.load_model(args.model_dir, name=name)
    if engine == "dassl":
        from dassl.engine.trainer import TrainerBase

        from dael_plugin.dassl_adapter.trainer import load_dassl_checkpoints

        if type(trainer).load_model is TrainerBase.load_model:  # Dassl's, which crashes on val_result=None
            return load_dassl_checkpoints(trainer, args.model_dir, args.load_epoch)
    return trainer.load_model(args.model_dir, epoch=args.load_epoch)
