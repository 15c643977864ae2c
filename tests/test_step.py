"""The shared training step and its execution options, on CPU: each option
against the plain fp32 step, hand-worked meters and tallies."""

import copy

import pytest
import torch
from torch import nn

from dael_plugin.backbones import build_backbone
from dael_plugin.core import DAEL, DAELHparams, ExpertHeads
from dael_plugin.engine import execution as ex
from dael_plugin.engine.evaluate import ExpertTally
from dael_plugin.engine.step import DAELStep, DeviceMeters
from steps import strategy

# What the installed torch lacks is skipped with the reason, not failed (README: which torch runs what).
needs_cpu_fp16 = pytest.mark.skipif(
    not hasattr(torch.amp, "GradScaler"),
    reason=f"fp16 loss scaling on CPU needs torch >= 2.3 (this is {torch.__version__})",
)
needs_compiled_fused = pytest.mark.skipif(
    torch.__version__ < ex.COMPILE_FUSED_MIN_TORCH,
    reason=f"a compiled fused pass needs torch >= {ex.COMPILE_FUSED_MIN_TORCH}",
)
needs_cpu_fused = pytest.mark.skipif(
    not ex.supports_fused(torch.optim.SGD, "cpu"),
    reason=f"fused optimisers on CPU need torch >= 2.4 (this is {torch.__version__})",
)


def _batch(seed=0, per=8, size=32):
    g = torch.Generator().manual_seed(seed)
    n = 3 * per
    bx = {
        "img": torch.randn(n, 3, size, size, generator=g),
        "img2": torch.randn(n, 3, size, size, generator=g),
        "label": torch.randint(0, 10, (n,), generator=g),
        "domain": torch.arange(3).repeat_interleave(per),
    }
    bu = {"img": torch.randn(per, 3, size, size, generator=g), "img2": torch.randn(per, 3, size, size, generator=g)}
    return bx, bu


def _make(fuse=True, fused_optim=False, device_views=None, backbone="dael_small_cnn", **kw):
    torch.manual_seed(0)
    f = build_backbone(backbone)
    h = ExpertHeads(f.out_features, 10, 3)
    cl = kw.pop("channels_last", False)
    if cl:
        assert ex.use_channels_last(f, (3, 32, 32), torch.device("cpu"))
    opt = torch.optim.SGD(list(f.parameters()) + list(h.parameters()), lr=0.01, momentum=0.9, weight_decay=5e-4)
    if fused_optim:
        opt = ex.fused_optimizer(opt)
    alg = DAEL(f, h, DAELHparams(conf_thre=0.0), fuse_chunks=fuse)
    return DAELStep(alg, [opt], strategy(channels_last=cl, **kw), 3, 8, True, device_views), f, h


def _run(step, n=3):
    outs = []
    for i in range(n):
        torch.manual_seed(100 + i)
        outs.append({k: float(v) for k, v in step(*_batch(i)).items()})
    return outs


def _params_close(a, b, atol):
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(pb.float(), pa.float(), atol=atol, rtol=atol, msg=lambda m: f"{name}: {m}")


def test_step_equals_the_core_by_hand():
    step, f, h = _make(fuse=False)
    f2, h2 = copy.deepcopy(f), copy.deepcopy(h)
    alg = DAEL(f2, h2, DAELHparams(conf_thre=0.0), fuse_chunks=False)
    opt = torch.optim.SGD(list(f2.parameters()) + list(h2.parameters()), lr=0.01, momentum=0.9, weight_decay=5e-4)
    bx, bu = _batch(0)
    torch.manual_seed(1)
    out = step(bx, bu)
    torch.manual_seed(1)
    ref = alg.losses([bx["img"], bx["img2"]], bx["label"], bx["domain"], [8, 8, 8], [bu["img"], bu["img2"]])
    opt.zero_grad()
    ref["loss"].backward()
    opt.step()
    for k in out:
        assert float(out[k]) == pytest.approx(ref[k].item(), abs=1e-6), k
    _params_close(f2, f, 1e-6)
    assert set(out) == {"loss_x", "acc_x", "loss_cr", "loss_u", "mask_u"}


