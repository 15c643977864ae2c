"""The main job on the embedded set: DAEL against SourceOnly and Dassl's M3SDA and MME on one
leave-one-domain-out split, then a small table.

    python scripts/demo.py [--target blend] [--seeds 1] [--epochs 15] [--root data]
                           [--trainers DAEL SourceOnly M3SDA MME] [--jobs 2] [--set KEY VALUE ...]

Runs through scripts/train.py with the engine chosen automatically (Dassl if
installed, else the built-in engine), ``--jobs`` runs side by side, each on its
share of the cores (one thread each on 2 cores, as scripts/sweep.py runs them; a
run's thread count is part of its trajectory). Each run writes results.json and
its log.txt; the table is read from those records. Installed as the console
script ``dael-demo``.

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
import time
from typing import Dict, List, Optional, Tuple

from dael_plugin.about import ENGINES

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # the repository: configs/, scripts/
DOMAINS = ("hand", "blend", "street", "font")


CONFIGS = {
    "DAEL": "configs/trainers/da/dael/embedded_digits.yaml",
    "SourceOnly": "configs/trainers/da/source_only/embedded_digits.yaml",
    "M3SDA": "configs/trainers/da/m3sda/embedded_digits.yaml",
    "MME": "configs/trainers/da/mme/embedded_digits.yaml",
    "MCD": "configs/trainers/da/mcd/embedded_digits.yaml",
    "DANN": "configs/trainers/da/dann/embedded_digits.yaml",
    "SE": "configs/trainers/da/se/embedded_digits.yaml",
}


def command(trainer: str, target: str, seed: int, args: argparse.Namespace) -> Tuple[List[str], str]:
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
        os.path.join(ROOT, CONFIGS[trainer]),
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
    return cmd, out


def run_all(jobs: List[Tuple[str, int]], args: argparse.Namespace) -> Dict[Tuple[str, int], dict]:
    """Every (trainer, seed) run, ``args.jobs`` at a time; a failed run stops the demo with its log."""
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads)) if args.jobs > 1 else None
    pending, running, results = list(jobs), [], {}
    while pending or running:
        while pending and len(running) < args.jobs:
            trainer, seed = pending.pop(0)
            cmd, out = command(trainer, args.target, seed, args)
            print(f"[demo] {trainer} seed {seed}: {' '.join(cmd[1:])}", flush=True)
            if args.jobs == 1:
                proc = subprocess.Popen(cmd, cwd=ROOT)
                log = None
            else:  # side by side: each run's lines in a file of its own, not interleaved here
                os.makedirs(args.output, exist_ok=True)
                log = open(out + ".out", "w")
                proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append((trainer, seed, out, proc, log, time.time()))
        done = next((r for r in running if r[3].poll() is not None), None)
        if done is None:  # none finished yet: look again shortly (the runs print nothing here)
            time.sleep(0.5)
            continue
        running.remove(done)
        trainer, seed, out, proc, log, start = done
        code = proc.wait()
        if log is not None:
            log.close()
        if code != 0:
            for other in running:  # stopped as at Ctrl-C, and waited for: no run outlives the demo
                other[3].terminate()
                other[3].wait()
            where = f"{out}.out" if log is not None else f"{out}/log.txt"
            last = ""
            if log is not None:
                with open(where) as f:
                    lines = [ln.strip() for ln in f if ln.strip()]
                last = f": {lines[-1]}" if lines else ""
            sys.exit(f"[demo] {trainer} seed {seed} failed (exit {code}){last}; see {where}")
        with open(os.path.join(out, "results.json")) as f:
            results[(trainer, seed)] = json.load(f)
        acc = results[(trainer, seed)]["accuracy"]
        print(f"[demo] {trainer} seed {seed}: {acc:.1f}% on {args.target} ({time.time() - start:.0f} s)", flush=True)
    return results


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
        "--trainers",
        nargs="+",
        default=["M3SDA", "MME"],
        choices=sorted(CONFIGS),
        help="trainers beside DAEL and SourceOnly (default: Dassl's M3SDA and MME)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="runs at a time, each on its share of the cores (default: 2 where there are 2 cores)",
    )
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
    if args.jobs < 1:
        p.error("--jobs takes a positive number")

    start = time.time()
    trainers = list(dict.fromkeys(["DAEL", "SourceOnly"] + list(args.trainers)))
    results = run_all([(t, seed) for seed in args.seeds for t in trainers], args)
    first = results[("DAEL", args.seeds[0])]
    experts = list(first["expert_accuracy"])
    others = [t for t in trainers if t not in ("DAEL", "SourceOnly")]
    print()
    print(
        f"Target domain: {args.target} (sources: {', '.join(first['source_domains'])}); "
        f"{args.epochs} epochs; engine {first['engine']}; machine: {machine()}; "
        f"{args.jobs} run(s) at a time; {time.time() - start:.0f} s"
    )
    header = ["seed", "SourceOnly", *others, "DAEL", "gain"] + [f"E[{e}]" for e in experts]
    print(" | ".join(f"{h:>10}" for h in header))
    gains = []
    for seed in args.seeds:
        dael, so = results[("DAEL", seed)], results[("SourceOnly", seed)]
        gain = dael["accuracy"] - so["accuracy"]
        gains.append(gain)
        cells = [str(seed), f"{so['accuracy']:.1f}"] + [f"{results[(t, seed)]['accuracy']:.1f}" for t in others]
        cells += [f"{dael['accuracy']:.1f}", f"{gain:+.1f}"]
        cells += [f"{dael['expert_accuracy'][e]:.1f}" for e in experts]
        print(" | ".join(f"{c:>10}" for c in cells))
    if len(args.seeds) > 1:
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        means = ", ".join(f"{t} {mean([results[(t, s)]['accuracy'] for s in args.seeds]):.1f}" for t in trainers)
        print(f"mean: {means}; DAEL's gain over SourceOnly {mean(gains):+.1f}")
    print(
        "(target test accuracy in %, the last epoch's model; gain = DAEL - SourceOnly; E[d] = DAEL's "
        "expert for source domain d alone; other machines give other numbers from the same seed)"
    )


if __name__ == "__main__":
    main()
