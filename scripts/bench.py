#!/usr/bin/env python
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

import argparse
import contextlib
import copy
import io
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {
    # name: Dassl's backbone, the plugin's stand-in without Dassl, image size, classes, per-domain batch (cpu, gpu)
    "digit5": ("cnn_digit5_m3sda", "cnn_digit5_m3sda", 32, 10, (32, 64)),  # the built-in engine builds it too
    "minidomainnet": ("resnet18", "resnet18", 96, 126, (64, 64)),
}
K = 3  # source domains
PAPER_WEAK = ["random_flip", "random_translation", "normalize"]  # miniDomainNet, Appendix A
PAPER_STRONG = ["random_flip", "cutout", "randaugment2", "normalize"]


def has_dassl() -> bool:
    import dael_plugin

    return dael_plugin.HAS_DASSL


def _sgd(params, fused=False, foreach=None):
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4, foreach=foreach)
    if fused:
        from dael_plugin.engine.execution import fused_optimizer

        opt = fused_optimizer(opt)
    return opt


class Dassl:
    """Dassl's DAEL trainer, built bare around the given modules."""

    name = "dassl DAEL"

    def __init__(self, backbone, experts, device, c, per_domain, foreach=None):
        from dassl.engine.da.dael import DAEL as Reference
        from dassl.engine.trainer import TrainerBase

        self.t = t = Reference.__new__(Reference)
        TrainerBase.__init__(t)
        t.device = device
        t.batch_idx, t.num_batches = 0, 10**9
        t.num_source_domains, t.num_classes = K, c
        t.n_domain, t.split_batch = K, per_domain
        t.weight_u, t.conf_thre = 0.5, 0.0
        t.F, t.E = backbone, experts
        t.register_model("F", t.F, _sgd(t.F.parameters(), foreach=foreach), None)
        t.register_model("E", t.E, _sgd(t.E.parameters(), foreach=foreach), None)
        t.set_model_mode("train")

    def __call__(self, bx, bu):
        return self.t.forward_backward(bx, bu)


class Plugin:
    """The plugin's shared step with a given set of execution options."""

    def __init__(
        self,
        name,
        backbone,
        heads_init,
        device,
        c,
        per_domain,
        size,
        fuse,
        fused_optim,
        channels_last,
        prec,
        compile_mode,
        chunk_bn="auto",
        foreach=None,
        views=None,
    ):
        from dael_plugin.core import DAEL, DAELHparams, ExpertHeads
        from dael_plugin.engine.execution import channels_last_reason
        from dael_plugin.engine.step import DAELStep

        self.name = name
        self.F = backbone
        self.E = ExpertHeads(backbone.out_features, c, K).to(device)
        if heads_init is not None:
            self.E.load_from_linears(heads_init.linears)
        self.note = ""
        if channels_last:
            reason = channels_last_reason(self.F, (3, size, size), device)
            if reason is not None:
                channels_last, self.note = False, "channels_last n/a: " + reason[:60]
            elif getattr(self.F, "_dael_channels_last_boundary", None):
                self.note = f"channels_last up to {self.F._dael_channels_last_boundary}: the backbone .views after it"
        alg = DAEL(self.F, self.E, DAELHparams(conf_thre=0.0), fuse_chunks=fuse, chunk_bn=chunk_bn)
        opts = [_sgd(self.F.parameters(), fused_optim, foreach), _sgd(self.E.parameters(), fused_optim, foreach)]
        self.step = DAELStep(
            alg,
            opts,
            device,
            K,
            per_domain,
            True,
            prec=prec,
            channels_last=channels_last,
            compile_mode=compile_mode,
            device_views=views,
        )
        self.F.train(), self.E.train()

    def __call__(self, bx, bu):
        return self.step(bx, bu)


def make_batch(per_domain, target, size, classes, seed=1, uint8=False):
    g = torch.Generator().manual_seed(seed)
    n = K * per_domain
    shape = (3, size, size)

    def img(m):
        return (
            torch.randint(0, 256, (m,) + shape, generator=g, dtype=torch.uint8)
            if uint8
            else torch.randn((m,) + shape, generator=g)
        )

    bx = {
        "img": img(n),
        "label": torch.randint(0, classes, (n,), generator=g),
        "domain": torch.arange(K).repeat_interleave(per_domain),
    }
    bu = {"img": img(target)}
    if not uint8:
        bx["img2"], bu["img2"] = img(n), img(target)
    return bx, bu