@pytest.mark.parametrize("option", ["fuse", "fused_optim", "channels_last"])
def test_each_fp32_option_keeps_the_numbers(option):
    base, fb, hb = _make(fuse=False)
    kw = {"fuse": option == "fuse", "fused_optim": option == "fused_optim", "channels_last": option == "channels_last"}
    other, fo, ho = _make(**kw)
    for a, b in zip(_run(base), _run(other)):
        for k in a:
            assert a[k] == pytest.approx(b[k], abs=1e-4), (option, k)
    _params_close(fb, fo, 1e-4)


@needs_compiled_fused
@pytest.mark.parametrize("impl,cl", [("split", False), ("grouped", False), ("grouped", True)])
def test_compiled_step_is_one_graph_and_the_same_numbers(impl, cl):
    # aot_eager compiles the same graph as inductor without a C++ build (fast on
    # CPU); fullgraph=True makes any host sync or other graph break an error.
    # grouped with channels_last is CUDA's default: the compiled form of its kernels is its own code.
    eager, fe, _ = _make(channels_last=cl)
    compiled, fc, _ = _make(compile_mode="default", compile_backend="aot_eager", channels_last=cl)
    eager.algorithm.chunk_bn = compiled.algorithm.chunk_bn = impl
    for a, b in zip(_run(eager), _run(compiled)):
        for k in a:
            assert a[k] == pytest.approx(b[k], abs=1e-5), k
    _params_close(fe, fc, 1e-5)


@pytest.mark.parametrize("prec", ["bf16", pytest.param("fp16", marks=needs_cpu_fp16)])
def test_low_precision_keeps_fp32_weights_and_close_losses(prec):
    """Three low-precision steps against fp32: the first losses close, the weights fp32, and the
    update after three steps the fp32 update (cosine > 0.95, norm within 5%). fp16's GradScaler
    skips the steps whose scaled gradients overflow (its first, at the initial scale 2^16): the
    fp32 reference then starts after the skipped steps, as the scaler's scale says how many."""
    import math

    def steps(step, start, stop):
        out = []
        for i in range(start, stop):
            torch.manual_seed(100 + i)
            out.append({k: float(v) for k, v in step(*_batch(i)).items()})
        return out

    _, f0, _ = _make()
    low, fl, _ = _make(prec=prec)
    b = steps(low, 0, 3)
    assert (low.scaler is not None) == (prec == "fp16")
    skipped = round(math.log2(65536.0 / low.scaler.get_scale())) if low.scaler is not None else 0
    assert skipped < 3, "every fp16 step overflowed"
    base, fb, _ = _make()
    a = steps(base, skipped, 3)
    if not skipped:
        for k in ("loss_x", "loss_cr", "loss_u"):
            assert b[0][k] == pytest.approx(a[0][k], rel=0.05, abs=0.02), k
    assert all(p.dtype == torch.float32 for p in fl.parameters())
    da = torch.cat([(p1 - p0).flatten() for p0, p1 in zip(f0.parameters(), fb.parameters())])
    db = torch.cat([(p1 - p0).flatten() for p0, p1 in zip(f0.parameters(), fl.parameters())])
    assert torch.nn.functional.cosine_similarity(da, db, 0).item() > 0.95
    assert db.norm().item() == pytest.approx(da.norm().item(), rel=0.05)


def test_channels_last_stops_before_a_view_of_the_feature_map_or_falls_back(capsys):
    class Flat(nn.Module):  # as Dassl's cnn_digit5_m3sda: .view on a conv map
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.fc = nn.Linear(4 * 64, 5)

        def forward(self, x):
            return self.fc(torch.relu(self.bn(self.conv(x))).view(x.shape[0], -1))

    torch.manual_seed(0)
    net = Flat()
    x = torch.randn(6, 3, 8, 8)
    ref = net(x)
    assert ex.use_channels_last(net, (3, 8, 8), torch.device("cpu"), "flat")
    out = capsys.readouterr().out
    assert out.count("CHANNELS_LAST for flat up to 'bn'") == 1
    assert net.conv.weight.is_contiguous(memory_format=torch.channels_last) and net.training
    torch.testing.assert_close(net(x.contiguous(memory_format=torch.channels_last)), ref, atol=1e-6, rtol=1e-6)

    class Raw(nn.Module):  # views its input: nothing can run in channels_last
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3 * 64, 5)

        def forward(self, x):
            return self.fc(x.view(x.shape[0], -1))

    raw = Raw()
    assert not ex.use_channels_last(raw, (3, 8, 8), torch.device("cpu"), "raw")
    out = capsys.readouterr().out
    assert out.count("CHANNELS_LAST is off for raw") == 1 and "view" in out
    good = build_backbone("dael_small_cnn")
    assert ex.use_channels_last(good, (3, 32, 32), torch.device("cpu"))
    assert good.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert capsys.readouterr().out == ""  # runs in channels_last as it is: nothing to say


