#!/usr/bin/env python
"""Time DAEL training: this plugin against Dassl's own DAEL, side by side, in one run.

Step (always): one training step (forward, backward, optimiser) on the same
synthetic batch from the same initial weights, for Dassl's DAEL and for the
plugin with its execution options switched on one after another (one call
per chunk -> fused pass -> fused optimiser -> channels_last -> bf16 ->
torch.compile). Steps of all configurations alternate after warm-up; each
figure is a median. Peak GPU memory is measured per configuration.

Epoch (``--epoch``): one epoch of a synthetic folder dataset at the shape's
resolution through Dassl's own DAEL trainer and through the plugin's trainer
(loader, step and loop bookkeeping), in images/s, plus the plugin with
``AUG_ON_DEVICE``.

Shapes: ``digit5`` (Dassl's ``cnn_digit5_m3sda``, 32x32, 3x32 source + 32
target on CPU, 3x64 + 64 on GPU) and ``minidomainnet`` (ResNet-18, 96x96,
3x64 + 64). The last line is

    speedup_vs_dassl_dael: X.XX

the step ratio (Dassl's time / the plugin's fastest exact configuration) at
miniDomainNet's shape on a GPU, and at digit5's on CPU (fp32 there: the
CPU target is stated for fp32 numerics).

Needs Dassl installed (the reference is ``dassl.engine.da.dael.DAEL``).
"""
import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

SHAPES = {
    # name: backbone, image size, classes, per-domain batch (cpu, gpu)
    "digit5": ("cnn_digit5_m3sda", 32, 10, (32, 64)),
    "minidomainnet": ("resnet18", 96, 126, (64, 64)),
}
K = 3  # source domains


def _bare(cls, device, k, c, per_domain):
    from dassl.engine.trainer import TrainerBase

    obj = cls.__new__(cls)
    TrainerBase.__init__(obj)
    obj.device = device
    obj.batch_idx, obj.num_batches = 0, 10**9
    obj.num_source_domains, obj.num_classes = k, c
    obj.n_domain, obj.split_batch = k, per_domain
    obj.weight_u, obj.conf_thre = 0.5, 0.0
    return obj


def _sgd(params, fused=False):
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4)
    if fused:
        from dael_plugin.execution import fused_optimizer

        opt = fused_optimizer(opt)
    return opt


class Dassl:
    """Dassl's DAEL trainer, built bare around the given modules."""

    name = "dassl DAEL"

    def __init__(self, backbone, experts, device, c, per_domain):
        from dassl.engine.da.dael import DAEL as Reference

        self.t = t = _bare(Reference, device, K, c, per_domain)
        t.F, t.E = backbone, experts
        t.register_model("F", t.F, _sgd(t.F.parameters()), None)
        t.register_model("E", t.E, _sgd(t.E.parameters()), None)
        t.set_model_mode("train")

    def __call__(self, bx, bu):
        return self.t.forward_backward(bx, bu)


class Plugin:
    """The plugin's shared step with a given set of execution options."""

    def __init__(self, name, backbone, experts, device, c, per_domain, size, fuse, fused_optim,
                 channels_last, prec, compile_mode):
        from dael_plugin.core import DAEL, DAELHparams, ExpertHeads
        from dael_plugin.execution import channels_last_reason
        from dael_plugin.step import DAELStep

        self.name = name
        self.F = backbone
        self.E = ExpertHeads(backbone.out_features, c, K).to(device).load_from_linears(experts.linears)
        self.note = ""
        if channels_last:
            reason = channels_last_reason(self.F, (3, size, size), device)
            if reason is not None:
                channels_last, self.note = False, "channels_last n/a: " + reason[:60]
            elif getattr(self.F, "_dael_channels_last_boundary", None):
                self.note = f"channels_last up to {self.F._dael_channels_last_boundary}: the backbone .views after it"
        self.channels_last = channels_last
        alg = DAEL(self.F, self.E, DAELHparams(conf_thre=0.0), fuse_chunks=fuse)
        opts = [_sgd(self.F.parameters(), fused_optim), _sgd(self.E.parameters(), fused_optim)]
        self.step = DAELStep(alg, opts, device, K, per_domain, True, prec=prec, channels_last=channels_last,
                             compile_mode=compile_mode)
        self.F.train(), self.E.train()

    def __call__(self, bx, bu):
        return self.step(bx, bu)