def configs(cuda: bool, bf16: bool = False, compile_: bool = False):
    """(label, options) cumulative, as the per-option shares need."""
    steps = [
        ("per-chunk calls (as Dassl)", {}),
        ("+ fused pass", {"fuse": True}),
        ("+ fused optimiser", {"fused_optim": True}),
        ("+ channels_last", {"channels_last": True}),
    ]
    if cuda or bf16:
        steps.append(("+ bf16 autocast", {"prec": "bf16"}))
    if cuda or compile_:
        steps.append(("+ torch.compile", {"compile_mode": "reduce-overhead" if cuda else "default"}))
    out, cur = [], {"fuse": False, "fused_optim": False, "channels_last": False, "prec": "fp32", "compile_mode": "none"}
    for label, change in steps:
        cur = {**cur, **change}
        out.append((label, dict(cur)))
    return out


def _models(shape, device, dassl: bool):
    bb_name, own_name, size, classes, _ = SHAPES[shape]
    torch.manual_seed(0)
    if dassl:
        from dassl.engine.da.dael import Experts
        from dassl.modeling import build_backbone

        backbone = build_backbone(bb_name, verbose=False, pretrained=False).to(device)
        return backbone, Experts(K, backbone.out_features, classes).to(device), bb_name
    from dael_plugin.backbones import build_backbone

    return build_backbone(own_name).to(device), None, own_name


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

    from dael_plugin.builtin.defaults import get_builtin_cfg
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


def launch_counts(size: int = 32, per_domain: int = 64, dassl=None):
    """``{label: LaunchCount}`` of one training step at miniDomainNet's shape, on CPU, each
    configuration as it runs on a GPU (module docstring); Dassl's DAEL first when installed."""
    from dael_plugin.core.chunk_norm import resolve_impl
    from dael_plugin.engine.profiling import count_launches

    dassl = has_dassl() if dassl is None else dassl
    device = torch.device("cpu")
    backbone, experts, _ = _models("minidomainnet", device, dassl)
    classes = SHAPES["minidomainnet"][3]
    bx, bu = make_batch(per_domain, per_domain, size, classes)
    on_gpu = resolve_impl("auto", "cuda")
    runs = []
    if dassl:
        runs.append(
            (
                "dassl DAEL",
                Dassl(copy.deepcopy(backbone), copy.deepcopy(experts), device, classes, per_domain, foreach=True),
                (bx, bu),
            )
        )
    for label, opts in configs(False):
        opts = dict(opts, chunk_bn=on_gpu if opts["fuse"] else "auto")
        runs.append(
            (
                label,
                Plugin(
                    label, copy.deepcopy(backbone), experts, device, classes, per_domain, size, foreach=True, **opts
                ),
                (bx, bu),
            )
        )
    default = dict(configs(False)[-1][1])
    runs.append(
        (
            "default, CHUNK_BN split (CPU's auto)",
            Plugin(
                "split",
                copy.deepcopy(backbone),
                experts,
                device,
                classes,
                per_domain,
                size,
                foreach=True,
                **dict(default, chunk_bn="split"),
            ),
            (bx, bu),
        )
    )
    runs.append(
        (
            "default + bf16 autocast",
            Plugin(
                "bf16",
                copy.deepcopy(backbone),
                experts,
                device,
                classes,
                per_domain,
                size,
                foreach=True,
                **dict(default, chunk_bn=on_gpu, prec="bf16"),
            ),
            (bx, bu),
        )
    )
    ux, uu = make_batch(per_domain, per_domain, size, classes, uint8=True)
    runs.append(
        (
            "default + views on the device",
            Plugin(
                "views",
                copy.deepcopy(backbone),
                experts,
                device,
                classes,
                per_domain,
                size,
                foreach=True,
                views=_paper_views(size, device),
                **dict(default, chunk_bn=on_gpu),
            ),
            (ux, uu),
        )
    )
    counts = {}
    for label, runner, (x, u) in runs:
        runner(x, u)  # warm-up: lazy initialisation, optimiser state
        counts[label] = count_launches(lambda: runner(x, u))
    views = _paper_views(size, device)
    both = torch.cat([ux["img"], uu["img"]])
    views(both)
    counts["views only, per batch"] = count_launches(lambda: views(both))
    return counts


