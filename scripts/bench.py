#!/usr/bin/env python
"""Time one DAEL training step: this plugin's against Dassl's own DAEL.

Both run forward, backward and the optimiser step on the same synthetic
batch, with the same backbone and the same initial weights, on the same
device (GPU when present, else CPU). Steps alternate between the two after
warm-up; the figure is the ratio of median step times. The last line is

    speedup_vs_dassl_dael: X.XX    (Dassl's step time / ours)

Needs Dassl installed (the reference is ``dassl.engine.da.dael.DAEL``).
"""
import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402


def make_trainers(args, device):
    from dassl.engine.da.dael import DAEL as Reference
    from dassl.engine.da.dael import Experts
    from dassl.engine.trainer import TrainerBase
    from dassl.modeling import build_backbone

    from dael_plugin.core import DAEL as Core
    from dael_plugin.core import DAELHparams, ExpertHeads
    from dael_plugin.dassl_adapter import DAELTrainer

    torch.manual_seed(0)
    backbone = build_backbone(args.backbone, verbose=False, pretrained=False).to(device)
    k, c = args.domains, args.classes
    ref_experts = Experts(k, backbone.out_features, c).to(device)

    def bare(cls):
        obj = cls.__new__(cls)
        TrainerBase.__init__(obj)
        obj.device = device
        obj.batch_idx, obj.num_batches = 0, 10**9
        obj.num_source_domains, obj.num_classes = k, c
        obj.n_domain, obj.split_batch = k, args.per_domain
        obj.weight_u, obj.conf_thre = 0.5, args.conf_thre
        return obj

    def optim(m):
        return torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    ref = bare(Reference)
    ref.F, ref.E = copy.deepcopy(backbone), ref_experts
    ours = bare(DAELTrainer)
    ours.F = copy.deepcopy(backbone)
    ours.E = ExpertHeads(backbone.out_features, c, k).to(device).load_from_linears(ref_experts.linears)
    ours.hparams = DAELHparams(conf_thre=args.conf_thre)
    ours.algorithm = Core(ours.F, ours.E, ours.hparams, fuse_chunks=args.fuse)
    ours.is_da = True
    # What DAELTrainer.__init__ sets beside Dassl's machinery (divergence flag, config for PRINT_FREQ).
    from yacs.config import CfgNode as CN

    from dael_plugin.guard import FiniteGuard

    ours.guard, ours.bad_images = FiniteGuard(), set()
    ours.cfg = CN({"TRAIN": {"PRINT_FREQ": 10**9}, "OPTIM": {"LR": 0.01}})
    ours.output_dir = ""
    for t in (ref, ours):
        t.register_model("F", t.F, optim(t.F), None)
        t.register_model("E", t.E, optim(t.E), None)
        t.set_model_mode("train")
    return ref, ours


def make_batch(args):
    g = torch.Generator().manual_seed(1)
    n = args.domains * args.per_domain
    size = (3, args.size, args.size)
    batch_x = {
        "img": torch.randn((n,) + size, generator=g),
        "img2": torch.randn((n,) + size, generator=g),
        "label": torch.randint(0, args.classes, (n,), generator=g),
        "domain": torch.arange(args.domains).repeat_interleave(args.per_domain),
    }
    batch_u = {"img": torch.randn((args.target,) + size, generator=g),
               "img2": torch.randn((args.target,) + size, generator=g)}
    return batch_x, batch_u


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbone", default="cnn_digit5_m3sda", help="a Dassl backbone name (the paper's Digit-5 CNN)")
    p.add_argument("--domains", type=int, default=4)
    p.add_argument("--per-domain", type=int, default=32)
    p.add_argument("--target", type=int, default=32)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--conf-thre", type=float, default=0.0, help="0 keeps every pseudo-label (L_u fully active)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--no-fuse", dest="fuse", action="store_false",
                   help="one backbone call per domain chunk, as Dassl (default: the fused per-chunk-BN pass)")
    args = p.parse_args()

    import dael_plugin  # noqa: F401

    if not dael_plugin.HAS_DASSL:
        sys.exit("error: scripts/bench.py compares against Dassl's DAEL; install Dassl by hand (see README)")
    device = torch.device("cuda" if (args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())) else "cpu")
    ref, ours = make_trainers(args, device)
    batch_x, batch_u = make_batch(args)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step(t):
        torch.manual_seed(123)  # identical dropout masks for both
        sync()
        t0 = time.perf_counter()
        out = t.forward_backward(batch_x, batch_u)
        sync()
        return time.perf_counter() - t0, {k: float(v) for k, v in out.items()}

    # Same result first: one step each from identical weights.
    _, r = step(ref)
    _, o = step(ours)
    diff = max(abs(r[k] - o[k]) for k in ("loss_x", "loss_cr", "loss_u"))
    print(f"device: {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU, %d threads' % torch.get_num_threads()})")
    print(f"backbone: {args.backbone}; batch: {args.domains} domains x {args.per_domain} + {args.target} target; "
          f"{args.size}x{args.size}; plugin: {'fused per-chunk batch norm' if args.fuse else 'one call per chunk'}")
    print(f"losses ref {r['loss_x']:.5f}/{r['loss_cr']:.5f}/{r['loss_u']:.5f} "
          f"ours {o['loss_x']:.5f}/{o['loss_cr']:.5f}/{o['loss_u']:.5f} (max abs diff {diff:.2e})")
    for _ in range(args.warmup):
        step(ref)
        step(ours)
    t_ref, t_ours = [], []
    for i in range(args.repeats):
        # Alternate which goes first, so neither always follows the other.
        if i % 2:
            t_ours.append(step(ours)[0])
            t_ref.append(step(ref)[0])
        else:
            t_ref.append(step(ref)[0])
            t_ours.append(step(ours)[0])
    m_ref, m_ours = statistics.median(t_ref), statistics.median(t_ours)
    print(f"median step: dassl DAEL {m_ref * 1e3:.1f} ms, dael_plugin {m_ours * 1e3:.1f} ms ({args.repeats} repeats)")
    print(f"speedup_vs_dassl_dael: {m_ref / m_ours:.2f}")


if __name__ == "__main__":
    main()
