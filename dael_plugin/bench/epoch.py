"""Epochs through Dassl's own DAEL trainer and the plugin's trainers on both engines: images/s and
the share of the epoch spent waiting for data."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
import time

import torch

from dael_plugin.bench.common import SHAPES, K, has_dassl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository: configs/


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


_SCRATCH = []  # the folders this process's epochs made, removed when bench_epoch returns
_WRITERS = []  # the TensorBoard writers it opened, closed before their folders go (their thread writes)


def _scratch(prefix):
    path = tempfile.mkdtemp(prefix=prefix)
    _SCRATCH.append(path)
    return path


def _synthetic_root(shape, images):
    import numpy as np
    from PIL import Image

    _, _, size, classes, _ = SHAPES[shape]
    root = _scratch("dael_bench_")
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
        from dael_plugin.config.defaults import get_builtin_cfg

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
        _scratch("dael_bench_out_"),
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
        _WRITERS.append(t.writer)

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
    """Epochs through Dassl's own DAEL trainer and the plugin's trainers on both engines; the images
    and output folders it makes are removed when it returns, as it fails too."""
    try:
        return _bench_epoch(shape, args, device)
    finally:
        while _WRITERS:
            _WRITERS.pop().close()
        while _SCRATCH:
            shutil.rmtree(_SCRATCH.pop(), ignore_errors=True)


def _bench_epoch(shape, args, device):
    dassl = has_dassl()
    data_root = (
        _scratch("dael_bench_data_") if args.epoch_data == "embedded" else _synthetic_root(shape, args.epoch_images)
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
    from dael_plugin.methods import build_trainer

    bb, own = SHAPES[shape][:2]
    if args.epoch_data == "embedded" or bb == own or not dassl:
        runs.append(
            (
                "dael_plugin (built-in engine)",
                lambda: build_trainer(_epoch_cfg("builtin", shape, args, device, data_root)),
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