def make_batch(per_domain, target, size, classes, seed=1):
    g = torch.Generator().manual_seed(seed)
    n = K * per_domain
    shape = (3, size, size)
    bx = {"img": torch.randn((n,) + shape, generator=g), "img2": torch.randn((n,) + shape, generator=g),
          "label": torch.randint(0, classes, (n,), generator=g),
          "domain": torch.arange(K).repeat_interleave(per_domain)}
    bu = {"img": torch.randn((target,) + shape, generator=g), "img2": torch.randn((target,) + shape, generator=g)}
    return bx, bu


def configs(args, device):
    """(label, options) cumulative, as the per-option shares need."""
    cuda = device.type == "cuda"
    steps = [("per-chunk calls (as Dassl)", {}),
             ("+ fused pass", {"fuse": True}),
             ("+ fused optimiser", {"fused_optim": True}),
             ("+ channels_last", {"channels_last": True})]
    if cuda or args.bf16:
        steps.append(("+ bf16 autocast", {"prec": "bf16"}))
    if cuda or args.compile:
        steps.append(("+ torch.compile", {"compile_mode": "reduce-overhead" if cuda else "default"}))
    out, cur = [], {"fuse": False, "fused_optim": False, "channels_last": False, "prec": "fp32", "compile_mode": "none"}
    for label, change in steps:
        cur = {**cur, **change}
        out.append((label, dict(cur)))
    return out


def bench_step(shape, args, device):
    from dassl.engine.da.dael import Experts
    from dassl.modeling import build_backbone

    bb_name, size, classes, per = SHAPES[shape]
    per_domain = per[1] if device.type == "cuda" else per[0]
    if args.per_domain:
        per_domain = args.per_domain
    target = per_domain
    torch.manual_seed(0)
    backbone = build_backbone(bb_name, verbose=False, pretrained=False).to(device)
    experts = Experts(K, backbone.out_features, classes).to(device)
    bx, bu = make_batch(per_domain, target, size, classes)
    if device.type == "cuda":
        bx = {k: v.to(device) for k, v in bx.items()}
        bu = {k: v.to(device) for k, v in bu.items()}
        bx["domain"] = bx["domain"].cpu()  # the loader's CPU tensor (chunk checks without a sync)
    runners = [Dassl(copy.deepcopy(backbone), copy.deepcopy(experts), device, classes, per_domain)]
    for label, opts in configs(args, device):
        runners.append(Plugin(label, copy.deepcopy(backbone), experts, device, classes, per_domain, size, **opts))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def timed(r):
        torch.manual_seed(123)
        sync()
        t0 = time.perf_counter()
        out = r(bx, bu)
        sync()
        return time.perf_counter() - t0, out

    print(f"\n== step, {shape}: {bb_name}, {size}x{size}, {K} domains x {per_domain} + {target} target ==")
    # Same start, same result: one step of Dassl and of the exact fp32 plugin from identical weights.
    _, ref = timed(runners[0])
    exact = [r for r in runners[1:] if r.step.prec == "fp32"][-1]
    _, ours = timed(exact)
    diff = max(abs(float(ref[k]) - float(ours[k])) for k in ("loss_x", "loss_cr", "loss_u"))
    print(f"first step, losses x/cr/u: dassl {float(ref['loss_x']):.5f}/{float(ref['loss_cr']):.5f}/"
          f"{float(ref['loss_u']):.5f}, plugin ({exact.name.strip('+ ')}) {float(ours['loss_x']):.5f}/"
          f"{float(ours['loss_cr']):.5f}/{float(ours['loss_u']):.5f}; max abs diff {diff:.1e} "
          "(Dassl takes log(p + 1e-5))")
    peak = {}
    for r in runners:
        for _ in range(args.warmup):
            timed(r)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            timed(r)
            peak[r.name] = torch.cuda.max_memory_allocated() / 2**20
    times = {r.name: [] for r in runners}
    for i in range(args.repeats):
        order = runners[i % len(runners):] + runners[: i % len(runners)]  # rotate who goes first
        for r in order:
            times[r.name].append(timed(r)[0])
    med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
    base = med[runners[0].name]
    print(f"{'configuration':<30} {'median ms':>10} {'vs dassl':>9}" + (f" {'peak MiB':>9}" if peak else ""))
    for r in runners:
        note = getattr(r, "note", "")
        line = f"{r.name:<30} {med[r.name]:>10.1f} {base / med[r.name]:>8.2f}x"
        if peak:
            line += f" {peak[r.name]:>9.0f}"
        print(line + (f"  ({note})" if note else ""))
    plugin = runners[1:]
    saved = med[plugin[0].name] - min(med[r.name] for r in plugin)
    for prev, cur in zip(plugin, plugin[1:]):
        delta = med[prev.name] - med[cur.name]
        share = 100 * delta / saved if saved > 0 else 0.0
        print(f"share {cur.name.strip('+ '):<18} {delta:>+8.1f} ms  ({share:.0f}% of the plugin's saving)")
    fp32 = [r for r in plugin if r.step.prec == "fp32"]
    best_fp32 = min(fp32, key=lambda r: med[r.name])
    best = min(plugin, key=lambda r: med[r.name])
    return {"dassl": base, "best": med[best.name], "best_name": best.name, "best_fp32": med[best_fp32.name],
            "best_fp32_name": best_fp32.name, "peak": peak}