DEFAULT_LAUNCH_LABEL = "+ channels_last"  # the defaults: fused pass, fused optimiser, channels_last, fp32


def bench_launches(args):
    n = args.launch_per_domain
    counts = launch_counts(args.launch_size, n)
    base = counts.get("dassl DAEL")
    print(
        f"\n== launches per step, miniDomainNet's shape (ResNet-18, {K} x {n} + {n}, {args.launch_size}x"
        f"{args.launch_size}), counted on CPU as on a GPU (CHUNK_BN auto -> grouped) =="
    )
    print(
        f"{'configuration':<40} {'launches':>9}"
        + (f" {'vs dassl':>9}" if base else "")
        + f" {'copies':>7} {'copied MiB':>11} {'host reads':>11}"
    )
    for label, c in counts.items():
        ratio = f" {c.total / base.total:>8.2f}x" if base else ""
        print(f"{label:<40} {c.total:>9d}{ratio} {c.copies:>7d} {c.copy_bytes / 2**20:>11.1f} {c.host_reads:>11d}")
    if base:
        print(f"launches_per_step_vs_dassl: {counts[DEFAULT_LAUNCH_LABEL].total / base.total:.2f}")
    else:
        print("launches_per_step_vs_dassl: needs Dassl's DAEL as the reference (install Dassl; see README)")
    return counts


# -- views made on the device -----------------------------------------------
def bench_aug(shape, args, device):
    """Views made in a loader (PIL, per image, one process) against on the device (batched)."""
    from PIL import Image
    from yacs.config import CfgNode as CN

    from dael_plugin.builtin.defaults import get_builtin_cfg
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


