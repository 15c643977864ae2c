#!/usr/bin/env python
"""Fidelity check: Dassl's own DAEL against the plugin's, on images read by Dassl's own reader.

The embedded set (scikit-learn's handwritten digits and sample photographs, Pillow's font) is laid
out as Dassl's miniDomainNet (``<root>/domainnet/<domain>/<class>/*.png`` with
``splits_mini/<domain>_{train,test}.txt``; hand -> clipart, blend -> painting, street -> real,
font -> sketch), so Dassl's ``miniDomainNet`` reader reads it unchanged. Each path then trains
DAEL with Dassl's Digit-5 strong view (``randaugment2``) and ``cnn_digitsdg`` at 32x32:

- ``dassl``: Dassl's own ``tools/train.py`` and DAEL, no plugin (``--dassl-tools``);
- ``plugin-dassl``: the plugin's DAEL on Dassl's loop and data (``--engine dassl``);
- ``plugin-builtin``: the plugin's built-in engine, views on the host;
- ``plugin-builtin-device``: the same with ``TRAINER.DAEL.AUG_ON_DEVICE True``;
- ``sourceonly``: the built-in SourceOnly, for the gain.

Every run has one thread and no loader workers; ``--jobs`` runs at a time. Prints a table of the
target test accuracy per seed and the mean (sd) per path; writes ``<out>/fidelity.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MAPPING = {"hand": "clipart", "blend": "painting", "street": "real", "font": "sketch"}
PATHS = ("dassl", "plugin-dassl", "plugin-builtin", "plugin-builtin-device", "sourceonly")

DATASET_YAML = """INPUT:
  SIZE: (32, 32)
  PIXEL_MEAN: [0.5, 0.5, 0.5]
  PIXEL_STD: [0.5, 0.5, 0.5]
  TRANSFORMS: ["normalize"]
DATASET:
  NAME: "miniDomainNet"
MODEL:
  BACKBONE:
    NAME: "cnn_digitsdg"
"""
TRAINER_YAML = """DATALOADER:
  NUM_WORKERS: 0
  TRAIN_X:
    SAMPLER: "{sampler}"
    BATCH_SIZE: 96
  TRAIN_U:
    SAME_AS_X: False
    BATCH_SIZE: 32
  TEST:
    BATCH_SIZE: 256
OPTIM:
  NAME: "sgd"
  LR: 0.05
  MAX_EPOCH: {epochs}
  LR_SCHEDULER: "cosine"
TRAIN:
  PRINT_FREQ: 50
{trainer}"""
DAEL_NODE = """TRAINER:
  DAEL:
    STRONG_TRANSFORMS: ["randaugment2", "normalize"]
"""


def lay_out(embedded: str, root: str) -> None:
    """Dassl's miniDomainNet layout of the embedded set, as links (made once)."""
    base = os.path.join(root, "domainnet")
    os.makedirs(os.path.join(base, "splits_mini"), exist_ok=True)
    for ours, theirs in MAPPING.items():
        for split in ("train", "test"):
            lines = []
            folder = os.path.join(embedded, ours, split)
            for label, cls in enumerate(sorted(os.listdir(folder), key=int)):
                os.makedirs(os.path.join(base, theirs, cls), exist_ok=True)
                for name in sorted(os.listdir(os.path.join(folder, cls))):
                    rel = f"{theirs}/{cls}/{split}_{name}"
                    link = os.path.join(base, rel)
                    if not os.path.lexists(link):
                        os.symlink(os.path.join(folder, cls, name), link)
                    lines.append(f"{rel} {label}\n")
            with open(os.path.join(base, "splits_mini", f"{theirs}_{split}.txt"), "w") as f:
                f.writelines(lines)


