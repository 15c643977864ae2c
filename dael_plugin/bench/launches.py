"""Operator launches, copies and host reads per training step, counted on the CPU as a GPU would
launch them (:mod:`dael_plugin.engine.profiling`), Dassl's DAEL beside the plugin's configurations."""

from __future__ import annotations

import copy

import torch

from dael_plugin.bench.common import SHAPES, Dassl, K, Plugin, _models, configs, has_dassl, make_batch
from dael_plugin.bench.step import _paper_views


def launch_counts(size: int = 32, per_domain: int = 64, dassl=None, backbone_name: str = ""):
    """``{label: LaunchCount}`` of one training step at miniDomainNet's shape, on CPU, each
    configuration as it runs on a GPU (module docstring); Dassl's DAEL first when installed.
    ``backbone_name``: another backbone than ResNet-18 (``timm_vit_small_patch16_224``: a model
    without batch norm), built by the plugin for ``size`` and given to both."""
    from dael_plugin.core.chunk_norm import resolve_impl
    from dael_plugin.engine.profiling import count_launches

    dassl = has_dassl() if dassl is None else dassl
    device = torch.device("cpu")
    backbone, experts, _ = _models("minidomainnet", device, dassl)
    if backbone_name:
        from dael_plugin.backbones import build_backbone

        torch.manual_seed(0)
        backbone = build_backbone(backbone_name, img_size=(size, size)).to(device)
        if dassl:
            from dassl.engine.da.dael import Experts

            experts = Experts(K, backbone.out_features, SHAPES["minidomainnet"][3]).to(device)
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
    name = getattr(args, "launch_backbone", "") or ""
    counts = launch_counts(args.launch_size, n, backbone_name=name)
    base = counts.get("dassl DAEL")
    print(
        f"\n== launches per step, miniDomainNet's shape ({name or 'ResNet-18'}, {K} x {n} + {n}, {args.launch_size}x"
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
