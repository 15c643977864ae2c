"""The DAEL training step and the evaluation tallies, shared by both engines.

Each engine parses its loader's batches into a dict of views (``img``,
``img2``, ...), labels and domain labels; :class:`DAELStep` does the rest,
once, for both: it checks the domain chunks (on the loader's CPU tensors, no
device sync), moves the views to the device, optionally makes them there
(``AUG_ON_DEVICE``), runs the core's losses under the chosen precision and
layout (optionally compiled), the backward pass and the optimiser steps, and
flags a non-finite loss on the device. Nothing in it reads a device value on
the host or turns a Python value into a device tensor, so a step never waits
for the device (``tests/test_step.py`` checks every execution option with
:class:`dael_plugin.engine.profiling.HostTraffic`). With fp16 and the fused
optimisers (the defaults), the loss scaler hands its inf flag to the
optimiser kernel; the one host read left is PyTorch's ``GradScaler.step``
with ``FUSED_OPTIM False``, once per optimiser.

:class:`DeviceMeters` keeps running sums on the device for the log, read at
``PRINT_FREQ`` (evaluation is :mod:`dael_plugin.engine.evaluate`).
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from yacs.config import CfgNode as CN

from dael_plugin.config import trainer_node
from dael_plugin.core import DAEL
from dael_plugin.core.chunk_norm import PYTHON_DRAWERS, layer_named, resolve_impl
from dael_plugin.data.batching import split_domains
from dael_plugin.engine import execution as ex
from dael_plugin.engine import memory
from dael_plugin.engine.distributed import LossModule, mean_over_processes, world, wrap
from dael_plugin.engine.first_step_check import FirstStepCheck
from dael_plugin.engine.guard import FiniteGuard
from dael_plugin.engine.strategy import Strategy
from dael_plugin.errors import DAELConfigError
from dael_plugin.transforms.device import DeviceViews, check_device_names

VIEW_KEYS = ("img", "img2", "img3")


class DAELStep:
    """One DAEL step: ``step(batch_x, batch_u) -> {name: 0-dim device tensor}``.

    Args:
        algorithm: the core :class:`~dael_plugin.core.DAEL`.
        optimizers: every optimiser of the model (stepped together).
        strategy: where and how the step runs (:class:`~dael_plugin.engine.strategy.Strategy`):
            the device, ``PREC`` (autocast, fp16's loss scaler; weights stay fp32), ``COMPILE``
            (``torch.compile`` of the forward and losses, and of the views made on the device;
            the backward is compiled with it), the views fed in ``channels_last`` and the first
            step's check of the fused pass.
        num_domains: number of source domains (experts).
        per_domain: images per domain chunk in a source batch.
        is_da: use target batches (L_u).
        device_views: makes the views on the device from uint8 images
            (``AUG_ON_DEVICE``), or None when the loader made them.
        guard: the divergence flag to update.
    """

    def __init__(
        self,
        algorithm: DAEL,
        optimizers: Sequence[torch.optim.Optimizer],
        strategy: Strategy,
        num_domains: int,
        per_domain: int,
        is_da: bool,
        device_views: Optional[Callable[[torch.Tensor], List[torch.Tensor]]] = None,
        guard: Optional[FiniteGuard] = None,
    ) -> None:
        self.algorithm = algorithm
        self.optimizers = list(optimizers)
        self.strategy = strategy
        self.device = device = strategy.device
        self.num_domains = num_domains
        self.per_domain = per_domain
        self.is_da = is_da
        self.prec = prec = strategy.execution.prec
        compile_mode, compile_backend = strategy.execution.compile, strategy.compile_backend
        self.channels_last = strategy.views_channels_last
        self.device_views = device_views
        self.guard = guard if guard is not None else FiniteGuard()
        self.scaler = strategy.scaler
        self.num_views = algorithm.hparams.num_views
        self.keys = ["loss_x", "acc_x", "loss_cr"] + (["loss_u", "mask_u"] if is_da else [])
        if algorithm.class_mask is not None and algorithm.hparams.masks("other"):
            self.keys.append("loss_other")
        # The fused grouped pass checked against per-chunk batch norm on the first batch (on CUDA by
        # default: engine/first_step_check.py); its finding lands in results.json.
        grouped = algorithm.fuse_chunks and resolve_impl(algorithm.chunk_bn, device.type) == "grouped"
        # A compiled step runs the fused kernel's compiled branch: the check compiles the fused pass too.
        checked_backend = compile_backend if compile_mode != "none" else None
        check = strategy.check_first_step and grouped
        self._first_step_check = FirstStepCheck(prec, checked_backend) if check else None
        self.fast_path_check: Optional[Dict[str, object]] = None
        self._losses = self._forward
        self.compiled = compile_mode != "none"
        if compile_mode == "reduce-overhead" and world().distributed:
            raise DAELConfigError(
                "COMPILE reduce-overhead is refused under torchrun: its CUDA graphs would capture the "
                "batch-norm collectives, which no test has run yet (PyTorch #155679); use COMPILE default or none"
            )
        # a layer that draws in Python whether it acts branches on a host value: no fullgraph compile holds it
        drawer = layer_named(algorithm.featurizer, PYTHON_DRAWERS) if self.compiled else None
        if drawer:
            raise DAELConfigError(
                f"EXECUTION.COMPILE {compile_mode}: the backbone's {drawer} layer draws in Python whether it mixes "
                "(Dassl's random.random() > p), which one compiled graph cannot hold; use EXECUTION.COMPILE none"
            )
        if self.compiled:
            # The whole forward and the losses in one graph (fullgraph: a host
            # sync or anything else that would break it is an error, not a
            # silent slowdown); static shapes, as the loaders drop last batches.
            # The views made on the device are compiled too: static shapes, and
            # inductor fuses their element-wise work. Random numbers: eager's kernels, in
            # eager's order (execution.eager_random), so dropout draws what the eager step draws.
            ex.eager_random()
            self._losses = torch.compile(
                self._forward, mode=compile_mode, fullgraph=True, dynamic=False, backend=compile_backend
            )
            if device_views is not None:
                self.device_views = torch.compile(
                    device_views, mode=compile_mode, fullgraph=True, dynamic=False, backend=compile_backend
                )
        if world().distributed:
            # One DDP forward per step: DDP averages the gradients over the processes in the
            # backward pass (engine/distributed.py says why that is the single-process gradient).
            modules = torch.nn.ModuleList([algorithm.featurizer, algorithm.heads])
            self._losses = wrap(LossModule(modules, self._losses), device)

    # -- batches ---------------------------------------------------------------
    def views(self, batch_x: dict, batch_u: Optional[dict]) -> Tuple[List[torch.Tensor], Optional[List[torch.Tensor]]]:
        """Both batches' views on the device, in the step's layout. Made on the device, the
        source and target views come from one call over both batches (half the launches)."""
        batches = [batch_x] + ([batch_u] if batch_u is not None else [])
        layout = torch.channels_last if self.channels_last else torch.contiguous_format
        if self.device_views is not None:
            images = [b["img"].to(self.device, non_blocking=True) for b in batches]  # each from pinned memory
            made = self.device_views(images[0] if len(images) == 1 else torch.cat(images))
            sizes = [i.shape[0] for i in images]
            made = [v.contiguous(memory_format=layout) for v in made]
            per_batch = [list(parts) for parts in zip(*(v.split(sizes) for v in made))]
        else:
            per_batch = [
                [
                    b[k].to(self.device, non_blocking=True).contiguous(memory_format=layout)
                    for k in VIEW_KEYS[: self.num_views]
                ]
                for b in batches
            ]
        return per_batch[0], (per_batch[1] if batch_u is not None else None)

    def _forward(
        self,
        x_views: List[torch.Tensor],
        labels: torch.Tensor,
        expert_idx: torch.Tensor,
        chunk_sizes: Sequence[int],
        u_views: Optional[List[torch.Tensor]],
    ) -> Dict[str, torch.Tensor]:
        with self.strategy.autocast():
            out = self.algorithm.losses(x_views, labels, expert_idx, chunk_sizes, u_views)
        return out

    # -- the step --------------------------------------------------------------
    def losses(
        self, batch_x: dict, batch_u: Optional[dict] = None
    ) -> Tuple[Dict[str, torch.Tensor], Optional[List[torch.Tensor]]]:
        """The forward pass and the losses of a step (``out``), and the target views it used."""
        chunk_sizes, expert_idx = split_domains(batch_x["domain"], self.per_domain, self.num_domains)
        x_views, u_views = self.views(batch_x, batch_u if self.is_da else None)
        labels = batch_x["label"].to(self.device, non_blocking=True)
        expert_idx = expert_idx.to(self.device, non_blocking=True)
        if self._first_step_check is not None:
            self._check_fast_path(x_views, chunk_sizes, u_views)
        return self._losses(x_views, labels, expert_idx, chunk_sizes, u_views), u_views

    def _check_fast_path(self, x_views, chunk_sizes, u_views) -> None:
        """Once: the fused pass on this batch's views against per-chunk batch norm (a fallback to
        ``split`` on a mismatch; under torchrun, where the synchronised form shares the kernels, a stop)."""
        check, self._first_step_check = self._first_step_check, None
        parts, part_chunks = self.algorithm.gradient_parts(x_views, chunk_sizes, u_views)  # the step's own layout
        sizes = [c for cs in part_chunks for c in cs]
        check(self.algorithm, torch.cat(parts), sizes, self.strategy.autocast)
        self.fast_path_check = check.result
        if check.result["fell_back"] and world().distributed:
            raise DAELConfigError(
                "the fused batch norm failed its first-step check on this device, and the synchronised batch "
                "norm of a torchrun run uses the same kernels; run on one process (it falls back to CHUNK_BN "
                "split) and report the log line above"
            )

    def __call__(self, batch_x: dict, batch_u: Optional[dict] = None) -> Dict[str, torch.Tensor]:
        out, u_views = self.losses(batch_x, batch_u)
        self.strategy.backward_and_update(out["loss"], self.optimizers, self.guard)
        # Copies: under CUDA graphs the next replay overwrites the graph's outputs.
        result = {k: out[k].detach().float().clone() if self.compiled else out[k].detach().float() for k in self.keys}
        if u_views is not None and "pseudo_label_u" in out and "label" in batch_u:
            # Diagnostics only (never in the loss): the accuracy of the kept pseudo-labels,
            # where the target data carries labels (Dassl's benchmark datasets do).
            true = batch_u["label"].to(self.device, non_blocking=True)
            kept = out["pseudo_mask_u"].detach().float()
            result["pl_hits_u"] = ((out["pseudo_label_u"].detach() == true).float() * kept).sum()
            result["pl_kept_u"] = kept.sum()  # DeviceMeters reads the two as pl_acc_u
        return result


class DeviceMeters:
    """Running sums of a step's 0-dim tensors, kept on the device; ``read()`` and
    ``means()`` copy them to the host in one transfer."""

    def __init__(self) -> None:
        self.sums: Dict[str, torch.Tensor] = {}
        self.last: Dict[str, torch.Tensor] = {}
        self.count = 0

    def update(self, values: Dict[str, torch.Tensor]) -> None:
        for k, v in values.items():
            v = v.detach().float()
            self.sums[k] = v.clone() if k not in self.sums else self.sums[k].add_(v)
            self.last[k] = v
        self.count += 1

    def read(self):
        """``(last, mean)`` dicts of floats: the latest step's values and the running means."""
        if not self.sums:
            return {}, {}
        names = list(self.sums)
        # Over every process of a distributed run (sums: the ratio of means is the ratio of sums).
        host = mean_over_processes(torch.stack([self.last[k] for k in names] + [self.sums[k] for k in names]))
        host = host.cpu().tolist()
        n = len(names)
        last = dict(zip(names, host[:n]))
        mean = {k: v / self.count for k, v in zip(names, host[n:])}
        for d in (last, mean):
            # The accuracy of the kept pseudo-labels, over all kept ones (not a mean of batch ratios).
            if "pl_hits_u" in d:
                hits, kept = d.pop("pl_hits_u"), d.pop("pl_kept_u")
                d["pl_acc_u"] = 100.0 * hits / kept if kept > 0 else float("nan")
        return last, mean

    def means(self) -> Dict[str, float]:
        return self.read()[1]


