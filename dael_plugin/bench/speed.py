"""Time and count DAEL training: this plugin against Dassl's own DAEL, side by side, in one run.

Step: one training step (forward, backward, optimiser) on the same synthetic
batch from the same initial weights, for Dassl's DAEL and for the plugin with
its execution options switched on one after another (one call per chunk ->
fused pass -> fused optimiser -> channels_last -> bf16 -> torch.compile).
Each configuration runs blocks of ``--steps`` steps timed between two CUDA
events with one synchronisation per block, so the host runs ahead of the GPU
as it does in training; blocks of all configurations alternate after
warm-up, and each figure is a median over ``--repeats`` blocks. Peak GPU
memory is measured per configuration.

Launches (on unless ``--no-launches``): operator launches per training step
at miniDomainNet's shape (ResNet-18, 3 x 64 + 64; the spatial size
``--launch-size`` does not change the count), counted on the CPU as a GPU
would launch them (:mod:`dael_plugin.engine.profiling`): Dassl's DAEL with its SGD
as it runs on CUDA (``foreach``), and each plugin configuration with
``CHUNK_BN auto`` as it resolves on CUDA. Copies and the bytes they write,
host reads, and the views made on the device per batch. The count is exact,
so ``launches_per_step_vs_dassl`` is held by a test.

Epoch (``--epoch``): one epoch of a dataset through Dassl's own DAEL trainer
and the plugin's trainers on both engines (loader, step and loop
bookkeeping), in images/s, with the share of the epoch spent waiting for
data. ``--epoch-data synthetic`` (random images at the shape, the default on
a GPU) or ``embedded`` (the embedded set with the shipped configs; the strong
view is Dassl's ``randaugment2`` for every trainer, as Dassl's own DAEL cannot
build ``tv_randaugment``).

Shapes: ``digit5`` (Dassl's ``cnn_digit5_m3sda``, 32x32, 3x32 source + 32
target on CPU, 3x64 + 64 on GPU) and ``minidomainnet`` (ResNet-18, 96x96,
3x64 + 64). The last line is ``speedup_vs_dassl_dael: X.XX``, the step ratio
(Dassl's time / the plugin's fastest configuration) at miniDomainNet's shape
on a GPU and at digit5's on CPU (fp32 there: the CPU figure is stated for
fp32 numerics).

Without Dassl the plugin's configurations are timed and counted alone (the
same backbones, built by the plugin: ``cnn_digit5_m3sda`` is rebuilt key for
key) and the ratios are not printed: they need Dassl's DAEL as the reference.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from dael_plugin.bench.common import has_dassl
from dael_plugin.bench.epoch import bench_epoch
from dael_plugin.bench.launches import bench_launches
from dael_plugin.bench.step import bench_aug, bench_step


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--shape",
        default="auto",
        choices=("auto", "digit5", "minidomainnet", "both"),
        help="auto: both on a GPU, digit5 on CPU",
    )
    p.add_argument("--per-domain", type=int, default=0, help="override the per-domain batch")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per configuration")
    p.add_argument("--steps", type=int, default=5, help="steps per timed block (one synchronisation per block)")
    p.add_argument("--repeats", type=int, default=7, help="timed blocks per configuration (median)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--bf16", action="store_true", help="on CPU, also time bf16 autocast (always on a GPU)")
    p.add_argument("--compile", action="store_true", help="on CPU, also time torch.compile (always on a GPU)")
    p.add_argument("--no-launches", action="store_true", help="skip counting launches per step")
    p.add_argument(
        "--launch-size", type=int, default=32, help="spatial size for counting (the count does not depend on it)"
    )
    p.add_argument(
        "--launch-backbone",
        default="",
        metavar="NAME",
        help="count the launches with this MODEL.BACKBONE.NAME instead of ResNet-18 (e.g. timm_vit_small_patch16_224: "
        "a backbone without batch norm, whose fused pass is one plain call), built for --launch-size",
    )
    p.add_argument(
        "--launch-per-domain",
        type=int,
        default=64,
        help="per-domain batch for counting (miniDomainNet's 64). The plugin's counts do not depend on it; "
        "Dassl's DAEL's do (1831 launches and 74 host reads at 64, 1775 and 18 at 8), and so do the MiB copied",
    )
    p.add_argument("--epoch", action="store_true", help="also time epochs against Dassl's trainer")
    p.add_argument(
        "--epoch-only", action="store_true", help="only the epochs (at the headline shape): no step, views or launches"
    )
    p.add_argument(
        "--epoch-data",
        default="auto",
        choices=("auto", "synthetic", "embedded"),
        help="auto: synthetic on a GPU, the embedded set on CPU",
    )
    p.add_argument(
        "--epoch-match",
        default="",
        help="time only the epoch configurations whose label holds this text (and Dassl's DAEL, the reference)",
    )
    p.add_argument("--epoch-images", type=int, default=0, help="training images per domain (synthetic data)")
    p.add_argument("--timed-epochs", type=int, default=2, help="timed epochs per configuration, after a warm-up one")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--ddp",
        action="store_true",
        help="only report what several processes add to a step: the "
        "collectives and bytes of DDP and synchronised batch norm (scripts/bench_ddp.py, dael_plugin/bench/ddp.py)",
    )
    args = p.parse_args()
    if args.ddp:  # the counts of scripts/bench_ddp.py, with its defaults
        from dael_plugin.bench import ddp as bench_ddp

        sys.argv = [sys.argv[0]]
        return bench_ddp.main()

    for flag in ("timed_epochs", "launch_per_domain"):
        if getattr(args, flag) < 1:
            print(f"error: --{flag.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA GPU is visible", file=sys.stderr)
        return 2
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    shapes = {"auto": ["digit5", "minidomainnet"] if cuda else ["digit5"], "both": ["digit5", "minidomainnet"]}
    shapes = shapes.get(args.shape, [args.shape])
    if args.epoch_data == "auto":
        args.epoch_data = "synthetic" if cuda else "embedded"
    if not args.epoch_images:
        args.epoch_images = 2048 if cuda else 192
    dassl = has_dassl()
    name = torch.cuda.get_device_name() if cuda else f"CPU ({torch.get_num_threads()} threads)"
    print(
        f"device: {name}; torch {torch.__version__}"
        + (
            ""
            if dassl
            else "; Dassl is not installed: the plugin alone, no ratio (they need Dassl's DAEL as the reference)"
        )
    )
    results = {}
    head = "minidomainnet" if (cuda and "minidomainnet" in shapes) else shapes[0]
    if args.epoch_only:
        _, failed = bench_epoch(head, args, device)
        return 1 if failed else 0
    for shape in shapes:
        results[shape] = bench_step(shape, args, device)
        bench_aug(shape, args, device)
    if not args.no_launches:
        bench_launches(args)
    failed = []
    if args.epoch:  # at the headline shape (96x96 on a GPU)
        _, failed = bench_epoch(head, args, device)
    r = results[head]
    key, label = ("best", r["best_name"]) if cuda else ("best_fp32", r["best_fp32_name"])
    print(
        f"\nheadline: {head}, plugin '{label.strip('+ ')}' configuration, "
        f"{'fastest' if cuda else 'fastest fp32'}: {r[key]:.1f} ms"
        + (f" vs Dassl {r['dassl']:.1f} ms" if dassl else "")
    )
    print(
        f"speedup_vs_dassl_dael: {r['dassl'] / r[key]:.2f}"
        if dassl
        else "speedup_vs_dassl_dael: needs Dassl's DAEL as the reference (install Dassl; see README)"
    )
    return 1 if failed else 0
