"""The main job on the embedded set: DAEL against SourceOnly on one
leave-one-domain-out split, then a small table.

    python scripts/demo.py [--target blend] [--seeds 1] [--epochs 15] [--root data] [--set KEY VALUE ...]

Runs through scripts/train.py with the engine chosen automatically (Dassl if
installed, else the built-in engine). Each run writes results.json; the table
is read from those records. Installed as the console script ``dael-demo``.

Accuracy depends on the machine: the same seed and code repeat exactly on one
CPU, but another CPU (or a GPU) draws other numbers, so the table names the
machine it was measured on.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from typing import List, Optional

from yacs.config import CfgNode as CN

from dael_plugin.about import ENGINES

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # the repository: configs/, scripts/
DOMAINS = ("hand", "blend", "street", "font")


def run(trainer: str, cfg: CN, target: str, seed: int, args: argparse.Namespace) -> dict:
    sources = [d for d in DOMAINS if d != target]
    out = os.path.join(args.output, f"{trainer}_{target}_seed{seed}")
    shutil.rmtree(out, ignore_errors=True)  # a fresh run, not a resume
    cmd = [
        sys.executable,
        os.path.join(ROOT, "scripts", "train.py"),
        "--engine",
        args.engine,
        "--trainer",
        trainer,
        "--root",
        args.root,
        "--dataset-config-file",
        os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml"),
        "--config-file",
        os.path.join(ROOT, cfg),
        "--source-domains",
        *sources,
        "--target-domains",
        target,
        "--output-dir",
        out,
        "--seed",
        str(seed),
        "OPTIM.MAX_EPOCH",
        str(args.epochs),
    ]
    if trainer == "DAEL":
        cmd += [str(v) for v in args.set]
    print(f"[demo] {trainer} seed {seed}: {' '.join(cmd[1:])}", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"[demo] {trainer} failed (exit {proc.returncode}); see {out}/log.txt")
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


def machine() -> str:
    """CPU model and core count (and the GPU when one is used), for the table's caption."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import torch

    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return f"{cpu}, {os.cpu_count()} cores{gpu}, torch {torch.__version__}"


def main(argv: Optional[List[str]] = None) -> None:
    if not os.path.isdir(os.path.join(ROOT, "configs")):
        sys.exit("dael-demo needs the repository's configs/: run it from a clone installed with pip install -e .")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="blend", choices=DOMAINS)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--root", default=os.path.join(ROOT, "data"))
    p.add_argument("--output", default=os.path.join(ROOT, "output", "demo"))
    p.add_argument("--engine", default="auto", choices=ENGINES)
    p.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY VALUE",
        help="extra config options for the DAEL runs, e.g. --set TRAINER.DAEL.FUSE_CHUNKS False",
    )
    args = p.parse_args(argv)
    if len(args.set) % 2:
        p.error("--set takes KEY VALUE pairs")

    rows = []
    for seed in args.seeds:
        dael = run("DAEL", "configs/trainers/da/dael/embedded_digits.yaml", args.target, seed, args)
        so = run("SourceOnly", "configs/trainers/da/source_only/embedded_digits.yaml", args.target, seed, args)
        rows.append((seed, dael, so))

    experts = list(rows[0][1]["expert_accuracy"])
    print()
    print(
        f"Target domain: {args.target} (sources: {', '.join(rows[0][1]['source_domains'])}); "
        f"{args.epochs} epochs; engine {rows[0][1]['engine']}; machine: {machine()}"
    )
    header = ["seed", "SourceOnly", "DAEL", "gain"] + [f"E[{e}]" for e in experts]
    print(" | ".join(f"{h:>10}" for h in header))
    gains = []
    for seed, dael, so in rows:
        gain = dael["accuracy"] - so["accuracy"]
        gains.append(gain)
        cells = [str(seed), f"{so['accuracy']:.1f}", f"{dael['accuracy']:.1f}", f"{gain:+.1f}"]
        cells += [f"{dael['expert_accuracy'][e]:.1f}" for e in experts]
        print(" | ".join(f"{c:>10}" for c in cells))
    if len(rows) > 1:
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        print(
            f"mean: SourceOnly {mean([r[2]['accuracy'] for r in rows]):.1f}, "
            f"DAEL {mean([r[1]['accuracy'] for r in rows]):.1f}, gain {mean(gains):+.1f}"
        )
    print(
        "(target test accuracy in %; E[d] = DAEL's expert for source domain d alone; "
        "other machines give other numbers from the same seed)"
    )


if __name__ == "__main__":
    main()