PERCENT_METERS = ("acc_x", "acc", "mask_u", "pl_acc_u")  # shown in percent; the rest are losses
_FRACTIONS = ("mask_u",)  # kept as a fraction on the device and in TensorBoard, shown in percent


def format_meter(key: str, value: float) -> str:
    """One meter for a log line, in consistent units: accuracies and the kept-target rate in
    percent, losses as numbers; the pseudo-labels' accuracy is ``-`` until one has been kept."""
    if value != value:  # NaN: pl_acc_u before the first kept pseudo-label
        return "-"
    if key in PERCENT_METERS:
        return f"{value * 100 if key in _FRACTIONS else value:.1f}%"
    return f"{value:.4f}"


def format_meters(means: Dict[str, float], last: Optional[Dict[str, float]] = None) -> str:
    """``key value`` pairs for a log line; with ``last``, Dassl's ``key last (mean)``."""
    if last is None:
        return " ".join(f"{k} {format_meter(k, v)}" for k, v in means.items())
    return " ".join(f"{k} {format_meter(k, last[k])} ({format_meter(k, v)})" for k, v in means.items())


_SHORT = {
    "loss_x": "x",
    "acc_x": "acc",
    "loss_cr": "cr",
    "loss_u": "u",
    "loss_other": "oth",
    "mask_u": "mask",
    "pl_acc_u": "pl",
    "loss": "loss",
}


