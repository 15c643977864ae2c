"""On one GPU (skipped without CUDA): the paths a GPU run takes, checked where only a GPU can.

- no training step makes the host wait for the device, for every execution option
  (``torch.cuda.set_sync_debug_mode("error")`` raises at any synchronising call);
- fp16 trains (its loss scaler and the fused optimiser);
- the grouped per-chunk batch norm (``CHUNK_BN auto`` on CUDA) gives split's numbers in fp32 and bf16;
- ``COMPILE reduce-overhead`` really replays CUDA graphs (a silent fallback would pass a timing test);
- views made on the device with the paper's miniDomainNet transforms (cutout included).

``scripts/gpu_bench.sh --quick`` runs these but the ``compiled`` ones (``-m "not compiled"``); its
second part runs those (``-m compiled``) and the benchmark.
"""

import copy
import os

import pytest
import torch

from conftest import ROOT

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PAPER = [
    "INPUT.TRANSFORMS",
    "['random_flip', 'random_translation', 'normalize']",
    "TRAINER.DAEL.STRONG_TRANSFORMS",
    "['random_flip', 'cutout', 'randaugment2', 'normalize']",
]


def _trainer(tmp_path, tiny_root, trainer="DAEL", cfg="dael", extra=()):
    from dael_plugin.engine.trainer import set_random_seed
    from dael_plugin.methods import build_trainer
    from dael_plugin.tools.train import build_parser, setup_cfg

    args = build_parser().parse_args(
        [
            "--engine",
            "builtin",
            "--trainer",
            trainer,
            "--root",
            tiny_root,
            "--dataset-config-file",
            os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml"),
            "--config-file",
            os.path.join(ROOT, f"configs/trainers/da/{cfg}/embedded_digits.yaml"),
            "--source-domains",
            "hand",
            "street",
            "font",
            "--target-domains",
            "blend",
            "--output-dir",
            str(tmp_path),
            "--seed",
            "1",
            "DATALOADER.NUM_WORKERS",
            "0",
            "DATALOADER.TRAIN_X.BATCH_SIZE",
            "24",
            "DATALOADER.TRAIN_U.BATCH_SIZE",
            "8",
        ]
        + list(extra)
    )
    set_random_seed(1)
    tr = build_trainer(setup_cfg(args, "builtin"))
    assert tr.device.type == "cuda"
    tr.modules.train()
    return tr


OPTIONS = {
    "defaults": [],
    "fp16": ["TRAINER.DAEL.PREC", "fp16"],
    "bf16": ["TRAINER.DAEL.PREC", "bf16"],
    "split batch norm": ["TRAINER.DAEL.CHUNK_BN", "split"],
    "one call per chunk": ["TRAINER.DAEL.FUSE_CHUNKS", "False"],
    "plain optimiser": ["TRAINER.DAEL.FUSED_OPTIM", "False"],
    "default layout": ["TRAINER.DAEL.CHANNELS_LAST", "False"],
    "views on the device, paper's transforms": ["TRAINER.DAEL.AUG_ON_DEVICE", "True"] + PAPER,
    "views on the device, bf16": ["TRAINER.DAEL.AUG_ON_DEVICE", "True", "TRAINER.DAEL.PREC", "bf16"] + PAPER,
    "reduce-overhead": ["TRAINER.DAEL.COMPILE", "reduce-overhead"],
    "reduce-overhead, views on the device, fp16": [
        "TRAINER.DAEL.COMPILE",
        "reduce-overhead",
        "TRAINER.DAEL.AUG_ON_DEVICE",
        "True",
        "TRAINER.DAEL.PREC",
        "fp16",
    ]
    + PAPER,
}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.compiled) if "reduce-overhead" in n else n for n in OPTIONS] + ["SourceOnly"],
)
def test_training_steps_do_not_sync_the_host(tmp_path, tiny_root, name):
    if name == "SourceOnly":
        tr = _trainer(tmp_path, tiny_root, "SourceOnly", "source_only")
    else:
        tr = _trainer(tmp_path, tiny_root, extra=OPTIONS[name])
    batches = [b for _, b in zip(range(7), tr._batches())]
    for b in batches[:4]:  # warm-up: lazy CUDA initialisation, compilation and graph capture may sync
        tr.forward_backward(*b)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a synchronising call below raises
    try:
        outs = [tr.forward_backward(*b) for b in batches[4:]]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.isfinite(v).all() for v in outs[-1].values()), outs[-1]
    assert all(v.device.type == "cuda" for v in outs[-1].values())
    if "fp16" in name:
        assert tr.step.scaler is not None and tr.step.scaler.get_scale() > 0


