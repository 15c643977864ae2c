"""What several processes add to a DAEL step: the collectives and bytes of the gradient
all-reduce (DDP) and of per-domain synchronised batch norm, counted on a real step.

The counts do not depend on the image size or on the number of processes (batch norm's
statistics are per channel and chunk, the gradients are the model's size), so one step runs
here at 32x32 in a one-process gloo group on the CPU, with ``torch.distributed.all_reduce``
counted and DDP's own buckets read from DDP. Per recipe (the configs' per-domain and target
batch sizes and backbones), it prints:

- batch norm: collectives and bytes per step (forward: one per layer and backbone call, fp64
  sums; backward: one per layer, fp32), which sit on the critical path;
- gradients: bytes and DDP's buckets (overlapped with the backward pass by DDP);
- a step-time model for N GPUs: ``t_N = t_1 * share + n_bn * (alpha + ...) + grads not
  hidden``, with ``--step-ms`` the measured single-GPU step of the recipe (none is measured
  here: no GPU in this session), ``--alpha-us`` NCCL's latency per small all-reduce and
  ``--busbw`` its bus bandwidth (defaults: 8 GPUs on NVLink, 25 us and 300 GB/s), and the
  largest N that divides the per-domain batch (where scaling stops).

    python scripts/bench_ddp.py [--recipe minidomainnet domainnet] [--step-ms R=MS ...]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist

from dael_plugin.backbones import build_backbone
from dael_plugin.core import DAEL, DAELHparams, build_heads
from dael_plugin.core.chunk_norm import set_sync
from dael_plugin.engine import distributed

# name: (backbone, source domains, images per domain, target batch, classes)
RECIPES = {
    "minidomainnet": ("resnet18", 3, 64, 64, 126),
    "domainnet": ("resnet101", 5, 6, 6, 345),
    "digit5": ("dael_small_cnn", 4, 64, 64, 10),
}


class Counter:
    def __init__(self) -> None:
        self.calls, self.bytes = 0, 0
        self.real = dist.all_reduce

    def __call__(self, tensor, *args, **kwargs):
        self.calls += 1
        self.bytes += tensor.numel() * tensor.element_size()
        return self.real(tensor, *args, **kwargs)


def count(recipe: str) -> dict:
    name, k, per_domain, b_u, classes = RECIPES[recipe]
    torch.manual_seed(0)
    backbone = build_backbone(name)
    heads = build_heads(backbone.out_features, classes, k, DAELHparams())
    algo = DAEL(backbone, heads, DAELHparams(), fuse_chunks=True, chunk_bn="split")
    model = torch.nn.ModuleList([backbone, heads])
    set_sync(model, dist.group.WORLD, 1)
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(distributed.LossModule(model, algo.losses))
    x = [torch.randn(k * per_domain, 3, 32, 32) for _ in range(2)]
    labels = torch.randint(classes, (k * per_domain,))
    expert = torch.arange(k).repeat_interleave(per_domain)
    u = [torch.randn(b_u, 3, 32, 32) for _ in range(2)]
    counter = Counter()
    dist.all_reduce = counter
    try:
        out = ddp(x, labels, expert, [per_domain] * k, u)
        forward = (counter.calls, counter.bytes)
        out["loss"].backward()
        backward = (counter.calls - forward[0], counter.bytes - forward[1])
    finally:
        dist.all_reduce = counter.real
    grads = sum(p.numel() * 4 for p in model.parameters())
    # DDP's bucket cap (25 MiB by default): one all-reduce per full bucket (a one-process group
    # keeps a single bucket, so the count is the cap's, not read back).
    cap = (
        int(ddp._get_ddp_logging_data().get("bucket_cap_bytes", 25 * 2**20))
        if hasattr(ddp, "_get_ddp_logging_data")
        else 25 * 2**20
    )
    buckets = -(-grads // cap)
    n_bn = sum(1 for m in backbone.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))
    return {
        "recipe": recipe,
        "backbone": name,
        "per_domain": per_domain,
        "bn_layers": n_bn,
        "fwd": forward,
        "bwd": backward,
        "grad_bytes": grads,
        "buckets": buckets,
        "params": grads // 4,
    }


def time_overhead(recipe: str, size: int, device: torch.device, steps: int) -> tuple:
    """Median step (ms) of plain training and of the same step under DDP with synchronised
    batch norm in a one-process group: what several processes cost before any other process."""
    import time

    from dael_plugin.config.execution import Execution
    from dael_plugin.engine.step import DAELStep
    from dael_plugin.engine.strategy import Strategy

    name, k, per_domain, b_u, classes = RECIPES[recipe]
    out = []
    for ddp in (False, True):
        torch.manual_seed(0)
        backbone = build_backbone(name).to(device)
        heads = build_heads(backbone.out_features, classes, k, DAELHparams()).to(device)
        algo = DAEL(backbone, heads, DAELHparams(), fuse_chunks=True, chunk_bn="auto")
        model = torch.nn.ModuleList([backbone, heads])
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        step = DAELStep(algo, [opt], Strategy(Execution(), device), k, per_domain, True)
        if ddp:
            from torch.nn.parallel import DistributedDataParallel as DDP

            set_sync(model, dist.group.WORLD, 1)
            ids = [device.index or 0] if device.type == "cuda" else None
            step._losses = DDP(distributed.LossModule(model, step._losses), device_ids=ids)
        g = torch.Generator().manual_seed(1)
        n = k * per_domain
        bx = {
            "img": torch.randn(n, 3, size, size, generator=g),
            "img2": torch.randn(n, 3, size, size, generator=g),
            "label": torch.randint(classes, (n,), generator=g),
            "domain": torch.arange(k).repeat_interleave(per_domain),
        }
        bu = {"img": torch.randn(b_u, 3, size, size, generator=g), "img2": torch.randn(b_u, 3, size, size, generator=g)}
        times = []
        for i in range(steps + 3):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(bx, bu)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - t0)
        out.append(sorted(times)[len(times) // 2] * 1e3)
    return tuple(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", nargs="+", default=["minidomainnet", "domainnet"], choices=sorted(RECIPES))
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--alpha-us", type=float, default=25.0, help="latency of one small all-reduce (NCCL, NVLink)")
    p.add_argument("--busbw", type=float, default=300.0, help="all-reduce bus bandwidth, GB/s")
    p.add_argument(
        "--step-ms",
        nargs="*",
        default=[],
        metavar="RECIPE=MS",
        help="a measured single-GPU step of a recipe, for the time model",
    )
    p.add_argument("--time", action="store_true", help="also time DDP's overhead at N=1 against plain training")
    p.add_argument(
        "--size", type=int, default=0, help="image size for --time (default: 32 on CPU, the recipe's on CUDA)"
    )
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    steps = {r: float(v) for r, v in (s.split("=", 1) for s in args.step_ms)}
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'rendezvous')}", rank=0, world_size=1)
        try:
            rows = [count(r) for r in args.recipe]
            if args.time:
                dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
                sizes = {"minidomainnet": 96, "domainnet": 224, "digit5": 32}
                for r in args.recipe:
                    size = args.size or (sizes[r] if dev.type == "cuda" else 32)
                    plain, ddp = time_overhead(r, size, dev, args.steps)
                    print(
                        f"  {r} at {size}x{size} on {dev}: plain {plain:.1f} ms, DDP + synchronised batch norm in a "
                        f"one-process group {ddp:.1f} ms ({ddp / plain:.2f}x), median of {args.steps} steps"
                    )
        finally:
            dist.destroy_process_group()
    print("Per step, whatever N (counted on one step; collectives on the critical path first):")
    for r in rows:
        (cf, bf), (cb, bb) = r["fwd"], r["bwd"]
        print(
            f"  {r['recipe']:>14} {r['backbone']:>14} ({r['params'] / 1e6:.1f}M params, {r['bn_layers']} BN layers): "
            f"batch norm {cf} + {cb} all-reduces, {(bf + bb) / 1e6:.2f} MB; gradients {r['grad_bytes'] / 1e6:.1f} MB "
            f"in about {r['buckets']} DDP bucket(s), overlapped with the backward pass"
        )
    n, alpha, bw = args.gpus, args.alpha_us * 1e-6, args.busbw * 1e9
    print(
        f"\nTime model on {n} GPUs (alpha {args.alpha_us:.0f} us per all-reduce, bus bandwidth {args.busbw:.0f} GB/s):"
    )
    for r in rows:
        (cf, bf), (cb, bb) = r["fwd"], r["bwd"]
        bn_s = (cf + cb) * alpha + (bf + bb) / bw
        grad_s = r["grad_bytes"] / bw  # ring: each GPU moves 2(N-1)/N of it; busbw already counts that
        usable = max(d for d in range(1, n + 1) if r["per_domain"] % d == 0)
        line = (
            f"  {r['recipe']:>14}: batch-norm sync {bn_s * 1e3:.2f} ms a step (not hidden), gradients "
            f"{grad_s * 1e3:.2f} ms (hidden behind the backward pass when it is longer); "
            f"{r['per_domain']} images per domain split over at most {usable} of {n} GPUs"
        )
        if r["recipe"] in steps:
            t1 = steps[r["recipe"]] / 1e3
            tn = t1 / usable + bn_s
            line += f"; step {t1 * 1e3:.1f} ms on 1 GPU -> about {tn * 1e3:.1f} ms on {usable} ({t1 / tn:.1f}x)"
        print(line)


if __name__ == "__main__":
    main()
