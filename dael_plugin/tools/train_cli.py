"""The training command's line: Dassl's ``tools/train.py`` flags plus the plugin's, and the
checks that need only the parsed flags (the engine's choice, ``~`` in paths, a ``KEY VALUE`` pair
swallowed by a list flag, ``--select``'s companions)."""

from __future__ import annotations

import argparse
import os
import re

from dael_plugin.about import ENGINES
from dael_plugin.errors import DAELConfigError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train DAEL or a Dassl baseline (dael-plugin).")
    p.add_argument("--root", type=str, default="", help="path to dataset (required)")
    p.add_argument("--output-dir", type=str, default="", help="output directory")
    p.add_argument("--resume", type=str, default="", help="checkpoint directory (from which the training resumes)")
    p.add_argument("--seed", type=int, default=None, help="a non-negative value fixes the seed")
    p.add_argument("--source-domains", type=str, nargs="+", help="source domains for DA/DG")
    p.add_argument("--target-domains", type=str, nargs="+", help="target domains for DA/DG")
    p.add_argument("--transforms", type=str, nargs="+", help="data augmentation methods (INPUT.TRANSFORMS)")
    p.add_argument("--config-file", type=str, default="", help="path to the method config file")
    p.add_argument("--dataset-config-file", type=str, default="", help="path to the dataset config file")
    p.add_argument(
        "--trainer", type=str, default="", help="name of trainer (required: DAEL, DAELDG, SourceOnly, M3SDA, ...)"
    )
    p.add_argument("--backbone", type=str, default="", help="name of CNN backbone (e.g. timm_resnet18)")
    p.add_argument("--head", type=str, default="", help="name of head")
    p.add_argument("--eval-only", action="store_true", help="evaluation only")
    p.add_argument("--model-dir", type=str, default="", help="load model from this directory for eval-only mode")
    p.add_argument("--load-epoch", type=int, help="load model weights at this epoch for evaluation")
    p.add_argument(
        "--select",
        type=str,
        default="",
        metavar="PROTOCOL",
        help="with --eval-only: evaluate the model that PROTOCOL chose during the run (its "
        "model-best-PROTOCOL.pth.tar in --model-dir, kept with SELECTION.EVAL_FREQ; docs/selection.md)",
    )
    p.add_argument("--no-train", action="store_true", help="do not call trainer.train()")
    p.add_argument(
        "--engine", choices=ENGINES, default="auto", help="auto: Dassl when importable, else the built-in engine"
    )
    p.add_argument(
        "--eval-each-epoch",
        action="store_true",
        help="built-in engine: also evaluate after every epoch (on the validation split where "
        "the dataset has one, else on the target test split, which is then said in the log)",
    )
    p.add_argument(
        "--check-data",
        action="store_true",
        help="decode every image of the run's splits before training and print images per domain, split "
        "and class; stop with the list of bad files",
    )
    p.add_argument(
        "--hash-pixels",
        action="store_true",
        help="with --check-data: also a SHA-256 of the image bytes per split and domain, in results.json "
        "(the data fingerprint itself hashes paths and labels only)",
    )
    p.add_argument(
        "--accept-data-change",
        action="store_true",
        help="resume although the images differ from those the checkpoint's run read (its data "
        "fingerprint); without it such a resume is refused. Changed classes are always refused",
    )
    p.add_argument(
        "--retrain",
        action="store_true",
        help="train again into an OUTPUT_DIR whose run finished (its files move to "
        "OUTPUT_DIR/replaced-<time>/); without it, rerunning a finished run does nothing",
    )
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import this module (a dotted name, or a .py file) before the run: it registers trainers of "
        "your own (repeatable; docs/internals.md). The dael_plugin.methods entry points are imported too",
    )
    p.add_argument("opts", default=None, nargs=argparse.REMAINDER, help="modify config options using the command-line")
    return p


def choose_engine(requested: str) -> str:
    from dael_plugin.about import HAS_DASSL as has_dassl

    if requested == "dassl" and not has_dassl:
        raise DAELConfigError(
            "--engine dassl: Dassl is not installed; install it by hand (see README) or use --engine builtin"
        )
    engine = requested if requested != "auto" else ("dassl" if has_dassl else "builtin")
    why = "requested" if requested != "auto" else ("Dassl is importable" if has_dassl else "Dassl is not installed")
    print(f"dael_plugin: engine = {engine} ({why})")
    return engine


PATH_FLAGS = ("root", "output_dir", "resume", "model_dir", "config_file", "dataset_config_file")


def expand_user(args: argparse.Namespace) -> None:
    """``~`` in every path flag, as a shell would have expanded it unquoted (``--output-dir '~/x'``
    made a folder named ``~`` in the current directory while ``--root`` expanded it)."""
    for name in PATH_FLAGS:
        value = getattr(args, name, None)
        if isinstance(value, str) and value.startswith("~"):
            setattr(args, name, os.path.expanduser(value))


_KEY_LIKE = re.compile(r"^[A-Z][A-Z0-9_]*(\.[A-Z0-9_]+)+$")


def check_list_flags(args: argparse.Namespace) -> None:
    """A ``KEY VALUE`` pair typed after a list flag is swallowed by it (``--target-domains blend
    OPTIM.MAX_EPOCH 3`` reads three domains): name it, with the two ways to write it."""
    for flag in ("source_domains", "target_domains", "transforms"):
        values = getattr(args, flag, None) or []
        keys = [v for v in values if _KEY_LIKE.match(v)]
        if keys:
            name = "--" + flag.replace("_", "-")
            at = values.index(keys[0])
            raise DAELConfigError(
                f"{name} {' '.join(values)}: {keys[0]!r} is a config key, read as one of {name}'s values because "
                f"{name} takes a list; end the list with -- ({name} {' '.join(values[:at])} -- "
                f"{' '.join(values[at:])}) or put the KEY VALUE pairs last, after a flag that takes one value"
            )


def check_select(args: argparse.Namespace) -> None:
    from dael_plugin.core.validators import SCORED_PROTOCOLS

    if not args.eval_only:
        raise DAELConfigError(
            f"--select {args.select} goes with --eval-only --model-dir <OUTPUT_DIR of a run> (it evaluates the model "
            "a protocol chose); to choose among finished runs, use scripts/collect.py --select"
        )
    if args.load_epoch is not None:
        raise DAELConfigError("--select and --load-epoch both name the weights to evaluate; pass one")
    if args.select not in SCORED_PROTOCOLS:
        raise DAELConfigError(
            f"--select {args.select}: not a protocol that keeps a model; choose from {', '.join(SCORED_PROTOCOLS)} "
            "(the last epoch's model is the default)"
        )