@pytest.mark.parametrize("prec", ["fp32", "bf16"])
def test_grouped_batch_norm_gives_splits_numbers_on_cuda(prec):
    from dael_plugin.backbones import build_backbone
    from dael_plugin.core.chunk_norm import per_chunk_batch_norm

    tf32 = torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cudnn.allow_tf32 = False  # compare the batch norms, not TF32's rounding
    torch.set_float32_matmul_precision("highest")
    try:
        torch.manual_seed(0)
        net = build_backbone("timm_resnet18").cuda().to(memory_format=torch.channels_last).train()
        x = torch.randn(7 * 16, 3, 64, 64, device="cuda").contiguous(memory_format=torch.channels_last)
        sizes = [16] * 6 + [16]
        dtype = torch.bfloat16 if prec == "bf16" else None
        outs = []
        for impl in ("split", "grouped"):
            m = copy.deepcopy(net)
            with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                with per_chunk_batch_norm(m, sizes, impl):
                    y = m(x)
            y.float().square().mean().backward()
            outs.append((y.float(), m))
        (ya, a), (yb, b) = outs
        tol = 1e-4 if prec == "fp32" else 3e-2
        rel = lambda u, v: ((u - v).abs().max() / v.abs().max().clamp_min(1)).item()  # noqa: E731
        assert rel(yb, ya) <= tol
        for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
            assert rel(pb.grad.float(), pa.grad.float()) <= tol, n
        for (n, ba), bb in zip(a.named_buffers(), b.buffers()):
            assert rel(bb.float(), ba.float()) <= (1e-5 if prec == "fp32" else 3e-3), n
    finally:
        torch.backends.cudnn.allow_tf32 = tf32[0]
        torch.set_float32_matmul_precision(tf32[1])