@needs_cpu_fused
def test_fused_optimizer_matches_and_leaves_others_alone():
    torch.manual_seed(0)
    for cls, kw in (
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": True}),
        (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 1e-2}),
    ):
        m1 = nn.Linear(6, 4)
        m2 = copy.deepcopy(m1)
        o1, o2 = cls(m1.parameters(), **kw), ex.fused_optimizer(cls(m2.parameters(), **kw))
        assert o2.param_groups[0]["fused"] is True
        for _ in range(4):
            x = torch.randn(5, 6)
            for m, o in ((m1, o1), (m2, o2)):
                o.zero_grad()
                m(x).pow(2).sum().backward()
                o.step()
        _params_close(m1, m2, 1e-6)
    rms = torch.optim.RMSprop(nn.Linear(2, 2).parameters())
    assert ex.fused_optimizer(rms) is rms


def test_meters_read_last_and_mean_in_one_go():
    m = DeviceMeters()
    for v in (1.0, 2.0, 6.0):
        m.update({"a": torch.tensor(v), "b": torch.tensor(10 * v)})
    last, mean = m.read()
    assert last == {"a": 6.0, "b": 60.0} and mean == {"a": 3.0, "b": 30.0}
    assert DeviceMeters().read() == ({}, {})


def test_pseudo_label_accuracy_is_over_all_kept_labels():
    m = DeviceMeters()
    m.update({"mask_u": torch.tensor(0.5), "pl_hits_u": torch.tensor(1.0), "pl_kept_u": torch.tensor(2.0)})
    m.update({"mask_u": torch.tensor(1.0), "pl_hits_u": torch.tensor(3.0), "pl_kept_u": torch.tensor(4.0)})
    last, mean = m.read()
    assert last["pl_acc_u"] == pytest.approx(75.0) and mean["pl_acc_u"] == pytest.approx(100 * 4 / 6)
    assert "pl_hits_u" not in mean and mean["mask_u"] == 0.75
    # Through the step: a target batch with labels gives the counts; one without gives none.
    step, _, _ = _make()
    bx, bu = _batch(0)
    out = step(bx, bu)
    assert "pl_hits_u" not in out
    bu["label"] = torch.randint(0, 10, (8,))
    out = step(bx, bu)
    assert float(out["pl_kept_u"]) == 8.0 and 0.0 <= float(out["pl_hits_u"]) <= 8.0  # CONF_THRE 0 keeps all


def test_expert_tally_by_hand():
    t = ExpertTally()
    # Two samples, two experts, three classes; the ensemble is the probability mean.
    probs = torch.tensor([[[0.6, 0.3, 0.1], [0.1, 0.2, 0.7]], [[0.2, 0.5, 0.3], [0.1, 0.8, 0.1]]])
    ens = t.update(probs, torch.tensor([2, 1]))
    torch.testing.assert_close(ens, torch.tensor([[0.35, 0.25, 0.4], [0.15, 0.65, 0.2]]))
    assert t.expert_accuracy() == [50.0, 100.0]
    true, pred = t.labels()
    assert true.tolist() == [2, 1] and pred.tolist() == [2, 1]
    t.update(torch.tensor([[[0.1, 0.1, 0.8], [0.7, 0.2, 0.1]]]), torch.tensor([1]))  # ensemble says 2: wrong
    per = t.per_class(["zero", "one", "two"], ["a", "b"])
    assert per == {
        "ensemble": {"one": 50.0, "two": 100.0},
        "a": {"one": 50.0, "two": 0.0},
        "b": {"one": 50.0, "two": 100.0},
    }
    # Dassl's VLCS, CIFARSTL and DigitSingle name every class "": the classes are then their labels,
    # not one "" entry holding the last class's figure
    assert t.per_class(["", "", ""])["ensemble"] == {"1": 50.0, "2": 100.0}
    assert t.per_class(["x", "y", "x"])["ensemble"] == {"1": 50.0, "2": 100.0}  # two classes of one name


