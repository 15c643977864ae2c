"""The step's activation estimate (engine/memory.py: saved_activation_bytes, check_step_memory):
a batch whose activations cannot fit is one line before the first batch, not minutes of filling
memory until the allocator's error (the probe: batch 65535 on a 360-image set, 109 s and 22 GB)."""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch import nn

from conftest import ROOT, run_here
from dael_plugin.engine.memory import check_step_memory, saved_activation_bytes
from dael_plugin.errors import DAELConfigError


def test_saved_bytes_by_hand():
    """Linear(4 -> 8, no bias) then ReLU on 2 images: autograd keeps the input of the product
    (2 x 4 floats, 32 bytes; the weight is a parameter, not counted) and the ReLU's output
    (2 x 8 floats, 64 bytes): 96 bytes. Counting the weight too gives 224; counting the ReLU's
    output twice (it is the module's output as well) would give 160."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8, bias=False), nn.ReLU())
    assert saved_activation_bytes(model, torch.randn(2, 4)) == 96


def test_batch_norm_statistics_are_left_alone():
    """The probe runs in train mode on copies of the buffers: the running statistics and the
    batch counter of the real model do not move, and the model's mode is restored."""
    torch.manual_seed(0)
    feat = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    heads = nn.Linear(4, 5)
    feat.eval()
    before = {k: v.clone() for k, v in feat.state_dict().items()}
    need = check_step_memory(
        nn.Sequential(feat, heads), torch.device("cpu"), (8, 8), 10, "fp32", "test", available=2**40
    )
    assert need is not None and need > 0
    after = feat.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert feat.training is False


def test_the_check_leaves_the_random_state_alone():
    """The probe's images and its dropout come from forked streams: a run draws the same numbers
    after the check as it would have without it."""
    torch.manual_seed(0)
    feat = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.Dropout(0.5), nn.ReLU())
    heads = nn.Linear(16, 5)
    before = torch.get_rng_state()
    check_step_memory(nn.Sequential(feat, heads), torch.device("cpu"), (8, 8), 10, "fp32", "t", available=2**40)
    assert torch.equal(torch.get_rng_state(), before)


def test_refuses_exactly_past_the_memory_available():
    torch.manual_seed(0)
    feat = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    heads = nn.Linear(4, 5)
    model = nn.Sequential(feat, heads)
    two, four = (saved_activation_bytes(model, torch.randn(n, 3, 8, 8)) for n in (2, 4))
    need = two + (four - two) / 2 * 998  # two images' bytes, and what each of 998 more adds
    assert (
        check_step_memory(
            nn.Sequential(feat, heads), torch.device("cpu"), (8, 8), 1000, "fp32", "w", available=int(need)
        )
        == need
    )
    with pytest.raises(DAELConfigError) as e:
        check_step_memory(
            nn.Sequential(feat, heads), torch.device("cpu"), (8, 8), 1000, "fp32", "3 x 4", available=int(need) - 1
        )
    line = str(e.value)
    assert "\n" not in line and "1000 images with gradients" in line and "lower the batch sizes" in line
    assert "(3 x 4: 1000" in line and "INPUT.SIZE (8, 8)" in line


def test_autocasts_weight_copies_count_once_not_per_image():
    """Under bf16 autocast the pass keeps bf16 copies of the weights once, whatever the batch.
    Counted per image (the probe's two images scaled), a bf16 ResNet-18 step at 96 x 96 and 64
    images came out at 828 MiB against the 168 MiB the H200's allocator held (2026-11-28),
    a false refusal in waiting. Here a 4 MiB weight and a batch of 1000: bf16's estimate is below
    fp32's (its activations are half the size), where per-image counting made it 200x larger."""
    torch.manual_seed(0)
    feat = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4096), nn.ReLU())
    heads = nn.Linear(4096, 5)
    cpu = torch.device("cpu")
    fp32 = check_step_memory(nn.Sequential(feat, heads), cpu, (8, 8), 1000, "fp32", "t", available=2**40)
    bf16 = check_step_memory(nn.Sequential(feat, heads), cpu, (8, 8), 1000, "bf16", "t", available=2**40)
    assert bf16 < fp32, (bf16, fp32)


def test_bf16_keeps_less_than_fp32():
    """The estimate runs in the step's precision: under bf16 autocast the convolution's output
    and what follows are kept in 2 bytes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU())
    x = torch.randn(2, 3, 16, 16)
    assert saved_activation_bytes(model, x, "bf16") < 0.75 * saved_activation_bytes(model, x, "fp32")


@pytest.mark.parametrize(
    "engine, opts",
    [
        # The plugin's CyclingDomainSampler fills a batch larger than a domain (Dassl's refuses it in a line)
        (
            "builtin",
            [
                "DATALOADER.TRAIN_X.BATCH_SIZE",
                "65535",
                "DATALOADER.TRAIN_U.BATCH_SIZE",
                "65535",
                "DATALOADER.TRAIN_X.SAMPLER",
                "CyclingDomainSampler",
            ],
        ),
        # Dassl's sampler cannot fill a batch larger than a domain (one line of its own): large images instead
        pytest.param("dassl", ["INPUT.SIZE", "(1024, 1024)"], marks=pytest.mark.dassl),
    ],
)
def test_a_step_too_big_for_memory_is_one_line_at_once(tmp_path, tiny_root, engine, opts):
    """The probe's case: DATALOADER.TRAIN_X.BATCH_SIZE 65535 on the embedded set (cut to 6 images
    per class and domain; the built-in engine samples a domain's images again to fill its share,
    with a warning). Before, the run filled 22 GB of memory over 109 s until the allocator's error;
    now one line before the first batch, naming the step's images and what to lower."""
    out = tmp_path / "out"
    t0 = time.monotonic()
    # In this process (run_here: what scripts/train.py calls), as the refusal comes before any batch.
    proc = run_here(
        ["--engine", engine, "--trainer", "DAEL", "--root", tiny_root, "--output-dir", str(out),
         "--dataset-config-file", os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml"),
         "--config-file", os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml"),
         "--source-domains", "hand", "blend", "font", "--target-domains", "street", "--",
         "DATALOADER.NUM_WORKERS", "0", "SELECTION.EVAL_FREQ", "0", *opts],
    )  # fmt: skip
    took = time.monotonic() - t0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(errors) == 1 and "a training step keeps at least" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert took < 120, took  # before: minutes, and the machine's memory filled


def test_on_a_gpu_memory_the_allocator_holds_unused_counts_as_available(monkeypatch):
    """On CUDA the available memory is the driver's free memory plus what PyTorch's caching
    allocator reserved and does not use (the driver counts it as taken). Stand-in: the CUDA
    queries mocked, the probe on the CPU; a real GPU's numbers are gpu_bench.sh's to see."""
    torch.manual_seed(0)
    feat = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.ReLU())
    heads = nn.Linear(16, 5)
    need = saved_activation_bytes(nn.Sequential(feat, heads), torch.randn(2, 3, 8, 8)) / 2 * 1000
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(need) // 2, 10**12))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: int(need))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: int(need) // 2)
    fake = torch.device("cuda", 0)
    import dael_plugin.engine.memory as ex

    real_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, device=None, **k: real_randn(*a, **k))  # the probe on the CPU
    # free need/2 + cached need/2 = need: exactly enough
    assert ex.check_step_memory(nn.Sequential(feat, heads), fake, (8, 8), 1000, "fp32", "w") == need
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: int(need) // 2 + 8)
    with pytest.raises(DAELConfigError, match="and this GPU has"):
        ex.check_step_memory(nn.Sequential(feat, heads), fake, (8, 8), 1000, "fp32", "w")
