"""CI accuracy test: DAEL beats SourceOnly on the embedded set's target domain,
by a margin that holds on any machine.

Both run through scripts/train.py on the built-in engine, so the test also
holds on a machine without Dassl, on the shipped embedded configs (the epoch
count is pinned here). Split: sources hand, street, font; target blend (the
demo's).

What it asserts: the MEAN gain (DAEL - SourceOnly, target test accuracy in
points) over seeds 1 and 2 is at least MARGIN = 3.0.

Why a mean of two seeds, and this margin. A run is bitwise repeatable on one
machine, but another CPU (or a GPU) follows another trajectory from the same
seed, so a machine change acts like a seed change. Gains measured for this
split and schedule (15 epochs):

    machine                              code         seed 1  seed 2  seed 3
    2-core CPU "A" (margin first chosen) before v0.2  +10.4   +7.9    +7.5
    2-core CPU "B"                       before v0.2  +5.8    +6.7    +6.7
    H200 GPU, torch 2.11                 before v0.2  +5.8    +6.2    +7.5
    2-core Intel Xeon, torch 2.14.1      per-draw     +3.8    +9.6    +5.8
    2-core Intel Xeon, torch 2.14.1      0.3 fast     +5.8    +7.1    +1.7
    (per-draw seeding, issue 7, changed every trajectory; so did 0.3's fused
    pass, fused optimiser and channels_last, issue 8)

- Single-seed gains range from +3.8 to +10.4 (mean about 7.0, spread about
  1.8). The old test asserted +4 on seed 1 alone: it fails on the last
  machine (+3.8) although DAEL leads there on every seed.
- The mean over seeds 1 and 2 was +9.2, +6.3, +6.0 and +6.7 on the four
  machines: at least 3.0 points above MARGIN everywhere, about 2.4 spreads of a
  two-seed mean. A DAEL that only ties SourceOnly has a two-seed mean gain of
  0 +- about 2.3 (SourceOnly alone varies 64.6-72.1 over seeds and machines),
  so it passes with a chance of about 1 in 10.
- A third seed would tighten both sides, but costs another 3-4 minutes on 2
  cores; two seeds already take about 6 of the suite's minutes.
- The same test on the previous configs (a random crop in the weak view) put
  DAEL behind SourceOnly (64.2 vs 65.8 on seed 1), which this test rejects.
"""
import json
import os

import pytest

from conftest import ROOT, run_train

pytestmark = pytest.mark.accuracy

EPOCHS = 15
SEEDS = (1, 2)
MARGIN = 3.0

DS = os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml")
CFG = {"DAEL": "configs/trainers/da/dael/embedded_digits.yaml",
       "SourceOnly": "configs/trainers/da/source_only/embedded_digits.yaml"}


def _accuracy(tmp_path, data_root, trainer, seed):
    out = tmp_path / f"{trainer}_{seed}"
    args = ["--engine", "builtin", "--trainer", trainer, "--root", data_root, "--dataset-config-file", DS,
            "--config-file", os.path.join(ROOT, CFG[trainer]), "--source-domains", "hand", "street", "font",
            "--target-domains", "blend", "--output-dir", str(out), "--seed", str(seed),
            "OPTIM.MAX_EPOCH", str(EPOCHS), "USE_CUDA", "False"]
    proc = run_train(args)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((out / "results.json").read_text())["accuracy"]


def test_dael_beats_source_only_on_the_target(tmp_path, data_root):
    gains = []
    for seed in SEEDS:
        so = _accuracy(tmp_path, data_root, "SourceOnly", seed)
        dael = _accuracy(tmp_path, data_root, "DAEL", seed)
        gains.append(dael - so)
        print(f"target blend, {EPOCHS} epochs, seed {seed}: SourceOnly {so:.2f}, DAEL {dael:.2f}, gain {dael - so:+.2f}")
    mean = sum(gains) / len(gains)
    print(f"mean gain over seeds {SEEDS}: {mean:+.2f} (margin {MARGIN})")
    assert mean >= MARGIN, (gains, mean)