def command(path: str, seed: int, args, cfgs: dict, out: str) -> list:
    sources, target = [MAPPING[d] for d in ("hand", "street", "font")], MAPPING["blend"]
    trainer = "SourceOnly" if path == "sourceonly" else "DAEL"
    common = ["--root", args.root, "--trainer", trainer, "--dataset-config-file", cfgs["dataset"],
              "--config-file", cfgs[trainer], "--source-domains", *sources, "--target-domains", target,
              "--output-dir", out, "--seed", str(seed)]  # fmt: skip
    if path == "dassl":
        return [sys.executable, os.path.join(args.dassl_tools, "train.py"), *common]
    engine = "dassl" if path == "plugin-dassl" else "builtin"
    opts = ["SELECTION.EVAL_FREQ", "0"]
    if path == "plugin-builtin-device":
        opts += ["TRAINER.DAEL.AUG_ON_DEVICE", "True"]
    return [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--engine", engine, *common, *opts]


def accuracy(path: str, out: str) -> float:
    if path == "dassl":  # Dassl writes no results file: its log's last "* accuracy: X%" line
        found = re.findall(r"\* accuracy: ([0-9.]+)%", open(os.path.join(out, "log.txt")).read())
        if not found:
            raise RuntimeError(f"no accuracy line in {out}/log.txt")
        return float(found[-1])
    return float(json.load(open(os.path.join(out, "results.json")))["accuracy"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=os.path.join(ROOT, "data", "fidelity"))
    p.add_argument("--output-dir", default=os.path.join(ROOT, "output", "fidelity"))
    p.add_argument("--dassl-tools", help="Dassl's tools/ folder (its train.py), for the 'dassl' path")
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args()
    if "dassl" in args.paths and not args.dassl_tools:
        p.error("the 'dassl' path needs --dassl-tools (Dassl's tools/ folder)")

    from dael_plugin.data.embedded import DATASET_DIR, ensure_embedded

    ensure_embedded(os.path.join(ROOT, "data"))
    lay_out(os.path.join(ROOT, "data", DATASET_DIR), args.root)
    os.makedirs(args.output_dir, exist_ok=True)
    cfgs = {"dataset": os.path.join(args.output_dir, "dataset.yaml")}
    with open(cfgs["dataset"], "w") as f:
        f.write(DATASET_YAML)
    for trainer, sampler, node in (("DAEL", "RandomDomainSampler", DAEL_NODE), ("SourceOnly", "RandomSampler", "")):
        cfgs[trainer] = os.path.join(args.output_dir, f"{trainer}.yaml")
        with open(cfgs[trainer], "w") as f:
            f.write(TRAINER_YAML.format(sampler=sampler, epochs=args.epochs, trainer=node))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    runs = [(path, seed) for seed in args.seeds for path in args.paths]

    def run(job):
        path, seed = job
        out = os.path.join(args.output_dir, path, f"seed{seed}")
        os.makedirs(out, exist_ok=True)
        with open(out + ".out", "w") as log:
            rc = subprocess.call(command(path, seed, args, cfgs, out), stdout=log, stderr=subprocess.STDOUT, env=env)
        acc = accuracy(path, out) if rc == 0 else None
        print(f"[fidelity] {path} seed {seed}: " + (f"{acc:.1f}%" if rc == 0 else f"failed (rc {rc}, {out}.out)"))
        return path, seed, acc

    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run, runs))
    table = {path: {s: a for p_, s, a in results if p_ == path} for path in args.paths}
    with open(os.path.join(args.output_dir, "fidelity.json"), "w") as f:
        json.dump({"epochs": args.epochs, "seeds": args.seeds, "accuracy": table}, f, indent=1)
    print(f"{'path':>22} | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean (sd)")
    for path, row in table.items():
        accs = [row[s] for s in args.seeds if row[s] is not None]
        cells = " | ".join(f"{row[s]:6.1f}" if row[s] is not None else "failed" for s in args.seeds)
        sd = statistics.stdev(accs) if len(accs) > 1 else float("nan")
        mean = f"{statistics.mean(accs):.1f} ({sd:.1f})" if accs else "-"
        print(f"{path:>22} | {cells} | {mean}")
    return 0 if all(a is not None for _, _, a in results) else 1


if __name__ == "__main__":
    sys.exit(main())
