"""The training step timed against Dassl's DAEL (blocks of steps between CUDA events, medians over
alternating blocks, peak memory, the first step's agreement), and the views made on the device."""

from __future__ import annotations

import copy
import statistics
import time

import torch

from dael_plugin.bench.common import (
    PAPER_STRONG,
    PAPER_WEAK,
    SHAPES,
    Dassl,
    K,
    Plugin,
    _models,
    configs,
    has_dassl,
    make_batch,
)


# -- the step --------------------------------------------------------------
def _block_timer(device):
    """``time(fn, n) -> ms per call``: n calls between two CUDA events, one synchronisation."""

    def timed(fn, n):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / n
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e3

    return timed


def _first_step_agreement(runners, bx, bu):
    torch.manual_seed(123)
    ref = runners[0](bx, bu)
    exact = [r for r in runners[1:] if r.step.prec == "fp32"][-1]
    torch.manual_seed(123)
    ours = exact(bx, bu)
    diff = max(abs(float(ref[k]) - float(ours[k])) for k in ("loss_x", "loss_cr", "loss_u"))
    print(
        f"first step, losses x/cr/u: dassl {float(ref['loss_x']):.5f}/{float(ref['loss_cr']):.5f}/"
        f"{float(ref['loss_u']):.5f}, plugin ({exact.name.strip('+ ')}) {float(ours['loss_x']):.5f}/"
        f"{float(ours['loss_cr']):.5f}/{float(ours['loss_u']):.5f}; max abs diff {diff:.1e} "
        "(Dassl takes log(p + 1e-5))"
    )


def bench_step(shape, args, device):
    dassl = has_dassl()
    _, _, size, classes, per = SHAPES[shape]
    per_domain = args.per_domain or (per[1] if device.type == "cuda" else per[0])
    backbone, experts, bb_name = _models(shape, device, dassl)
    bx, bu = make_batch(per_domain, per_domain, size, classes)
    if device.type == "cuda":
        bx = {k: (v.to(device) if k != "domain" else v) for k, v in bx.items()}  # domain: the loader's CPU tensor
        bu = {k: v.to(device) for k, v in bu.items()}
    runners = [Dassl(copy.deepcopy(backbone), copy.deepcopy(experts), device, classes, per_domain)] if dassl else []
    for label, opts in configs(device.type == "cuda", args.bf16, args.compile):
        runners.append(Plugin(label, copy.deepcopy(backbone), experts, device, classes, per_domain, size, **opts))
    print(f"\n== step, {shape}: {bb_name}, {size}x{size}, {K} domains x {per_domain} + {per_domain} target ==")
    if dassl:
        _first_step_agreement(runners, bx, bu)
    timed = _block_timer(device)
    peak = {}
    for r in runners:
        for _ in range(args.warmup):
            r(bx, bu)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            r(bx, bu)
            torch.cuda.synchronize()
            peak[r.name] = torch.cuda.max_memory_allocated() / 2**20
    times = {r.name: [] for r in runners}
    for i in range(args.repeats):
        for r in runners[i % len(runners) :] + runners[: i % len(runners)]:  # rotate who goes first
            times[r.name].append(timed(lambda: r(bx, bu), args.steps))
    med = {n: statistics.median(v) for n, v in times.items()}
    _print_step_table(runners, med, peak, dassl)
    plugin = runners[1:] if dassl else runners
    best_fp32 = min((r for r in plugin if r.step.prec == "fp32"), key=lambda r: med[r.name])
    best = min(plugin, key=lambda r: med[r.name])
    return {
        "dassl": med[runners[0].name] if dassl else None,
        "best": med[best.name],
        "best_name": best.name,
        "best_fp32": med[best_fp32.name],
        "best_fp32_name": best_fp32.name,
        "peak": peak,
    }


def _print_step_table(runners, med, peak, dassl):
    base = med[runners[0].name] if dassl else None
    print(
        f"{'configuration':<30} {'ms/step':>9}"
        + (f" {'vs dassl':>9}" if dassl else "")
        + (f" {'peak MiB':>9}" if peak else "")
    )
    for r in runners:
        line = f"{r.name:<30} {med[r.name]:>9.1f}" + (f" {base / med[r.name]:>8.2f}x" if dassl else "")
        if peak:
            line += f" {peak[r.name]:>9.0f}"
        note = getattr(r, "note", "")
        print(line + (f"  ({note})" if note else ""))
    plugin = runners[1:] if dassl else runners
    saved = med[plugin[0].name] - min(med[r.name] for r in plugin)
    for prev, cur in zip(plugin, plugin[1:]):
        delta = med[prev.name] - med[cur.name]
        share = 100 * delta / saved if saved > 0 else 0.0
        print(f"share {cur.name.strip('+ '):<18} {delta:>+8.1f} ms  ({share:.0f}% of the plugin's saving)")


# -- launches --------------------------------------------------------------
def _paper_views(size, device):
    from yacs.config import CfgNode as CN

    from dael_plugin.config.defaults import get_builtin_cfg
    from dael_plugin.transforms.device import DeviceViews

    cfg = get_builtin_cfg()
    cfg.INPUT.SIZE = (size, size)
    return DeviceViews(
        PAPER_WEAK,
        PAPER_STRONG,
        2,
        cfg.INPUT,
        CN({"STRONG_TRANSFORMS": PAPER_STRONG}),
        device=device,
        size=(size, size),
    )


# -- views made on the device -----------------------------------------------
def bench_aug(shape, args, device):
    """Views made in a loader (PIL, per image, one process) against on the device (batched)."""
    from PIL import Image
    from yacs.config import CfgNode as CN

    from dael_plugin.config.defaults import get_builtin_cfg
    from dael_plugin.transforms.host import build_views

    _, _, size, _, per = SHAPES[shape]
    n = (K + 1) * (args.per_domain or (per[1] if device.type == "cuda" else per[0]))
    cfg = get_builtin_cfg()
    cfg.INPUT.SIZE = (size, size)
    cfg.INPUT.TRANSFORMS = PAPER_WEAK
    node = CN({"STRONG_TRANSFORMS": PAPER_STRONG})
    cpu_views = build_views(cfg, PAPER_STRONG, 2, node)
    imgs = [Image.fromarray(torch.randint(0, 255, (size, size, 3), dtype=torch.uint8).numpy()) for _ in range(n)]
    t0 = time.perf_counter()
    for im in imgs:
        for v in cpu_views:
            v(im)
    pil = (time.perf_counter() - t0) * 1e3
    dev = _paper_views(size, device)
    u8 = torch.randint(0, 255, (n, 3, size, size), dtype=torch.uint8, device=device)
    for _ in range(2):
        dev(u8)
    on_dev = _block_timer(device)(lambda: dev(u8), 5)
    print(
        f"share aug on device: weak+strong views of {n} images at {size}x{size} (the paper's miniDomainNet "
        f"transforms): {pil:.1f} ms in one loader process (PIL) vs {on_dev:.1f} ms on {device.type} "
        "(batched, per-sample draws)"
    )