@pytest.mark.parametrize(
    "key,value,msg",
    [
        ("PREC", "fp8", "PREC='fp8' is invalid"),
        ("COMPILE", "max", "COMPILE='max' is invalid"),
        ("CHUNK_BN", "fast", "CHUNK_BN='fast' is invalid"),
    ],
)
def test_bad_execution_keys_are_one_line(tmp_path, tiny_root, capsys, key, value, msg):
    from test_hardening import args_for, cli, one_error_line

    code, _, err = cli(args_for(tiny_root, tmp_path / "o", extra=[f"TRAINER.DAEL.{key}", value]), capsys)
    assert code == 2 and msg in one_error_line(err)


def test_a_checkpoint_from_before_the_execution_keys_resumes_with_their_old_behaviour():
    from dael_plugin import add_dael_config
    from dael_plugin.config.defaults import get_builtin_cfg
    from dael_plugin.config.execution import resolve_execution
    from dael_plugin.engine.checkpoint import config_diff

    cfg = add_dael_config(get_builtin_cfg())
    cfg.TRAINER.NAME = "DAEL"
    same = cfg.clone()
    old = cfg.clone()
    old.defrost()
    del old["EXECUTION"]
    for node in ("DAEL", "DAELDG"):  # what a 0.2 checkpoint's config holds
        for key in ("CHUNK_BN", "PREC", "CHANNELS_LAST", "COMPILE", "FUSED_OPTIM", "AUG_ON_DEVICE"):
            del old.TRAINER[node][key]
        old.TRAINER[node].FUSE_CHUNKS = False
    resolve_execution(cfg)  # as every run's config is, before it is frozen
    diff = {k: (a, b) for k, a, b in config_diff(old.dump(), cfg)}
    # The new defaults differ from what 0.2 did, and the message says what 0.2 did.
    # (The keys are EXECUTION's now; TRAINER.DAEL.* is their older spelling.)
    assert diff["EXECUTION.CHANNELS_LAST"] == (False, True)
    assert diff["EXECUTION.FUSED_OPTIM"] == (False, True)
    assert diff["EXECUTION.FUSE_CHUNKS"] == (False, True)
    assert "EXECUTION.PREC" not in diff and "EXECUTION.COMPILE" not in diff
    for node in ("DAEL", "DAELDG"):
        same.TRAINER[node].CHANNELS_LAST = False
        same.TRAINER[node].FUSED_OPTIM = False
        same.TRAINER[node].FUSE_CHUNKS = False
    resolve_execution(same)
    assert config_diff(old.dump(), same) == []  # so that run resumes


# Every layout and setting in the default mode; reduce-overhead once, at CUDA's default layout: with
# a stand-in backend the mode changes no guard (its CUDA graphs are inductor's), so the other
# seven reduce-overhead cases repeated these (30 s of the suite).
COMPILE_CASES = [
    ("default", s, i) for s in ("DA", "DG") for i in ("split", "grouped", "chunked", "grouped, channels_last")
] + [("reduce-overhead", "DA", "grouped, channels_last")]


