"""CI accuracy test: DAEL beats SourceOnly on the embedded set's target domain,
by a margin that holds on any machine.

Both run through scripts/train.py on the built-in engine, so the test also
holds on a machine without Dassl, on the shipped embedded configs (the epoch
count is pinned here). Split: sources hand, street, font; target blend (the
demo's).

What it asserts: the MEAN gain (DAEL - SourceOnly, target test accuracy in
points) over seeds 1, 2 and 3 is at least MARGIN = 3.0.

Why a mean of three seeds, and this margin. A run is bitwise repeatable on one
machine, but another CPU (or a GPU) follows another trajectory from the same
seed, so a machine change acts like a seed change. Gains measured for this
split and schedule (15 epochs):

    machine                              code         seed 1  seed 2  seed 3
    2-core CPU "A" (margin first chosen) before v0.2  +10.4   +7.9    +7.5
    2-core CPU "B"                       before v0.2  +5.8    +6.7    +6.7
    H200 GPU, torch 2.11                 before v0.2  +5.8    +6.2    +7.5
    2-core Intel Xeon, torch 2.14.1      per-draw     +3.8    +9.6    +5.8
    2-core Intel Xeon, torch 2.14.1      0.3 fast     +5.8    +7.1    +1.7
    2-core Intel Xeon, torch 2.14.1      0.3, 1 thread +4.6   +11.7   +7.1
    2-core AMD EPYC, torch 2.14.1        0.4.0, 1 thr. +4.6   +6.7    +13.3
    2-core AMD EPYC, torch 2.14.1        c78e1fc, DAEL's views on the device, 1 thr.:
                                                      +6.7   +7.5    +6.7   (seeds 4-6: +5.4 +5.4 +9.2)
    2-core AMD EPYC, torch 2.14.1        ec2a441 (Dassl's RandomDomainSampler epoch), as this test runs:
                                                      +0.8   +4.6    +7.5   (seeds 4-6: +11.7 +7.1 +3.8)
    2-core AMD EPYC, torch 2.14.1        1fc3a85, as this test runs (2026-12-05):
                                                      +5.8   +4.6    +4.2   (seeds 4-6: +2.1 +8.3 +8.3)
    (per-draw seeding, issue 7, changed every trajectory; so did 0.3's fused
    pass, fused optimiser and channels_last, issue 8; and so does the thread
    count. The last three rows run as this test does: two runs side by
    side, one thread each, as scripts/sweep.py runs them; the second to last
    is this test's own output at b2d758a (PIL views), with seed 3 run by hand:
    SourceOnly 71.25 / 66.25 / 64.17, DAEL 75.83 / 72.92 / 77.50.)
- DAEL draws its views on the device (TRAINER.DAEL.AUG_ON_DEVICE, here the CPU) since
  2026-11-29: its run takes about a quarter less CPU than with the loader's PIL views (the suite's
  10-minute budget), on another trajectory, so its gains were measured again: the last row, seeds
  1-6 run with scripts/sweep.py (one thread a run, as here), SourceOnly 68.75 / 63.33 / 67.50 /
  67.50 / 66.25 / 65.42, DAEL 75.42 / 70.83 / 74.17 / 72.92 / 71.67 / 74.58. Its two-seed mean,
  +7.1, is 4.1 above MARGIN; every seed's gain is +5.4 or more.
- The loader workers change nothing: the views are drawn per image from the
  seed, so a run with DATALOADER.NUM_WORKERS 0 (as here, 15% less CPU) and
  one with the shipped 2 give the same accuracies (checked on the last row's
  seeds 1 and 2, both trainers).

- Since 366d3ad the built-in epoch is Dassl's (fewer steps than the epoch that
  covered the largest source domain), and DAEL's lead is smaller and wider
  spread: on the AMD VM, seeds 1 and 2 gave +0.8 and +4.6, a two-seed mean of
  +2.7, under the old MARGIN although DAEL leads on all six seeds (mean +5.9).
  So the test takes three seeds (SourceOnly 71.25 / 66.25 / 64.17, DAEL
  72.08 / 70.83 / 71.67 there: mean +4.3, 1.3 above MARGIN). At ec2a441 the
  two-seed test passed on the Xeon CI machine and failed on this AMD VM.
- A DAEL that only ties SourceOnly has a three-seed mean gain of 0 +- about
  1.9 (the two-seed figure below, times sqrt(2/3)), so it passes with a chance
  of about 1 in 18; at two seeds it was 1 in 10.
- Older single-seed gains range from +1.7 to +13.3 (mean about 7.0). The old test
  asserted +4 on seed 1 alone: it fails on the fourth row (+3.8) although
  DAEL leads there on every seed.
- A DAEL that ties SourceOnly has a two-seed mean gain of 0 +- about 2.3
  (SourceOnly alone varies 63.3-72.1 over seeds and machines).
- Pinning one thread per run makes the result independent of the machine's
  core count (the default thread count follows it); the three seeds run side
  by side, one thread each, as scripts/sweep.py runs them, each in a process
  forked after one process's imports (tests/forked_runs.py: about 4 s of CPU
  less a run, and the numbers of separate processes, bit for bit).
- The third seed costs about a minute of the suite on 2 cores.
- Fewer epochs do not hold the margin: at 10 epochs (0.4.0, AMD EPYC) the
  gains were +3.3, +6.3, +7.1, +5.0 on seeds 1-4 (two-seed mean +4.8, 1.8
  above MARGIN); at 8, -3.8, +7.1, -2.5, +5.0 (DAEL underfits). With Dassl's
  epoch (ac3e369, AMD EPYC, run as this test runs, at 10 epochs) seeds 1-6
  gave -2.5, 0.0, -2.1, +4.2, +2.9, +2.9 (mean +0.9; SourceOnly 71.25 / 63.33 /
  63.75 / 64.17 / 63.33 / 64.58, DAEL 68.75 / 63.33 / 61.67 / 68.33 / 66.25 /
  67.50), so the test keeps 15 epochs (a third of the suite's CPU time would
  have been saved at 10).
- The last row: SourceOnly 68.75 / 63.33 / 67.50 / 67.50 / 66.25 / 65.42 (seeds 1-6, the same
  as at c78e1fc), DAEL 74.58 / 67.92 / 71.67 / 69.58 / 74.58 / 73.75: the three-seed mean is
  +4.9, 1.9 above MARGIN. SourceOnly with the execution options DAEL runs with
  (EXECUTION.CHANNELS_LAST and FUSED_OPTIM True) takes a third less CPU (29 s a run instead of
  43), on another trajectory: 71.25 / 62.92 / 68.75 / 68.33 / 68.33 / 68.33, a three-seed mean
  gain of +3.75, 0.75 above MARGIN. So SourceOnly keeps its defaults here (Dassl's plain step).
- The same test on the previous configs (a random crop in the weak view) put
  DAEL behind SourceOnly (64.2 vs 65.8 on seed 1), which this test rejects.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.accuracy

EPOCHS = 15
SEEDS = (1, 2, 3)
MARGIN = 3.0
THREADS = "1"  # pinned: a thread count changes float sums, so the trajectory

DS = os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml")
CFG = {
    "DAEL": "configs/trainers/da/dael/embedded_digits.yaml",
    "SourceOnly": "configs/trainers/da/source_only/embedded_digits.yaml",
}


def _args(data_root, trainer, seed, out):
    args = [
        "--engine",
        "builtin",
        "--trainer",
        trainer,
        "--root",
        data_root,
        "--dataset-config-file",
        DS,
        "--config-file",
        os.path.join(ROOT, CFG[trainer]),
        "--source-domains",
        "hand",
        "street",
        "font",
        "--target-domains",
        "blend",
        "--output-dir",
        str(out),
        "--seed",
        str(seed),
        "OPTIM.MAX_EPOCH",
        str(EPOCHS),
        "USE_CUDA",
        "False",
        # No per-epoch records (the default writes them on this small set): they leave training
        # unchanged bit for bit (test_selection.py) and would cost about a CPU-minute here.
        "SELECTION.EVAL_FREQ",
        "0",
        # The batches in the run's own process: the views are drawn per image from the seed
        # (issue 7), so the numbers are those of the shipped 2 workers, bit for bit, for about 15%
        # less CPU (no worker processes, no batches sent between processes).
        "DATALOADER.NUM_WORKERS",
        "0",
    ]
    if trainer == "DAEL":  # its views drawn in batch on the CPU: about a quarter less CPU
        args += ["TRAINER.DAEL.AUG_ON_DEVICE", "True"]
    return args


def _accuracies(tmp_path, data_root, trainer):
    """One run per seed, side by side (one thread each), as scripts/sweep.py runs them: each a
    process of its own, forked after one process's imports (tests/forked_runs.py)."""
    outs = [tmp_path / f"{trainer}_{seed}" for seed in SEEDS]
    logs = [tmp_path / f"{trainer}_{seed}.log" for seed in SEEDS]
    runs = [[str(log)] + _args(data_root, trainer, seed, out) for seed, out, log in zip(SEEDS, outs, logs)]
    (tmp_path / f"{trainer}.json").write_text(json.dumps(runs))
    env = dict(os.environ, OMP_NUM_THREADS=THREADS, MKL_NUM_THREADS=THREADS)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "forked_runs.py"), str(tmp_path / f"{trainer}.json")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + "".join(log.read_text()[-3000:] for log in logs)
    return [json.loads((out / "results.json").read_text())["accuracy"] for out in outs]


def test_dael_beats_source_only_on_the_target(tmp_path, data_root):
    so = _accuracies(tmp_path, data_root, "SourceOnly")
    dael = _accuracies(tmp_path, data_root, "DAEL")
    gains = [d - s for d, s in zip(dael, so)]
    for seed, s, d, g in zip(SEEDS, so, dael, gains):
        print(f"target blend, {EPOCHS} epochs, seed {seed}: SourceOnly {s:.2f}, DAEL {d:.2f}, gain {g:+.2f}")
    mean = sum(gains) / len(gains)
    print(f"mean gain over seeds {SEEDS}: {mean:+.2f} (margin {MARGIN})")
    assert mean >= MARGIN, (gains, mean)
