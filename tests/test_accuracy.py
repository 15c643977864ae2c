"""CI accuracy test: DAEL beats SourceOnly on the embedded set's target domain.

Both run through scripts/train.py on the built-in engine, so the test also
holds on a machine without Dassl, on the shipped embedded configs (the epoch
count is pinned here, so a change to the configs shows up as a change here). Split: sources hand, street, font; target blend (the demo's).

How the schedule, seed and margin were chosen (2 CPU cores, torch 2.14.1,
built-in engine, measured before this test was written; gain = DAEL - SourceOnly
in target accuracy points):

- 8 epochs (about 1.5 minutes for both) is too short: gains over seeds 1-4 were
  +3.8, +4.2, -2.9, -3.3, and with 16 images per domain per batch (more steps)
  +2.5 and +3.8 for seeds 1 and 3. DAEL's pseudo-labels need time to pass the
  0.95 threshold.
- So the test uses the shipped schedule, 15 epochs (the demo's; about 3.5
  minutes for both): gains +10.4, +7.9 and +7.5 for seeds 1, 2 and 3.
- A fixed seed makes a run repeatable on one machine (seeded sampler, workers
  and RandAugment), so the test does not flicker from run to run.
  Floating-point differences between machines can still move a result by a
  few test images (one image is 0.42 points).
- MARGIN = 4 points: about half the smallest measured gain, so it passes with
  room on other machines, yet a DAEL that only ties SourceOnly fails. The same
  two runs on the previous configs (a random crop in the weak view) put DAEL
  1.7 points behind SourceOnly (64.2 vs 65.8), which this test rejects.
- The same command on an H200 GPU (torch 2.11) gave gains +5.8, +6.2 and +7.5.
"""
import json
import os

import pytest

from conftest import ROOT, run_train

pytestmark = pytest.mark.accuracy

EPOCHS = 15
SEED = 1
MARGIN = 4.0

DS = os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml")
CFG = {"DAEL": "configs/trainers/da/dael/embedded_digits.yaml",
       "SourceOnly": "configs/trainers/da/source_only/embedded_digits.yaml"}


def _accuracy(tmp_path, data_root, trainer, extra=()):
    out = tmp_path / trainer
    args = ["--engine", "builtin", "--trainer", trainer, "--root", data_root, "--dataset-config-file", DS,
            "--config-file", os.path.join(ROOT, CFG[trainer]), "--source-domains", "hand", "street", "font",
            "--target-domains", "blend", "--output-dir", str(out), "--seed", str(SEED),
            "OPTIM.MAX_EPOCH", str(EPOCHS), "USE_CUDA", "False"] + list(extra)
    proc = run_train(args)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((out / "results.json").read_text())


def test_dael_beats_source_only_on_the_target(tmp_path, data_root):
    so = _accuracy(tmp_path, data_root, "SourceOnly")
    dael = _accuracy(tmp_path, data_root, "DAEL")
    print(f"target blend, {EPOCHS} epochs, seed {SEED}: SourceOnly {so['accuracy']:.2f}, DAEL {dael['accuracy']:.2f}, "
          f"experts {dael['expert_accuracy']}")
    assert dael["accuracy"] >= so["accuracy"] + MARGIN, (dael["accuracy"], so["accuracy"])
