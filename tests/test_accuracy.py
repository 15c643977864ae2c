"""CI accuracy test: DAEL beats SourceOnly on the embedded set's target domain,
by a margin that holds on any machine.

Both run through scripts/train.py on the built-in engine, so the test also holds on a machine
without Dassl, on the shipped embedded configs (the epoch count pinned here). Split: sources hand,
street, font; target blend (the demo's).

What it asserts: the MEAN gain (DAEL - SourceOnly, in points) over seeds 1 and 2 is at least
MARGIN = 3.0, where a run's accuracy is its final model's on ALL of the target domain's 1198
images: its 958 training images, which the runs read unlabeled (DAEL) or not at all
(SourceOnly) and whose labels only this test reads, and its 240 test images. The test also holds
each run's results.json accuracy to the same model's on the 240 test images, image for image, so
the CLI's own evaluation is checked as before.

Why all 1198 images, two seeds and this margin. A run repeats bit for bit on one machine, but
another CPU (or a GPU, or a thread count) follows another trajectory from the same seed, so a
machine change acts like a seed change, and the margin must hold over seeds. On 240 test images
one image is 0.42 points, and two models of equal worth differ there by several points by chance:
measured over seeds 1-8 on the 2-core AMD EPYC VM (torch 2.14.1, one thread a run, as this test
runs them; 2026-12-05, code of b586ddc), the gains were

    on the 240 test images:      +5.8 +4.6 +4.2 +2.1 +8.3 +8.3 +3.3 +5.4   mean 5.26, sd 2.23
    on all 1198 target images:   +4.8 +8.1 +6.3 +6.9 +5.0 +3.0 +4.8 +4.7   mean 5.46, sd 1.58

(SourceOnly on the 1198: 70.87 63.77 67.11 68.61 69.28 70.20 71.54 67.03; DAEL: 75.71 71.87
73.37 75.54 74.29 73.21 76.38 71.70.) The larger set halves the variance of a seed's gain, so
the mean of two seeds on it (sd about 1.1) varies less than the mean of three on the test split
(sd about 1.3), which this test took before, for two thirds of the CPU (four 15-epoch runs
instead of six: the suite's 10-minute budget). With that spread the margin fails a working
DAEL on another trajectory about once in 70 (2.2 sd under the mean), and passes a DAEL that only
ties SourceOnly about once in 270 (2.7 sd over 0).

What it cannot see: a DAEL without L_u (TRAINER.DAEL.WEIGHT_U 0) passes it. Its target chunk
still runs through the backbone in training mode, so batch norm adapts to the target, and it
gained +2.7, +6.9, +3.5, +5.0 on seeds 1-4 on the 1198 images (+1.3, +4.6, -1.3, +4.6 on the 240
test images, where the three-seed test failed it on seeds 1-3 and passed it nowhere by much:
+1.5 there, +2.6 on seeds 2-4). L_u's own worth on this set, a point or two, is under the spread
of a few seeds; L_u itself is held by the hand-worked losses (test_core_losses.py) and by three
steps equal to Dassl's DAEL (test_dassl_adapter.py, test_dassl_hardening.py).

- Each run is pinned to one thread (the thread count changes float sums, so the trajectory) and
  runs beside the others, as scripts/sweep.py runs them, each a process forked after one
  process's imports (tests/forked_runs.py: the numbers of separate processes, bit for bit).
- DAEL draws its views on the device (TRAINER.DAEL.AUG_ON_DEVICE, here the CPU): a quarter less
  CPU than the loader's PIL views, on its own trajectory (the gains above are of this form).
- The loader workers change nothing (the views are drawn per image from the seed), so the runs
  take DATALOADER.NUM_WORKERS 0 (15% less CPU than the shipped 2, the same accuracies).
- Fewer epochs do not hold the margin: at 10 epochs (Dassl's epoch, AMD EPYC) seeds 1-6 gained
  -2.5, 0.0, -2.1, +4.2, +2.9, +2.9 on the test split (DAEL underfits). SourceOnly with DAEL's
  execution options (EXECUTION.CHANNELS_LAST, FUSED_OPTIM) takes a third less CPU, on another
  trajectory where the three-seed gain on the test split was +3.75; it keeps Dassl's plain step.
- The same test on earlier configs (a random crop in the weak view) put DAEL behind SourceOnly
  (64.2 vs 65.8 on seed 1), which this test rejects.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.accuracy

EPOCHS = 15
SEEDS = (1, 2)
MARGIN = 3.0
THREADS = "1"  # pinned: a thread count changes float sums, so the trajectory
TRAINERS = ("SourceOnly", "DAEL")

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


def _train(tmp_path, data_root):
    """Every run side by side (one thread each), as scripts/sweep.py runs them: each a process of
    its own, forked after one process's imports (tests/forked_runs.py). Returns each run's folder."""
    outs = {(t, s): tmp_path / f"{t}_{s}" for t in TRAINERS for s in SEEDS}
    logs = {k: tmp_path / f"{out.name}.log" for k, out in outs.items()}
    runs = [[str(logs[k])] + _args(data_root, k[0], k[1], out) for k, out in outs.items()]
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    env = dict(os.environ, OMP_NUM_THREADS=THREADS, MKL_NUM_THREADS=THREADS)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "forked_runs.py"), str(tmp_path / "runs.json")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + "".join(log.read_text()[-3000:] for log in logs.values())
    return outs


def _target_accuracy(out):
    """The final model's accuracy (%) on all of the target domain's images, its training and test
    splits, and on its test split alone (the run's ensemble, as evaluated)."""
    import torch

    from dael_plugin.tools.model_figures import LoadedRun

    rec = dict(json.loads((out / "results.json").read_text()), _dir=str(out))
    run = LoadedRun(rec)  # the "last" checkpoint: the model results.json scored
    target_train = run.target_train  # the target's training images, which the runs read unlabeled
    right = {}
    for split, items in (("train_u", target_train), ("test", run.test)):
        pred = run.ensemble(run.features_and_probs(items)[1]).argmax(-1)
        right[split] = (pred == torch.tensor([i.label for i in items])).sum().item()
    n_test, n_all = len(run.test), len(run.test) + len(target_train)
    return 100 * (right["train_u"] + right["test"]) / n_all, 100 * right["test"] / n_test, rec["accuracy"]


def test_dael_beats_source_only_on_the_target(tmp_path, data_root):
    outs = _train(tmp_path, data_root)
    acc = {}
    for key, out in outs.items():
        everything, test, reported = _target_accuracy(out)
        # results.json's accuracy is this model's (to its 4 decimals; one test image is 0.42 points)
        assert abs(test - reported) < 1e-3, (key, test, reported)
        acc[key] = everything
    gains = [acc["DAEL", s] - acc["SourceOnly", s] for s in SEEDS]
    for seed, gain in zip(SEEDS, gains):
        so, dael = acc["SourceOnly", seed], acc["DAEL", seed]
        print(
            f"target blend (all images), {EPOCHS} epochs, seed {seed}: SourceOnly {so:.2f}, DAEL {dael:.2f}, gain {gain:+.2f}"
        )
    mean = sum(gains) / len(gains)
    print(f"mean gain over seeds {SEEDS}: {mean:+.2f} (margin {MARGIN})")
    assert mean >= MARGIN, (gains, mean)
