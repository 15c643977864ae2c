"""A worker for tests/test_distributed.py: three DAEL steps on fixed batches, on one process
(``python tests/ddp_worker.py``) or under ``torchrun --nproc_per_node N``. Each process takes
its shard of every domain chunk and of the target batch, as the engines' samplers do, and
rank 0 saves the per-step losses (averaged over the processes), the gradients after each step,
and the final parameters and batch-norm buffers."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dael_plugin.backbones.small_cnn import SmallCNN  # noqa: E402
from dael_plugin.core import DAEL, DAELHparams, build_heads  # noqa: E402
from dael_plugin.core.chunk_norm import set_sync  # noqa: E402
from dael_plugin.engine import distributed  # noqa: E402
from dael_plugin.engine.step import DAELStep  # noqa: E402
from steps import strategy  # noqa: E402


def shard(t: torch.Tensor, chunk: int, rank: int, world: int) -> torch.Tensor:
    n = chunk // world
    return torch.cat([t[s + rank * n : s + (rank + 1) * n] for s in range(0, t.shape[0], chunk)])


def run(args, w, setting: str, fuse: int, chunk_bn: str, out_path: str) -> None:
    torch.manual_seed(0)
    k, c = 3, 5
    backbone = SmallCNN()
    heads = build_heads(backbone.out_features, c, k, DAELHparams())
    hp = DAELHparams(conf_thre=0.0)  # every pseudo-label kept: L_u is exercised from the first step
    mask = None
    if setting == "da-cs":  # category shift: each source holds a subset of the classes, every part on
        hp = DAELHparams(conf_thre=0.0, class_masks=("all",))
        mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [1, 0, 0, 1, 1]], dtype=torch.bool)
    algo = DAEL(backbone, heads, hp, fuse_chunks=bool(fuse), chunk_bn=chunk_bn, class_mask=mask)
    model = torch.nn.ModuleList([backbone, heads])
    if w.distributed:
        set_sync(model, distributed.device_group(), w.size)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    is_da = setting in ("da", "da-cs")
    if args.channels_last:
        backbone.to(memory_format=torch.channels_last)
    how = strategy("cpu", args.prec, args.compile, bool(args.channels_last), args.compile_backend)
    step = DAELStep(algo, [opt], how, k, args.per_domain // w.size, is_da)
    g = torch.Generator().manual_seed(args.data_seed)
    held = mask if mask is not None else torch.ones(k, c, dtype=torch.bool)
    record = {"loss": [], "grads": [], "parts": []}
    for _ in range(args.steps):
        n = k * args.per_domain
        batch_x = {
            "img": torch.randn(n, 3, args.size, args.size, generator=g),
            "img2": torch.randn(n, 3, args.size, args.size, generator=g),
            # each domain's labels among its own classes (all of them without category shift)
            "label": torch.multinomial(held.float(), args.per_domain, replacement=True, generator=g).flatten(),
            "domain": torch.arange(k).repeat_interleave(args.per_domain),
        }
        batch_u = {
            "img": torch.randn(args.batch_u, 3, args.size, args.size, generator=g),
            "img2": torch.randn(args.batch_u, 3, args.size, args.size, generator=g),
        }
        batch_x = {key: shard(v, args.per_domain, w.rank, w.size) for key, v in batch_x.items()}
        batch_u = {key: shard(v, args.batch_u, w.rank, w.size) for key, v in batch_u.items()}
        out = step(batch_x, batch_u if is_da else None)
        keys = sorted(out)
        record["parts"].append({key: float(distributed.mean_over_processes(out[key])) for key in keys})
        record["loss"].append(
            record["parts"][-1]["loss_x"]
            + record["parts"][-1]["loss_cr"]
            + hp.weight_u * record["parts"][-1].get("loss_u", 0.0)
        )
        record["grads"].append({name: q.grad.clone() for name, q in model.named_parameters() if q.grad is not None})
    record["state"] = {key: v.clone() for key, v in model.state_dict().items()}
    states = distributed.gather_objects(record["state"])
    record["same_on_every_rank"] = all(all(torch.equal(s[key], states[0][key]) for key in s) for s in states)
    if w.is_main:
        torch.save(record, out_path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--setting", choices=("da", "dg", "da-cs"), default="da")
    p.add_argument("--fuse", type=int, default=1)
    p.add_argument("--chunk-bn", default="split")
    p.add_argument("--per-domain", type=int, default=4)
    p.add_argument("--batch-u", type=int, default=6)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--data-seed", type=int, default=1)
    p.add_argument("--prec", default="fp32")
    p.add_argument("--compile", default="none")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--channels-last", type=int, default=0)
    p.add_argument(
        "--case",
        action="append",
        help="SETTING:FUSE:CHUNK_BN[,OPTION=VALUE...] (options: prec, steps, compile, compile_backend), "
        "repeatable (outputs OUT.0, OUT.1, ...)",
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    w = distributed.init(use_cuda=False)
    cases = args.case or [f"{args.setting}:{args.fuse}:{args.chunk_bn}"]
    for i, case in enumerate(cases):  # several cases in one launch: one process start for all
        spec, *options = case.split(",")
        setting, fuse, chunk_bn = spec.split(":")
        over = dict(o.split("=", 1) for o in options)
        unknown = set(over) - {"prec", "steps", "compile", "compile_backend"}
        if unknown:
            raise SystemExit(f"unknown case option(s) {sorted(unknown)} in {case!r}")
        case_args = argparse.Namespace(**{**vars(args), **over})
        case_args.steps = int(case_args.steps)
        out = args.out if len(cases) == 1 else f"{args.out}.{i}"
        run(case_args, w, setting, int(fuse), chunk_bn, out)
    distributed.finish()


if __name__ == "__main__":
    main()