@pytest.mark.parametrize("mode,setting,impl", COMPILE_CASES)
def test_a_compiled_step_compiles_once_for_the_whole_run(mode, setting, impl):
    """Dynamo calls the backend once per (re)compilation; five steps must make one call. The
    guards that would fail, and so recompile, are dynamo's, whatever the backend and mode, so the
    backend is ``eager``: dynamo's graph run as it is (40% less CPU than aot_eager over these
    cases). AOT autograd's trace of the step, backward included, is held by
    test_compiled_step_is_one_graph_and_the_same_numbers and the contract's compiled steps. ``grouped,
    channels_last`` is CUDA's default: the grouped kernels' chunk views of a channels_last batch
    are not contiguous, and dynamo refuses a non-contiguous ``out=`` (the H200's first compiled run)."""
    calls = []

    def backend(gm, example_inputs, **kwargs):
        calls.append(len(gm.graph.nodes))
        return torch._dynamo.lookup_backend("eager")(gm, example_inputs)

    torch._dynamo.reset()
    cl = impl.endswith("channels_last")
    impl = impl.split(",")[0]
    step, f, h = _make(fuse=impl != "chunked", compile_mode=mode, compile_backend=backend, channels_last=cl)
    step.algorithm.chunk_bn = impl if impl != "chunked" else "auto"
    step.is_da = setting == "DA"
    for i in range(5):
        bx, bu = _batch(i)
        step(bx, bu if setting == "DA" else None)
    assert len(calls) == 1, f"{len(calls)} compilations in 5 steps"


PAPER_WEAK = ["random_flip", "random_translation", "normalize"]  # miniDomainNet (Appendix A)
PAPER_STRONG = ["random_flip", "cutout", "randaugment2", "normalize"]


def _paper_views():
    from yacs.config import CfgNode as CN

    from dael_plugin.config.defaults import get_builtin_cfg
    from dael_plugin.transforms.device import DeviceViews

    cfg = get_builtin_cfg()
    cfg.INPUT.SIZE = (32, 32)
    return DeviceViews(
        PAPER_WEAK, PAPER_STRONG, 2, cfg.INPUT, CN({"STRONG_TRANSFORMS": PAPER_STRONG}), device="cpu", size=(32, 32)
    )


def _u8_batch(seed, per=8):
    bx, bu = _batch(seed, per)
    g = torch.Generator().manual_seed(seed)
    bx["img"] = torch.randint(0, 256, bx["img"].shape, dtype=torch.uint8, generator=g)
    bu["img"] = torch.randint(0, 256, bu["img"].shape, dtype=torch.uint8, generator=g)
    del bx["img2"], bu["img2"]
    return bx, bu


EXECUTION = {  # each execution option away from the defaults, and the paper's views on the device
    "defaults": {},
    "grouped batch norm": {"chunk_bn": "grouped"},
    "one call per chunk": {"fuse": False},
    "plain optimiser": {"fused_optim": False},
    "default layout": {"channels_last": False},
    "bf16": {"prec": "bf16"},
    "fp16": {"prec": "fp16"},
    "views on the device": {"aug": True},
    "views on the device, grouped, bf16": {"aug": True, "chunk_bn": "grouped", "prec": "bf16"},
    "compiled, views on the device": {"aug": True, "compile_mode": "default", "compile_backend": "aot_eager"},
    "domain generalisation": {"dg": True},
    "fp16, plain optimiser": {"prec": "fp16", "fused_optim": False},
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=needs_cpu_fp16) if "fp16" in n else n for n in EXECUTION])
def test_no_step_reads_the_device_or_copies_a_python_value(name):
    """On a GPU, any host read of a tensor (item, bool, tolist, ...) or Python value turned into a
    tensor in a step makes the host wait for the device. dael_plugin.engine.profiling.HostTraffic sees them
    on CPU. The one read left is PyTorch's: GradScaler.step reads found_inf once per optimiser
    unless the optimiser is fused (FUSED_OPTIM True, the default)."""
    from dael_plugin.engine.profiling import HostTraffic

    opts = dict(EXECUTION[name])
    aug, dg, impl = opts.pop("aug", False), opts.pop("dg", False), opts.pop("chunk_bn", "auto")
    opts.setdefault("fused_optim", True)
    opts.setdefault("channels_last", True)
    torch._dynamo.reset()
    step, f, h = _make(**opts, device_views=_paper_views() if aug else None)
    step.algorithm.chunk_bn = impl
    step.is_da = not dg
    batches = [(_u8_batch(i) if aug else _batch(i)) for i in range(3)]
    step(*batches[0])  # warm-up: compilation, lazy initialisation
    for bx, bu in batches[1:]:
        if step.compiled:
            # torch.compile runs no graph under a Python dispatch mode. With fullgraph=True a
            # host read or a Python value made a tensor in the forward, losses or views would
            # be a graph break, which is an error; the rest of the step is the eager cases'.
            out = step(bx, bu)
            continue
        with HostTraffic(allow=[bx["domain"]]) as traffic:
            out = step(bx, bu)
        expected = (
            ["host read: aten._local_scalar_dense (item, bool, int or float)"]
            if name == "fp16, plain optimiser"
            else []
        )
        assert traffic.events == expected
    assert all(torch.isfinite(v).all() for v in out.values())