def short_meters(means: Dict[str, float]) -> str:
    """The progress bar's postfix: the same meters under short names, so that a 100-column
    terminal shows all of them (x=loss_x, acc=acc_x, cr=loss_cr, u=loss_u, mask=mask_u, pl=pl_acc_u)."""
    return " ".join(f"{_SHORT.get(k, k)} {format_meter(k, v)}" for k, v in means.items())


def prepare_model(strategy: Strategy, backbone: torch.nn.Module, cfg: CN) -> bool:
    """Put the backbone in ``channels_last`` where that is on and it runs in it; the step's views
    follow it (``strategy.views_channels_last``, returned)."""
    if strategy.execution.channels_last:
        shape = (3, *[int(s) for s in cfg.INPUT.SIZE])
        name = str(cfg.MODEL.BACKBONE.NAME)
        strategy.views_channels_last = ex.use_channels_last(backbone, shape, strategy.device, name=name)
    return strategy.views_channels_last


def make_step(
    strategy: Strategy,
    algorithm: DAEL,
    optimizers: Sequence[torch.optim.Optimizer],
    num_domains: int,
    per_domain: int,
    is_da: bool,
    guard: FiniteGuard,
    cfg: CN,
) -> DAELStep:
    """The step for an engine, on the run's strategy (its ``EXECUTION`` options)."""
    check_memory(strategy, algorithm, num_domains, per_domain, is_da, cfg)
    device_views = None
    if strategy.execution.aug_on_device:
        device_views = build_device_views(cfg, algorithm.hparams.num_views, strategy.device)
    return DAELStep(algorithm, optimizers, strategy, num_domains, per_domain, is_da, device_views, guard)