@pytest.mark.parametrize("prec", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("ratio", [0.5, 10.0, 30.0])
def test_grouped_batch_norm_is_as_accurate_as_cudnn(prec, ratio):
    """The CPU test's float64 comparison on CUDA, against torch's CUDA batch norm (cuDNN)."""
    from test_chunk_norm import test_grouped_batch_norm_is_as_accurate_as_the_native_kernel as check

    check(prec, ratio, device="cuda")


@pytest.mark.compiled
def test_reduce_overhead_replays_cuda_graphs(tmp_path, tiny_root):
    """After warm-up, a step under COMPILE reduce-overhead launches CUDA graphs (cudaGraphLaunch in
    the runtime trace), and inductor skipped no graph."""
    from torch._dynamo.utils import counters
    from torch.profiler import ProfilerActivity, profile

    counters.clear()
    tr = _trainer(tmp_path, tiny_root, extra=OPTIONS["reduce-overhead"])
    batches = [b for _, b in zip(range(6), tr._batches())]
    for b in batches[:5]:
        tr.forward_backward(*b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        tr.forward_backward(*batches[5])
        torch.cuda.synchronize()
    launches = [e for e in prof.events() if "cudaGraphLaunch" in e.name]
    assert launches, "no CUDA graph was replayed"
    assert not counters["inductor"].get("cudagraph_skips"), dict(counters["inductor"])


def test_views_on_the_device_with_the_papers_transforms():
    """The paper's miniDomainNet views (flip, translation; flip, cutout, RandAugment2) on CUDA: per-sample
    draws, cutout squares present, normalised, the same shapes as the loader's."""
    from yacs.config import CfgNode as CN

    from dael_plugin.config.defaults import get_builtin_cfg
    from dael_plugin.transforms.device import DeviceViews

    cfg = get_builtin_cfg()
    cfg.INPUT.SIZE = (96, 96)
    strong = ["random_flip", "cutout", "randaugment2", "normalize"]
    views = DeviceViews(
        ["random_flip", "random_translation", "normalize"],
        strong,
        2,
        cfg.INPUT,
        CN({"STRONG_TRANSFORMS": strong}),
        device="cuda",
        size=(96, 96),
    )
    imgs = torch.randint(1, 255, (64, 3, 96, 96), dtype=torch.uint8, device="cuda")
    from dael_plugin.transforms import ops as O

    made = dict(O._GEOMETRY), [dict(op._tables) for op in views.strong if isinstance(op, O.RandAugmentBatch)]
    views(imgs)  # a warm-up call: cuRAND and kernel set-up; the constant tables were made when built
    assert (dict(O._GEOMETRY), [dict(op._tables) for op in views.strong if isinstance(op, O.RandAugmentBatch)]) == made
    torch.cuda.set_sync_debug_mode("error")
    try:
        weak, strong_view = views(imgs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert weak.shape == strong_view.shape == (64, 3, 96, 96) and weak.is_cuda
    zero = (
        strong_view * torch.tensor(cfg.INPUT.PIXEL_STD, device="cuda").view(1, 3, 1, 1)
        + torch.tensor(cfg.INPUT.PIXEL_MEAN, device="cuda").view(1, 3, 1, 1)
    ).abs() < 1e-6
    holes = zero.all(1).flatten(1).sum(1)
    assert (holes > 0).float().mean() > 0.9  # a 16x16 cutout hole in (almost) every image
    assert len({v.numpy().tobytes() for v in strong_view.cpu()}) == 64  # every image drawn apart


def test_cuda_settings_autotune_and_tf32(tmp_path, tiny_root):
    """Both engines turn on cudnn.benchmark and TF32 on CUDA; USE_TF32 False keeps full fp32."""
    _trainer(tmp_path / "a", tiny_root)
    assert torch.backends.cudnn.benchmark and torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "high"
    _trainer(tmp_path / "b", tiny_root, extra=["USE_TF32", "False"])
    assert not torch.backends.cudnn.allow_tf32 and torch.get_float32_matmul_precision() == "highest"
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True


@pytest.mark.parametrize("prec", ["fp32", "bf16"])
def test_step_memory_estimate_is_a_floor_of_what_the_gpu_allocates(prec):
    """engine/memory.py::check_step_memory on a real GPU: its estimate (what autograd keeps,
    measured on two images and scaled) is at most what the allocator really holds for a forward
    pass with gradients of that many images, and not far below it (it leaves out only the
    workspace); a step that cannot fit is one line at once, and the CUDA random state is left
    alone. The CPU tests mock these CUDA queries."""
    import time

    from dael_plugin.backbones import build_backbone
    from dael_plugin.engine.execution import autocast
    from dael_plugin.engine.memory import check_step_memory
    from dael_plugin.errors import DAELConfigError

    torch.manual_seed(0)
    feat = build_backbone("timm_resnet18").cuda().train()
    heads = torch.nn.Linear(feat.out_features, 345).cuda()
    dev = torch.device("cuda")
    n = 64
    state = torch.cuda.get_rng_state()
    need = check_step_memory(torch.nn.Sequential(feat, heads), dev, (96, 96), n, prec, "gpu test")
    assert torch.equal(torch.cuda.get_rng_state(), state)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    x = torch.randn(n, 3, 96, 96, device=dev)  # the estimate counts the input, which the first layer keeps
    torch.cuda.reset_peak_memory_stats()
    with autocast(prec, dev):
        out = heads(feat(x))
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base  # what the forward pass keeps for backward, and its output
    del out
    print(f"{prec}: estimate {need / 2**20:.1f} MiB, allocator {held / 2**20:.1f} MiB")
    assert need <= held, (need, held)
    assert need >= 0.5 * held, (need, held)
    t0 = time.monotonic()
    with pytest.raises(DAELConfigError, match="and this GPU has") as e:
        check_step_memory(torch.nn.Sequential(feat, heads), dev, (96, 96), 10**7, prec, "gpu test")
    assert "\n" not in str(e.value) and time.monotonic() - t0 < 30