def bench_aug(shape, args, device):
    """Views made in a loader (PIL, per image, one process) against on the device (batched)."""
    from PIL import Image
    from yacs.config import CfgNode as CN

    from dael_plugin.augment import build_views
    from dael_plugin.augment_device import DeviceViews
    from dael_plugin.builtin.defaults import get_builtin_cfg

    _, size, _, per = SHAPES[shape]
    n = K * (args.per_domain or (per[1] if device.type == "cuda" else per[0]))
    cfg = get_builtin_cfg()
    cfg.INPUT.SIZE = (size, size)
    cfg.INPUT.TRANSFORMS = ["random_flip", "normalize"]
    strong = ["random_flip", "cutout", "randaugment2", "normalize"]
    node = CN({"STRONG_TRANSFORMS": strong})
    cpu_views = build_views(cfg, strong, 2, node)
    imgs = [Image.fromarray(torch.randint(0, 255, (size, size, 3), dtype=torch.uint8).numpy()) for _ in range(n)]
    t0 = time.perf_counter()
    for im in imgs:
        for v in cpu_views:
            v(im)
    pil = (time.perf_counter() - t0) * 1e3
    dev = DeviceViews(cfg.INPUT.TRANSFORMS, strong, 2, cfg.INPUT, node)
    u8 = torch.randint(0, 255, (n, 3, size, size), dtype=torch.uint8, device=device)
    for _ in range(2):
        dev(u8)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        dev(u8)
    if device.type == "cuda":
        torch.cuda.synchronize()
    on_dev = (time.perf_counter() - t0) / 5 * 1e3
    print(f"share aug on device: weak+strong views of {n} images at {size}x{size}: {pil:.1f} ms in one loader "
          f"process (PIL) vs {on_dev:.1f} ms on {device.type} (batched, per-sample draws)")


