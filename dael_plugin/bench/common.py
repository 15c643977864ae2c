"""What the benchmarks share: the two shapes, Dassl's DAEL and the plugin as step runners on one
synthetic batch from the same initial weights, and the execution configurations in the order
they are switched on."""

from __future__ import annotations

import torch

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
        from dael_plugin.config.execution import Execution
        from dael_plugin.core import DAEL, DAELHparams, ExpertHeads
        from dael_plugin.engine.execution import channels_last_reason, patch_embedding_only
        from dael_plugin.engine.step import DAELStep
        from dael_plugin.engine.strategy import Strategy

        self.name = name
        self.F = backbone
        self.E = ExpertHeads(backbone.out_features, c, K).to(device)
        if heads_init is not None:
            self.E.load_from_linears(heads_init.linears)
        self.note = ""
        if channels_last and patch_embedding_only(self.F):  # as the runs decide (a ViT: skipped)
            channels_last, self.note = False, "channels_last n/a: the only convolution is a patch embedding"
        if channels_last:
            reason = channels_last_reason(self.F, (3, size, size), device)
            if reason is not None:
                channels_last, self.note = False, "channels_last n/a: " + reason[:60]
            elif getattr(self.F, "_dael_channels_last_boundary", None):
                self.note = f"channels_last up to {self.F._dael_channels_last_boundary}: the backbone .views after it"
        alg = DAEL(self.F, self.E, DAELHparams(conf_thre=0.0), fuse_chunks=fuse, chunk_bn=chunk_bn)
        opts = [_sgd(self.F.parameters(), fused_optim, foreach), _sgd(self.E.parameters(), fused_optim, foreach)]
        how = Strategy(Execution(prec=prec, compile=compile_mode), device, channels_last)
        self.step = DAELStep(alg, opts, how, K, per_domain, True, views)
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