@needs_cpu_fp16
@needs_cpu_fused
def test_fused_sgd_survives_a_first_step_the_loss_scaler_skips():
    """PyTorch's fused SGD makes its momentum buffers with empty_like on its first step; when fp16's
    scaler skips that step (found_inf), the kernel returns early and the garbage stays. The plugin
    makes the buffers as zeros first: the run then equals the plain optimiser's, step for step."""
    results = []
    for fused in (False, True):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(6, 5))
        opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=5e-4)
        if fused:
            opt = ex.fused_optimizer(opt, loss_scaling=True)
            assert opt.defaults.get("fused")
        scaler = torch.amp.GradScaler("cpu")
        for scale in (float("inf"), 1.0, 2.0, 1.0):  # the first step overflows and is skipped
            opt.zero_grad()
            scaler.scale((w * scale).pow(2).sum()).backward()
            scaler.step(opt)
            scaler.update()
        results.append(w.detach().clone())
    assert torch.isfinite(results[1]).all()
    torch.testing.assert_close(results[1], results[0], atol=1e-6, rtol=1e-6)


def test_cuda_settings_follow_use_tf32(monkeypatch, capsys):
    """On CUDA (faked here; tests/test_gpu.py checks a real one): cudnn.benchmark, and TF32 unless
    USE_TF32 False. Without CUDA nothing is touched."""
    from yacs.config import CfgNode as CN

    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    try:
        torch.backends.cudnn.benchmark = False
        ex.cuda_settings(CN({"USE_CUDA": True, "USE_TF32": True}))
        assert torch.backends.cudnn.benchmark is False  # no GPU here: untouched
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        ex.cuda_settings(CN({"USE_CUDA": True, "USE_TF32": True}))
        assert torch.backends.cudnn.benchmark and torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "high"
        ex.cuda_settings(CN({"USE_CUDA": True, "USE_TF32": False}))
        assert not torch.backends.cudnn.allow_tf32 and torch.get_float32_matmul_precision() == "highest"
        assert "TF32 off" in capsys.readouterr().out
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def test_a_compiled_fused_pass_is_refused_on_a_torch_that_compiles_it_wrong(monkeypatch):
    from torch.torch_version import TorchVersion

    from dael_plugin.errors import DAELConfigError

    ex.check_execution("fp32", "default", "TRAINER.DAEL", fuse_chunks=True)  # this torch
    monkeypatch.setattr(torch, "__version__", TorchVersion("2.4.1"))
    with pytest.raises(DAELConfigError, match="needs torch >= 2.5.*FUSE_CHUNKS False"):
        ex.check_execution("fp32", "default", "TRAINER.DAEL", fuse_chunks=True)
    ex.check_execution("fp32", "default", "TRAINER.DAEL", fuse_chunks=False)  # per-chunk calls compile right


def test_a_backbone_that_draws_in_python_is_refused_a_compiled_step():
    """Dassl's MixStyle decides in Python whether it mixes (``random.random() > p``): a fullgraph
    compile of DAEL's step cannot hold that branch (dynamo raised "Data-dependent branching" at the
    first step, a traceback), so it is one line at build; uncompiled, the step runs (per chunk)."""
    from dael_plugin.errors import DAELConfigError

    with pytest.raises(DAELConfigError, match="the backbone's MixStyle layer draws in Python whether it mixes"):
        _make(backbone="resnet18_ms_l123", compile_mode="default", compile_backend="aot_eager")
    step, _, _ = _make(backbone="resnet18_ms_l123")
    assert not step.algorithm.fuse_chunks
    assert torch.isfinite(torch.as_tensor(float(step(*_batch())["loss_x"])))