def bench_epoch(shape, args, device):
    """One epoch through Dassl's own DAEL trainer and through the plugin's, same data and config."""
    import numpy as np
    from PIL import Image

    from dassl.config import get_cfg_default
    from dassl.engine.da.dael import DAEL as DasslDAEL

    from dael_plugin import add_dael_config
    from dael_plugin.dassl_adapter import DAELTrainer

    bb_name, size, classes, per = SHAPES[shape]
    per_domain = args.per_domain or (per[1] if device.type == "cuda" else per[0])
    root = tempfile.mkdtemp(prefix="dael_bench_")
    rng = np.random.default_rng(0)
    domains = ["d0", "d1", "d2", "t"]
    n_img = args.epoch_images
    for d in domains:
        for split in ("train", "val", "test"):
            per_class = max(1, n_img // classes) if split == "train" else 1
            for c in range(classes):
                folder = os.path.join(root, d, split, f"c{c:03d}")
                os.makedirs(folder, exist_ok=True)
                for i in range(per_class):
                    arr = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
                    Image.fromarray(arr).save(os.path.join(folder, f"{i}.png"))

    def cfg_for(on_device=False, fastest=False):
        cfg = get_cfg_default()
        add_dael_config(cfg)
        cfg.merge_from_list([
            "DATASET.NAME", "DomainFolders", "DATASET.ROOT", root, "DATASET.SOURCE_DOMAINS", domains[:3],
            "DATASET.TARGET_DOMAINS", ["t"], "TRAINER.NAME", "DAEL", "MODEL.BACKBONE.NAME", bb_name,
            "INPUT.SIZE", (size, size), "INPUT.TRANSFORMS", ["random_flip", "normalize"],
            "TRAINER.DAEL.STRONG_TRANSFORMS", ["random_flip", "cutout", "randaugment2", "normalize"],
            "DATALOADER.TRAIN_X.SAMPLER", "RandomDomainSampler", "DATALOADER.TRAIN_X.BATCH_SIZE", K * per_domain,
            "DATALOADER.TRAIN_U.SAME_AS_X", False, "DATALOADER.TRAIN_U.BATCH_SIZE", per_domain,
            "DATALOADER.NUM_WORKERS", args.workers, "OPTIM.MAX_EPOCH", 1, "OPTIM.LR", 0.01,
            "TRAIN.PRINT_FREQ", 10**6, "USE_CUDA", device.type == "cuda", "VERBOSE", False,
            "OUTPUT_DIR", tempfile.mkdtemp(prefix="dael_bench_out_"), "TEST.NO_TEST", True,
            "TRAINER.DAEL.AUG_ON_DEVICE", on_device,
        ])
        if fastest:  # the GPU's fastest configuration of the step bench
            cfg.merge_from_list(["TRAINER.DAEL.PREC", "bf16", "TRAINER.DAEL.COMPILE", "reduce-overhead"])
        return cfg

    print(f"\n== epoch, {shape}: {bb_name}, {size}x{size}, {n_img} images per domain, "
          f"{args.workers} loader workers ==")
    results = {}
    runs = [("dassl DAEL", lambda: DasslDAEL(cfg_for())),
            ("dael_plugin", lambda: DAELTrainer(cfg_for())),
            ("dael_plugin + aug on device", lambda: DAELTrainer(cfg_for(True)))]
    if device.type == "cuda":
        runs.append(("dael_plugin bf16+compile+aug on device", lambda: DAELTrainer(cfg_for(True, True))))
    for label, build in runs:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            t = build()
            t.max_epoch, t.start_epoch, t.epoch = 1, 0, 0
            t.before_train = lambda: None
            t.set_model_mode("train")
            t.run_epoch()  # a warm-up epoch: workers, caches, kernel choices
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            t.run_epoch()
            if device.type == "cuda":
                torch.cuda.synchronize()
            secs = time.perf_counter() - t0
            # Compute alone: the same number of steps on batches already loaded.
            it_x, it_u = iter(t.train_loader_x), iter(t.train_loader_u)
            held = [(next(it_x), next(it_u)) for _ in range(min(t.num_batches, 8))]
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for bx, bu in held:
                t.forward_backward(bx, bu)
            if device.type == "cuda":
                torch.cuda.synchronize()
            compute = (time.perf_counter() - t0) / len(held) * t.num_batches
        n = t.num_batches * (K * per_domain + per_domain)
        results[label] = n / secs
        print(f"{label:<30} {n / secs:>9.0f} images/s ({t.num_batches} batches, {secs:.2f} s; "
              f"end-to-end / compute alone {secs / compute:.2f})")
    base = results["dassl DAEL"]
    for k, v in results.items():
        if k != "dassl DAEL":
            print(f"epoch ratio {k}: {v / base:.2f}x Dassl's images/s")
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="auto", choices=("auto", "digit5", "minidomainnet", "both"),
                   help="auto: both on a GPU, digit5 on CPU")
    p.add_argument("--per-domain", type=int, default=0, help="override the per-domain batch")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--bf16", action="store_true", help="on CPU, also time bf16 autocast (always on a GPU)")
    p.add_argument("--compile", action="store_true", help="on CPU, also time torch.compile (always on a GPU)")
    p.add_argument("--epoch", action="store_true", help="also time a full epoch against Dassl's trainer")
    p.add_argument("--epoch-images", type=int, default=0, help="training images per domain for --epoch")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args()

    import dael_plugin

    if not dael_plugin.HAS_DASSL:
        sys.exit("error: scripts/bench.py compares against Dassl's DAEL; install Dassl by hand (see README)")
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    shapes = {"auto": ["digit5", "minidomainnet"] if cuda else ["digit5"], "both": ["digit5", "minidomainnet"]}
    shapes = shapes.get(args.shape, [args.shape])
    if not args.epoch_images:
        args.epoch_images = 2048 if cuda else 192
    name = torch.cuda.get_device_name() if cuda else f"CPU ({torch.get_num_threads()} threads)"
    print(f"device: {name}; torch {torch.__version__}")
    results = {}
    head = "minidomainnet" if (cuda and "minidomainnet" in shapes) else shapes[0]
    for shape in shapes:
        results[shape] = bench_step(shape, args, device)
        bench_aug(shape, args, device)
    if args.epoch:  # at the headline shape (96x96 on a GPU)
        bench_epoch(head, args, device)
    r = results[head]
    key, label = ("best", r["best_name"]) if cuda else ("best_fp32", r["best_fp32_name"])
    print(f"\nheadline: {head}, plugin '{label.strip('+ ')}' configuration, "
          f"{'fastest' if cuda else 'fastest fp32'}: {r[key]:.1f} ms vs Dassl {r['dassl']:.1f} ms")
    print(f"speedup_vs_dassl_dael: {r['dassl'] / r[key]:.2f}")


if __name__ == "__main__":
    main()
