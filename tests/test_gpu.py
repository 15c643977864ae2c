"""On one GPU (skipped without CUDA): the built-in engine trains there, and no
training step of DAEL or SourceOnly makes the host wait for the device."""
import os

import pytest
import torch

from conftest import ROOT

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("trainer,cfg,extra", [
    ("DAEL", "dael", []),
    ("DAEL", "dael", ["TRAINER.DAEL.AUG_ON_DEVICE", "True", "TRAINER.DAEL.PREC", "bf16"]),
    ("DAEL", "dael", ["TRAINER.DAEL.COMPILE", "reduce-overhead"]),
    ("SourceOnly", "source_only", []),
])
def test_training_steps_do_not_sync_the_host(tmp_path, tiny_root, trainer, cfg, extra):
    from dael_plugin.builtin.trainer import build_builtin_trainer, set_random_seed
    from dael_plugin.cli import build_parser, setup_cfg

    args = build_parser().parse_args([
        "--engine", "builtin", "--trainer", trainer, "--root", tiny_root,
        "--dataset-config-file", os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml"),
        "--config-file", os.path.join(ROOT, f"configs/trainers/da/{cfg}/embedded_digits.yaml"),
        "--source-domains", "hand", "street", "font", "--target-domains", "blend",
        "--output-dir", str(tmp_path), "--seed", "1",
        "DATALOADER.NUM_WORKERS", "0", "DATALOADER.TRAIN_X.BATCH_SIZE", "24", "DATALOADER.TRAIN_U.BATCH_SIZE", "8",
    ] + extra)
    set_random_seed(1)
    tr = build_builtin_trainer(setup_cfg(args, "builtin"))
    assert tr.device.type == "cuda"
    tr.modules.train()
    batches = [b for _, b in zip(range(6), tr._batches())]
    for b in batches[:3]:  # warm-up: lazy CUDA initialisation, compilation and graph capture may sync
        tr.forward_backward(*b)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a synchronising call below raises
    try:
        outs = [tr.forward_backward(*b) for b in batches[3:]]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.isfinite(v).all() for v in outs[-1].values())
    assert all(v.device.type == "cuda" for v in outs[-1].values())