# -- the epoch ---------------------------------------------------------------
class TimedLoader:
    """A loader whose iterators add the time spent waiting for each batch to ``wait``."""

    def __init__(self, loader, clock):
        self.loader, self.clock = loader, clock

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def __iter__(self):
        it = iter(self.loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.clock["wait"] += time.perf_counter() - t0
            yield batch


def _synthetic_root(shape, images):
    import numpy as np
    from PIL import Image

    _, _, size, classes, _ = SHAPES[shape]
    root = tempfile.mkdtemp(prefix="dael_bench_")
    rng = np.random.default_rng(0)
    for d in ("d0", "d1", "d2", "t"):
        for split in ("train", "val", "test"):
            per_class = max(1, images // classes) if split == "train" else 1
            for c in range(classes):
                folder = os.path.join(root, d, split, f"c{c:03d}")
                os.makedirs(folder, exist_ok=True)
                for i in range(per_class):
                    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(
                        os.path.join(folder, f"{i}.png")
                    )
    return root


def _epoch_cfg(engine, shape, args, device, data_root, on_device=False, fastest=False):
    """The run's config on either engine, as scripts/train.py would merge it."""
    from dael_plugin import add_dael_config

    if engine == "builtin":
        from dael_plugin.builtin.defaults import get_builtin_cfg

        cfg = get_builtin_cfg()
    else:
        from dassl.config import get_cfg_default

        cfg = add_dael_config(get_cfg_default())
    bb, own, size, _, per = SHAPES[shape]
    per_domain = args.per_domain or (per[1] if device.type == "cuda" else per[0])
    common = [
        "DATALOADER.NUM_WORKERS",
        args.workers,
        "TRAIN.PRINT_FREQ",
        10**6,
        "USE_CUDA",
        device.type == "cuda",
        "VERBOSE",
        False,
        "OUTPUT_DIR",
        tempfile.mkdtemp(prefix="dael_bench_out_"),
        "TEST.NO_TEST",
        True,
        "TRAINER.NAME",
        "DAEL",
        "TRAINER.DAEL.AUG_ON_DEVICE",
        on_device,
        "SEED",
        1,
        "TRAINER.DAEL.STRONG_TRANSFORMS",
        ["randaugment2", "normalize"],
        "OPTIM.MAX_EPOCH",
        2,
    ]
    if args.epoch_data == "embedded":
        cfg.merge_from_file(os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml"))
        cfg.merge_from_file(os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml"))
        cfg.merge_from_list(
            [
                "DATASET.ROOT",
                data_root,
                "DATASET.SOURCE_DOMAINS",
                ["hand", "street", "font"],
                "DATASET.TARGET_DOMAINS",
                ["blend"],
            ]
            + common
        )
    else:
        cfg.merge_from_list(
            [
                "DATASET.NAME",
                "DomainFolders",
                "DATASET.ROOT",
                data_root,
                "DATASET.SOURCE_DOMAINS",
                ["d0", "d1", "d2"],
                "DATASET.TARGET_DOMAINS",
                ["t"],
                "MODEL.BACKBONE.NAME",
                bb if engine == "dassl" else own,
                "MODEL.BACKBONE.PRETRAINED",  # no model hub here (Dassl's resnet18 downloads); time needs no weights
                False,
                "INPUT.SIZE",
                (size, size),
                "INPUT.TRANSFORMS",
                ["random_flip", "normalize"],
                "DATALOADER.TRAIN_X.SAMPLER",
                "RandomDomainSampler",
                "DATALOADER.TRAIN_X.BATCH_SIZE",
                K * per_domain,
                "DATALOADER.TRAIN_U.SAME_AS_X",
                False,
                "DATALOADER.TRAIN_U.BATCH_SIZE",
                per_domain,
                "OPTIM.NAME",
                "sgd",
                "OPTIM.LR",
                0.01,
            ]
            + common
        )
    if fastest:  # the GPU's fastest configuration of the step bench
        cfg.merge_from_list(["TRAINER.DAEL.PREC", "bf16", "TRAINER.DAEL.COMPILE", "reduce-overhead"])
    return cfg


def _run_epochs(build, device, epochs=2):
    """A warm-up epoch, then ``epochs`` timed ones; returns (s per epoch, wait share, batches, batch images)."""
    clock = {"wait": 0.0}
    with contextlib.redirect_stdout(io.StringIO()):
        t = build()
        t.train_loader_x = TimedLoader(t.train_loader_x, clock)
        if getattr(t, "train_loader_u", None) is not None:
            t.train_loader_u = TimedLoader(t.train_loader_u, clock)
        epoch_fn = _epoch_runner(t)
        w0 = time.perf_counter()
        epoch_fn(0)  # a warm-up epoch: workers, caches, kernel choices, compilation
        if device.type == "cuda":
            torch.cuda.synchronize()
        warm = time.perf_counter() - w0
        clock["wait"] = 0.0
        t0 = time.perf_counter()
        for e in range(1, 1 + epochs):
            epoch_fn(e)
        if device.type == "cuda":
            torch.cuda.synchronize()
        secs = (time.perf_counter() - t0) / epochs
    batches = len(t.train_loader_x)
    per_batch = (
        t.train_loader_x.batch_sampler.batch_size if hasattr(t.train_loader_x.batch_sampler, "batch_size") else None
    )
    return secs, clock["wait"] / epochs / secs, batches, per_batch, t, warm


def _epoch_runner(t):
    if hasattr(t, "run_epoch") and hasattr(t, "modules"):  # the built-in engine
        from torch.utils.tensorboard import SummaryWriter

        t.writer = SummaryWriter(os.path.join(t.cfg.OUTPUT_DIR, "tensorboard"))

        def run(e):
            t.epoch = e
            t.run_epoch()

        return run
    t.max_epoch, t.start_epoch = 10**6, 0
    t.before_train = lambda: None
    t.set_model_mode("train")

    def run(e):
        t.epoch = e
        t.run_epoch()

    return run


def bench_epoch(shape, args, device):
    """Epochs through Dassl's own DAEL trainer and the plugin's trainers on both engines."""
    dassl = has_dassl()
    data_root = (
        tempfile.mkdtemp(prefix="dael_bench_data_")
        if args.epoch_data == "embedded"
        else _synthetic_root(shape, args.epoch_images)
    )
    runs = []
    if dassl:
        from dassl.engine.da.dael import DAEL as DasslDAEL

        from dael_plugin.dassl_adapter import DAELTrainer

        runs += [
            ("dassl DAEL", lambda: DasslDAEL(_epoch_cfg("dassl", shape, args, device, data_root))),
            ("dael_plugin (dassl engine)", lambda: DAELTrainer(_epoch_cfg("dassl", shape, args, device, data_root))),
            (
                "dael_plugin + aug on device",
                lambda: DAELTrainer(_epoch_cfg("dassl", shape, args, device, data_root, on_device=True)),
            ),
        ]
        if device.type == "cuda":
            runs.append(
                (
                    "dael_plugin bf16+compile+aug on device",
                    lambda: DAELTrainer(
                        _epoch_cfg("dassl", shape, args, device, data_root, on_device=True, fastest=True)
                    ),
                )
            )
    from dael_plugin.builtin.trainer import build_builtin_trainer

    bb, own = SHAPES[shape][:2]
    if args.epoch_data == "embedded" or bb == own or not dassl:
        runs.append(
            (
                "dael_plugin (built-in engine)",
                lambda: build_builtin_trainer(_epoch_cfg("builtin", shape, args, device, data_root)),
            )
        )
    else:
        print(f"(the built-in engine has no {bb}, Dassl's backbone of this shape: its epoch is not timed here)")
    if args.epoch_match:  # Dassl's DAEL stays: every ratio is against it, measured in this run
        runs = [r for r in runs if r[0] == "dassl DAEL" or args.epoch_match in r[0]]
    what = "the embedded set, shipped configs" if args.epoch_data == "embedded" else "synthetic images"
    print(
        f"\n== epoch, {shape if args.epoch_data != 'embedded' else 'embedded'}: {what}, strong view randaugment2, "
        f"{args.workers} loader workers, {device.type} =="
    )
    results, failed = {}, []
    for label, build in runs:
        # Said before it runs: a run cut short by its time limit then names the configuration
        # it was in (a compiled one spends its warm-up epoch compiling, minutes on a GPU).
        print(f"{label:<40} (running: a warm-up epoch, then {args.timed_epochs} timed)", file=sys.stderr, flush=True)
        try:
            secs, wait, batches, _, t, warm = _run_epochs(build, device, args.timed_epochs)
        except Exception as e:  # one configuration's failure must not hide the others' figures
            failed.append(label)
            print(f"{label:<40} FAILED: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
            continue
        n = batches * _images_per_batch(t)
        results[label] = n / secs
        print(
            f"{label:<40} {n / secs:>8.0f} images/s ({batches} batches, {secs:.2f} s per epoch; "
            f"waiting for data {100 * wait:.0f}% of it; warm-up epoch {warm:.1f} s)"
        )
    if dassl and "dassl DAEL" in results:
        base = results["dassl DAEL"]
        for k, v in results.items():
            if k != "dassl DAEL":
                print(f"epoch ratio {k}: {v / base:.2f}x Dassl's images/s")
    else:
        print("epoch ratio: needs Dassl's own DAEL as the reference (install Dassl; see README)")
    if failed:
        print(f"error: {len(failed)} epoch configuration(s) failed: {', '.join(failed)}")
    return results, failed


def _images_per_batch(t):
    cfg = t.cfg.DATALOADER
    target = (
        0
        if getattr(t, "train_loader_u", None) is None
        else (cfg.TRAIN_X.BATCH_SIZE if cfg.TRAIN_U.SAME_AS_X else cfg.TRAIN_U.BATCH_SIZE)
    )
    return cfg.TRAIN_X.BATCH_SIZE + target


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
        "collectives and bytes of DDP and synchronised batch norm (scripts/bench_ddp.py)",
    )
    args = p.parse_args()
    if args.ddp:  # the counts of scripts/bench_ddp.py, with its defaults
        import bench_ddp

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


if __name__ == "__main__":
    sys.exit(main())