def check_memory(
    strategy: Strategy, algorithm: DAEL, num_domains: int, per_domain: int, is_da: bool, cfg: CN
) -> Optional[int]:
    """Before the first batch: a step whose activations cannot fit in the memory available is one
    line (:func:`~dael_plugin.engine.memory.check_step_memory`). A compiled step keeps less
    (inductor recomputes; 1033 against 4910 MiB on the H200 at miniDomainNet's shape), so it is
    not checked: the figure would be no floor for it."""
    if strategy.execution.compile != "none":
        return None
    hp = algorithm.hparams
    d = cfg.DATALOADER
    source = num_domains * per_domain
    target = (d.TRAIN_X.BATCH_SIZE if d.TRAIN_U.SAME_AS_X else d.TRAIN_U.BATCH_SIZE) // world().size
    images = source * (2 if hp.use_cr else 1) + (target if is_da and hp.use_u else 0)
    what = (
        f"{num_domains} x {per_domain} source images per process"
        + (" under two views" if hp.use_cr else "")
        + (f" and {target} target images" if is_da and hp.use_u else "")
    )
    return memory.check_step_memory(
        torch.nn.Sequential(algorithm.featurizer, algorithm.heads),
        strategy.device,
        cfg.INPUT.SIZE,
        images,
        strategy.execution.prec,
        what,
        local_processes=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
    )


def build_device_views(cfg: CN, num_views: int, device: torch.device) -> DeviceViews:
    """The views on the device, from the run's config (``INPUT`` and ``TRAINER.<NAME>``)."""
    node = trainer_node(cfg)
    prefix = f"TRAINER.{str(cfg.TRAINER.NAME).upper()}"
    check_device_names(cfg.INPUT.TRANSFORMS, "INPUT.TRANSFORMS")
    check_device_names(node.STRONG_TRANSFORMS, f"{prefix}.STRONG_TRANSFORMS")
    return DeviceViews(
        cfg.INPUT.TRANSFORMS,
        node.STRONG_TRANSFORMS,
        num_views,
        cfg.INPUT,
        node,
        device=device,
        size=tuple(cfg.INPUT.SIZE),
    )
