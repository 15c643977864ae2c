"""The GPU and NCCL paths on CPU, through stand-ins, so that CI catches what a first GPU run would hit.

Stand-ins, and what each cannot see:

- **A ``cuda:gloo`` default group** (``DAEL_DIST_BACKEND=cuda:gloo``): it refuses CPU tensors, as
  NCCL's group does. A host flag or object sent through the default group fails here as on GPUs
  (every torchrun test in ``test_distributed.py`` runs under it too). It cannot see NCCL itself:
  its streams, its timeouts under load, or collectives captured in CUDA graphs.
- **The ``meta`` device** stands in for a training device that is not the CPU: a checkpoint read
  onto it, and any CPU tensor mixed with a device tensor (meta, like CUDA, takes only 0-dim CPU
  tensors). It holds no values, so nothing numeric is checked on it.
- **FakeTensorMode** holds fake CUDA tensors: a step's forward pass and losses with CUDA's
  defaults (``grouped`` batch norm chosen by ``auto``, ``channels_last``, the fused optimiser
  chosen), every tensor checked to be on CUDA, any CPU/CUDA mix raising. It cannot run a backward
  pass (autograd needs a CUDA context), autocast (disabled without CUDA), fused or cuDNN kernels,
  pinned memory, or real synchronisation; ``scripts/gpu_bench.sh`` runs those on a GPU.

The step's host-side check of the domain chunks reads the loader's CPU tensors with NumPy, which a
fake tensor cannot do; under FakeTensorMode it runs outside the mode, as it runs on the host.
"""

import os
import subprocess
import textwrap

import pytest
import torch

from conftest import ROOT
from steps import strategy

DS = os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml")
CFG = os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml")


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env["DAEL_DIST_TIMEOUT"] = "60"
    env.update(extra)
    return env


# -- a group that serves CUDA only --------------------------------------------------------------
COLLECTIVES = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from dael_plugin.engine import distributed
    from dael_plugin.engine.checkpoint import gather_rng
    from dael_plugin.engine.evaluate import ExpertTally, _sum_over_processes

    w = distributed.init(use_cuda=False)
    assert w.distributed and w.size == 2
    try:  # the stand-in is live: the default group refuses a CPU tensor, as NCCL's does
        dist.all_reduce(torch.ones(1))
        raise SystemExit("the default group took a CPU tensor")
    except RuntimeError as exc:
        assert "cpu" in str(exc).lower(), exc
    assert distributed.any_true(w.rank == 1) and not distributed.any_true(False)
    assert distributed.gather_objects(w.rank * 10) == [0, 10]
    assert distributed.from_main({"rank": w.rank}) == {"rank": 0}
    distributed.barrier()
    mean = distributed.mean_over_processes(torch.tensor([float(w.rank)]))  # the device group
    assert mean.item() == 0.5, mean
    assert len(gather_rng()) == 2
    tally = ExpertTally()
    tally.update(torch.eye(3)[[w.rank]].unsqueeze(1), torch.tensor([w.rank]))
    assert tally.gathered().total == 2 and _sum_over_processes(1) == 2
    print("collectives ok")  # rank 1's stdout is quiet until finish()
    distributed.finish()
    """
)


def test_host_values_never_go_through_a_group_that_serves_cuda_only(tmp_path):
    """Every host exchange of the engines (the divergence flag, objects, barriers, the evaluation
    tallies, the RNG states) under a default group that refuses CPU tensors, as NCCL's does."""
    script = tmp_path / "collectives.py"
    script.write_text(COLLECTIVES)
    from test_distributed import launcher

    cmd = launcher(fork=True) + ["--standalone", "--nproc_per_node", "2", str(script)]
    out = subprocess.run(cmd, cwd=ROOT, env=_env(DAEL_DIST_BACKEND="cuda:gloo"), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("collectives ok") == 1  # rank 1 prints nothing on stdout


def test_torchrun_of_one_process_is_a_process_group(monkeypatch):
    """``torchrun --nproc_per_node 1`` runs the several-GPU path (NCCL, DDP, synchronised batch
    norm) on one GPU; a plain ``python`` run does not."""
    from dael_plugin.engine import distributed

    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    assert not distributed.from_env().distributed
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert not distributed.from_env().distributed  # torch.distributed's variables alone: one process
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    w = distributed.from_env()
    assert w.distributed and w.size == 1 and w.is_main


# -- a checkpoint read onto a device that is not the CPU --------------------------------------------
def _cfg(tmp_path, root, engine, epochs=1):
    from dael_plugin.tools.train import build_parser, setup_cfg

    args = build_parser().parse_args(
        ["--engine", engine, "--trainer", "DAEL", "--root", root, "--dataset-config-file", DS]
        + ["--config-file", CFG, "--source-domains", "hand", "street", "font", "--target-domains", "blend"]
        + ["--output-dir", str(tmp_path), "--seed", "1", "OPTIM.MAX_EPOCH", str(epochs)]
        + ["DATALOADER.NUM_WORKERS", "0", "DATALOADER.TRAIN_X.BATCH_SIZE", "24", "DATALOADER.TRAIN_U.BATCH_SIZE", "8"]
        + ["SELECTION.EVAL_FREQ", "0"]  # no records unless a test turns them on (tests/test_selection.py)
    )
    return setup_cfg(args, engine)


def _trainer(engine, cfg):
    """``engine``'s DAEL trainer for ``cfg``, built after seeding as train.py seeds (seed 1)."""
    if engine == "builtin":
        from dael_plugin.engine.trainer import set_random_seed
        from dael_plugin.methods import build_trainer

        set_random_seed(1)
        return build_trainer(cfg)
    from dassl.utils import set_random_seed

    from dael_plugin.dassl_adapter import DAELTrainer

    set_random_seed(1)
    return DAELTrainer(cfg)


def _meta_rng_guard(monkeypatch):
    """``torch.set_rng_state`` and friends take CPU tensors only; a checkpoint mapped onto the
    training device hands them device tensors (on CUDA: ``TypeError: RNG state must be a
    torch.ByteTensor``)."""
    real = torch.set_rng_state

    def set_rng_state(state):
        assert state.device.type == "cpu", f"RNG state on {state.device}"
        real(state)

    monkeypatch.setattr(torch, "set_rng_state", set_rng_state)


def test_builtin_resume_onto_another_device_keeps_host_states_on_the_cpu(tmp_path, tiny_root, monkeypatch):
    from dael_plugin.engine.trainer import set_random_seed
    from dael_plugin.methods import build_trainer

    set_random_seed(1)
    tr = build_trainer(_cfg(tmp_path, tiny_root, "builtin"))
    tr.train()
    set_random_seed(1)
    again = build_trainer(_cfg(tmp_path, tiny_root, "builtin", epochs=2))
    again.cfg.defrost()
    again.cfg.OPTIM.MAX_EPOCH = 1  # the checkpoint's settings (a resume refuses another schedule)
    again.device = torch.device("meta")  # stands in for cuda: nothing may be mapped onto it
    _meta_rng_guard(monkeypatch)
    assert again.resume_if_exists() == 1
    for loader in again._loaders():  # the generators' states stayed CPU ByteTensors
        assert loader.generator.get_state().device.type == "cpu"


@pytest.mark.dassl
def test_dassl_resume_onto_another_device_keeps_host_states_on_the_cpu(tmp_path, tiny_root, monkeypatch):
    pytest.importorskip("dassl")
    from dael_plugin.dassl_adapter import DAELTrainer

    cfg = _cfg(tmp_path, tiny_root, "dassl")
    DAELTrainer(cfg).train()
    again = DAELTrainer(cfg)
    again.device = again.method.device = torch.device("meta")  # Dassl's trainer and the method it hosts
    _meta_rng_guard(monkeypatch)
    assert again.resume_model_if_exist(cfg.OUTPUT_DIR) == 1


# -- synchronised batch norm in evaluation -------------------------------------------------------
def test_synchronised_batch_norm_makes_no_collective_in_evaluation():
    """A layer without running statistics normalises with batch statistics in evaluation too; it
    must do so per process, as torch's SyncBatchNorm does: the shards of a test set can differ by a
    batch, and one rank's extra collective would hang the others."""
    from dael_plugin.core.chunk_norm import set_sync

    class NoGroup:  # any collective on it fails: torch.distributed is not even initialised
        pass

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, track_running_stats=False))
    set_sync(net, NoGroup(), 2)
    x = torch.randn(6, 3, 8, 8)
    net.eval()
    with torch.no_grad():
        y = net(x)
    ref = torch.nn.functional.batch_norm(net[0](x), None, None, net[1].weight, net[1].bias, True, 0.0, net[1].eps)
    torch.testing.assert_close(y, ref)
    net.train()
    with pytest.raises((RuntimeError, ValueError, AttributeError, TypeError)):
        net(x)  # in training it does synchronise (the collective fails on this non-group)


# -- SGD with dampening ----------------------------------------------------------------------------
@pytest.mark.parametrize("dampening", [0.0, 0.5])
def test_fused_sgd_steps_as_pytorchs_plain_sgd(dampening):
    """The first step with dampening is ``g`` (PyTorch stores ``g`` in a new momentum buffer), not
    ``(1 - dampening) * g``; three steps equal the plain optimiser's."""
    from dael_plugin.engine.execution import fused_optimizer

    ps = [torch.nn.Parameter(torch.zeros(3)) for _ in range(2)]
    kw = dict(lr=1.0, momentum=0.9, dampening=dampening)
    plain, fused = torch.optim.SGD([ps[0]], **kw), fused_optimizer(torch.optim.SGD([ps[1]], **kw))
    assert fused.defaults.get("fused") or fused.param_groups[0].get("fused")
    for step in range(3):
        for p, opt in ((ps[0], plain), (ps[1], fused)):
            p.grad = torch.full((3,), float(step + 1))
            opt.step()
        if step == 0:
            assert ps[1][0].item() == -1.0
        torch.testing.assert_close(ps[1], ps[0], rtol=0, atol=1e-6)


# -- reduce-overhead under torchrun ----------------------------------------------------------------
def test_reduce_overhead_under_torchrun_is_refused_in_one_line(monkeypatch):
    from dael_plugin.backbones.small_cnn import SmallCNN
    from dael_plugin.core import DAEL, DAELHparams, build_heads
    from dael_plugin.engine import distributed
    from dael_plugin.engine.step import DAELStep
    from dael_plugin.errors import DAELConfigError

    net = SmallCNN()
    algo = DAEL(net, build_heads(net.out_features, 4, 2, DAELHparams()), DAELHparams())
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    monkeypatch.setattr(distributed, "_WORLD", distributed.World(0, 2, 0, True))
    with pytest.raises(DAELConfigError, match="reduce-overhead is refused under torchrun"):
        DAELStep(algo, [opt], strategy(compile_mode="reduce-overhead"), 2, 4, True)


# -- a step on devices that are not the CPU --------------------------------------------------------
def _batches(k=3, n=4, c=5, size=32):
    g = torch.Generator().manual_seed(0)
    x = {
        "img": torch.randn(k * n, 3, size, size, generator=g),
        "img2": torch.randn(k * n, 3, size, size, generator=g),
        "label": torch.randint(0, c, (k * n,), generator=g),
        "domain": torch.arange(k).repeat_interleave(n),
    }
    u = {"img": torch.randn(n, 3, size, size, generator=g), "img2": torch.randn(n, 3, size, size, generator=g)}
    return x, u


def _model(k=3, c=5):
    from dael_plugin.backbones.small_cnn import SmallCNN
    from dael_plugin.core import DAELHparams, build_heads

    net = SmallCNN()
    return net, build_heads(net.out_features, c, k, DAELHparams(conf_thre=0.0))


CS_MASK = [[1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [1, 0, 0, 1, 1]]  # category shift: each source's classes
SETTINGS = ["da", "dg", "da-cs", "da-cs-other", "da-cs-agree", "da-cs-other-corroborate"]


def _cs(setting, dev):
    """DAEL's hparams and class mask for ``setting`` ("da-cs": category shift, CLASS_MASKS all;
    "da-cs-other": CLASS_MASKS other,ensemble,pseudo_label; "-agree" / "-corroborate": with that
    PSEUDO_LABEL rule and the class-balanced L_u)."""
    from dael_plugin.core import DAELHparams

    if not setting.startswith("da-cs"):
        return DAELHparams(conf_thre=0.0), None
    parts = ("other", "ensemble", "pseudo_label") if setting.startswith("da-cs-other") else ("all",)
    rule = setting.split("-")[-1]
    rules = dict(pseudo_label=rule, u_balance=True) if rule in ("agree", "corroborate") else {}
    hp = DAELHparams(conf_thre=0.0, class_masks=parts, **rules)
    return hp, torch.tensor(CS_MASK, dtype=torch.bool, device=dev)


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_step_on_the_meta_device_mixes_no_cpu_tensor(setting):
    """Forward, backward and the optimiser step with every tensor on a non-CPU device (meta), the
    views moved there by the step, the grouped batch norm and channels_last: any CPU tensor in the
    device math raises."""
    from dael_plugin.core import DAEL
    from dael_plugin.engine.step import DAELStep

    dev = torch.device("meta")
    net, heads = _model()
    net.to(dev).to(memory_format=torch.channels_last)
    heads.to(dev)
    hp, mask = _cs(setting, dev)
    algo = DAEL(net, heads, hp, fuse_chunks=True, chunk_bn="grouped", class_mask=mask)
    opt = torch.optim.SGD(list(net.parameters()) + list(heads.parameters()), lr=0.1, momentum=0.9)
    da = setting != "dg"
    step = DAELStep(algo, [opt], strategy(dev, channels_last=True), 3, 4, da)
    x, u = _batches()
    out = step(x, u if da else None)
    assert all(v.device.type == "meta" for v in out.values())
    assert ("loss_u" in out) == da
    assert ("loss_other" in out) == setting.startswith("da-cs-other")  # part other's term, on the device too
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in net.parameters())


@pytest.mark.dassl
@pytest.mark.parametrize("setting", ["da", "dg"])
def test_the_dassl_engines_dael_model_steps_on_the_meta_device_mixing_no_cpu_tensor(setting):
    """The Dassl engine's DAEL as it builds its model (dassl_adapter/trainer.DasslsDAEL): Dassl's
    ``SimpleNet`` F over a Dassl backbone with an MLP head (``MODEL.HEAD``), and an optimiser each
    for F and E from Dassl's ``build_optimizer`` (``OPTIM.STAGED_LR`` on), on a non-CPU device."""
    pytest.importorskip("dassl")
    from dassl.config import get_cfg_default
    from dassl.engine.trainer import SimpleNet
    from dassl.optim import build_optimizer

    from dael_plugin.core import DAEL, build_heads
    from dael_plugin.dassl_adapter.trainer import _expert_optim_args
    from dael_plugin.engine.step import DAELStep

    cfg = get_cfg_default()
    cfg.merge_from_list(["MODEL.BACKBONE.NAME", "cnn_digitsingle", "MODEL.HEAD.NAME", "mlp",
                         "MODEL.HEAD.HIDDEN_LAYERS", [32], "OPTIM.STAGED_LR", True, "OPTIM.NEW_LAYERS", ["head"]])  # fmt: skip
    dev = torch.device("meta")
    net = SimpleNet(cfg, cfg.MODEL, 0).to(dev).to(memory_format=torch.channels_last)
    heads = build_heads(net.fdim, 5, 3, _cs("da", dev)[0]).to(dev)
    algo = DAEL(net, heads, _cs("da", dev)[0], fuse_chunks=True, chunk_bn="grouped")
    optims = [build_optimizer(net, cfg.OPTIM), build_optimizer(heads, *_expert_optim_args(heads, cfg.OPTIM))]
    assert len(optims[0].param_groups) == 2  # the staged rates: the backbone's and the head's
    x, u = _batches()
    da = setting == "da"
    out = DAELStep(algo, optims, strategy(dev, channels_last=True), 3, 4, da)(x, u if da else None)
    assert all(v.device.type == "meta" for v in out.values()) and ("loss_u" in out) == da
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in [*net.parameters(), *heads.parameters()])


def split_on_the_host(monkeypatch):
    """Under FakeTensorMode, the step's host-side chunk check reads the loader's CPU tensors as real."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from dael_plugin.engine import step as step_module

    split = step_module.split_domains

    def on_host(*args, **kwargs):
        with unset_fake_temporarily():
            return split(*args, **kwargs)

    monkeypatch.setattr(step_module, "split_domains", on_host)


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_steps_losses_on_fake_cuda_tensors_with_cudas_defaults(setting, monkeypatch):
    """The step's forward pass and losses on fake CUDA tensors (FakeTensorMode), as the engines build
    it on CUDA: ``CHUNK_BN auto`` resolving to ``grouped``, ``channels_last``, the fused optimiser
    chosen, the views moved with non-blocking copies. The backward pass needs a real CUDA context."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dael_plugin.core import DAEL
    from dael_plugin.core.chunk_norm import resolve_impl
    from dael_plugin.engine import step as step_module
    from dael_plugin.engine.execution import fused_optimizer

    split_on_the_host(monkeypatch)
    x, u = _batches()
    with FakeTensorMode(allow_non_fake_inputs=True), torch.device("cuda"):
        dev = torch.device("cuda")
        net, heads = _model()
        for p in net.parameters():  # Module.to(memory_format=...) cannot swap fake parameters
            if p.dim() == 4:
                p.data = p.data.contiguous(memory_format=torch.channels_last)
        hp, mask = _cs(setting, dev)
        algo = DAEL(net, heads, hp, fuse_chunks=True, chunk_bn="auto", class_mask=mask)
        assert resolve_impl("auto", dev.type) == "grouped"
        opt = fused_optimizer(torch.optim.SGD(list(net.parameters()) + list(heads.parameters()), lr=0.1, momentum=0.9))
        assert opt.param_groups[0]["fused"]
        # The first-step check (engine/first_step_check.py) runs real kernels in float64: not on fake tensors.
        da = setting != "dg"
        step = step_module.DAELStep(algo, [opt], strategy(dev, channels_last=True, check_first_step=False), 3, 4, da)
        assert (
            step_module.DAELStep(algo, [opt], strategy(dev), 3, 4, True)._first_step_check is not None
        )  # on by default
        xs, _ = step.views(x, None)
        assert all(v.is_cuda and v.is_contiguous(memory_format=torch.channels_last) for v in xs)
        out, us = step.losses(x, u)  # DG: the step never reads a target batch
        assert all(v.is_cuda for v in out.values()) and (us is not None) == da
        assert ("loss_other" in out) == setting.startswith("da-cs-other")
        assert all(k in out for k in step.keys)


# -- the first-step check of the fused pass (on CUDA by default) -----------------------------------
def _checked_step(check, setting="da"):
    from dael_plugin.core import DAEL, DAELHparams
    from dael_plugin.engine.step import DAELStep

    torch.manual_seed(0)
    net, heads = _model()
    algo = DAEL(net, heads, DAELHparams(conf_thre=0.0), fuse_chunks=True, chunk_bn="grouped")
    opt = torch.optim.SGD(list(net.parameters()) + list(heads.parameters()), lr=0.1, momentum=0.9)
    step = DAELStep(algo, [opt], strategy(check_first_step=check), 3, 4, setting == "da")
    return step, net


def test_the_first_step_check_passes_and_changes_nothing(capsys):
    """The check runs on copies under forked random streams: two steps with it end bitwise where two
    steps without it end, and it says what it measured."""
    x, u = _batches()
    runs = {}
    for check in (False, True):
        step, net = _checked_step(check)
        for _ in range(2):
            step(x, u)
        runs[check] = ({k: v.clone() for k, v in net.state_dict().items()}, torch.get_rng_state(), step)
    for k, v in runs[False][0].items():
        assert torch.equal(v, runs[True][0][k]), k
    assert torch.equal(runs[False][1], runs[True][1])
    found = runs[True][2].fast_path_check
    assert found["impl"] == "grouped" and not found["fell_back"]
    assert found["output"] < 1e-5 and found["gradients"] < 1e-4, found  # against float64
    assert found["layers_checked"] == 4 and found["layer_failures"] == []  # SmallCNN's four batch norms
    assert found["closest"]["error"] < 1e-5  # each layer alone: the kernel's own rounding
    assert found["reference_output"] > 0 and found["reference_gradients"] > 0  # torch's own kernel, for scale
    assert runs[False][2].fast_path_check is None
    assert "first-step check of the fused grouped batch norm" in capsys.readouterr().out


def _plant_a_wrong_input_gradient(monkeypatch):
    """The fused kernel's input gradient doubled: a defect of the kind only the device would show."""
    from dael_plugin.core import chunk_norm

    right = chunk_norm._GroupedBatchNorm.backward

    def wrong(ctx, *grads):
        dx, *rest = right(ctx, *grads)
        return (None if dx is None else 2 * dx, *rest)

    monkeypatch.setattr(chunk_norm._GroupedBatchNorm, "backward", staticmethod(wrong))


def test_the_first_step_check_falls_back_from_a_broken_kernel(monkeypatch, capsys):
    """A wrong input gradient from the fused kernel (here: twice the right one): the check sees it on
    the first batch, says so in one line, and the run goes on with per-chunk batch norm."""

    _plant_a_wrong_input_gradient(monkeypatch)
    step, _ = _checked_step(True)
    x, u = _batches()
    out = step(x, u)
    assert torch.isfinite(out["loss_x"])
    assert step.fast_path_check["fell_back"] and step.algorithm.chunk_bn == "split"
    assert step.fast_path_check["gradients"] > 1e-2
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "falling back to CHUNK_BN split" in ln]
    assert len(lines) == 1


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, factor):
        ctx.factor = factor
        return w.clone()

    @staticmethod
    def backward(ctx, g):
        return g * ctx.factor, None


def _plant_on_one_layer(monkeypatch, layer, factor, what="weight_grad", compiled_only=False):
    """A defect in the fused kernel of one marked layer (copies keep the mark): its weight gradient
    times ``factor``, or its running variance's update times ``factor``; with ``compiled_only``, in
    the compiled branch alone (``torch.compiler.is_compiling()``)."""
    from dael_plugin.core import chunk_norm

    right = chunk_norm._ChunkedMixin._grouped

    def planted(self, x, sizes):
        f = getattr(self, "_planted", None)
        if f is None or (compiled_only and not torch.compiler.is_compiling()):
            return right(self, x, sizes)
        runs = chunk_norm.runs_of(sizes)
        w = _ScaleGrad.apply(self.weight, f) if what == "weight_grad" else self.weight
        y, mean, var = chunk_norm._GroupedBatchNorm.apply(x, w, self.bias, runs, self.eps, None, 1)
        if self.training and self.track_running_stats:
            chunk_norm._update_running(self, mean, var * (f if what == "running_var" else 1.0), runs, x)
        return y

    monkeypatch.setattr(chunk_norm._ChunkedMixin, "_grouped", planted)
    layer._planted = factor


def _norm_layers(net):
    return [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


@pytest.mark.parametrize(
    "prec, factor, what, which",
    [
        ("fp32", 1.1, "weight_grad", -1),
        ("fp32", 1.1, "weight_grad", 0),
        ("bf16", 1.5, "weight_grad", 1),
        ("fp32", 1.5, "running_var", 2),
    ],
)
def test_the_first_step_check_sees_one_layer_off(monkeypatch, capsys, prec, factor, what, which):
    """One layer's weight gradient x1.1 in fp32 (x1.5 in bf16), or its running variance's update x1.5: a whole-
    gradient norm hides it (1e-3 of the total), each layer alone on its own input does not. The step
    falls back and the line names the layer and the quantity."""
    from dael_plugin.core import DAEL, DAELHparams
    from dael_plugin.engine.step import DAELStep

    torch.manual_seed(0)
    net, heads = _model()
    layer = _norm_layers(net)[which]
    name = next(n for n, m in net.named_modules() if m is layer)
    _plant_on_one_layer(monkeypatch, layer, factor, what)
    algo = DAEL(net, heads, DAELHparams(conf_thre=0.0), fuse_chunks=True, chunk_bn="grouped")
    opt = torch.optim.SGD(list(net.parameters()) + list(heads.parameters()), lr=0.1, momentum=0.9)
    step = DAELStep(algo, [opt], strategy(prec=prec, check_first_step=True), 3, 4, True)
    x, u = _batches()
    step(x, u)
    found = step.fast_path_check
    assert found["fell_back"] and step.algorithm.chunk_bn == "split"
    first = found["layer_failures"][0]
    assert (first["layer"], first["quantity"], first["where"]) == (name, what, "alone")
    if what == "weight_grad":
        assert first["error"] == pytest.approx(factor - 1, rel=0.05)
    else:  # one update of momentum 0.1 takes in the batch variance x1.5: about 0.1 * 0.5 * var / running
        assert first["error"] > 3 * first["allowed"]
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "falling back to CHUNK_BN split" in ln]
    assert f"layer {name} alone: {what}" in line


class _OutOfOrderNet(torch.nn.Module):
    """Batch norms registered in another order than they are called (bn_b, 16 channels, before bn_a,
    8), and one of them (bn_b) called twice."""

    def __init__(self):
        super().__init__()
        self.bn_b, self.bn_a = torch.nn.BatchNorm2d(16), torch.nn.BatchNorm2d(8)
        self.conv_a, self.conv_b = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 16, 3, padding=1)
        self.conv_c = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.out_features = 16

    def forward(self, x):
        x = torch.relu(self.bn_b(self.conv_b(torch.relu(self.bn_a(self.conv_a(x))))))
        return torch.relu(self.bn_b(self.conv_c(x))).mean((2, 3))


def test_the_first_step_check_keys_each_input_by_its_layer(monkeypatch):
    """Each batch-norm input is checked at the layer it was captured at: a backbone whose batch
    norms are registered out of call order (it crashed the check at the first step with
    "running_mean should contain 8 elements not 16"), with a layer called twice (checked once a
    call). A defect planted on bn_a is found at bn_a."""
    from dael_plugin.core import DAEL, DAELHparams, build_heads
    from dael_plugin.engine.execution import autocast
    from dael_plugin.engine.first_step_check import FirstStepCheck

    torch.manual_seed(0)
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    results = {}
    for planted in (False, True):
        net = _OutOfOrderNet()
        if planted:
            _plant_on_one_layer(monkeypatch, net.bn_a, 1.1)
        heads = build_heads(16, 5, 3, DAELHparams(conf_thre=0.0))
        algo = DAEL(net, heads, DAELHparams(conf_thre=0.0), fuse_chunks=True, chunk_bn="grouped")
        check = FirstStepCheck("fp32")
        check(algo, x, [4, 4, 4, 4], lambda: autocast("fp32", torch.device("cpu")))
        results[planted] = check.result
    clean, bad = results[False], results[True]
    assert not clean["fell_back"] and clean["layers_checked"] == 3
    assert bad["fell_back"]
    assert {(b["layer"], b["quantity"]) for b in bad["layer_failures"]} == {("bn_a", "weight_grad")}


@pytest.mark.parametrize("losses", ["ce", "ce_cr", "ce_cr_u"])
@pytest.mark.parametrize("views", ["weak_strong", "strong_weak", "strong_strong"])
def test_the_first_step_check_checks_the_steps_own_layout(monkeypatch, losses, views):
    """The check runs on the chunks the step fuses, for every LOSSES and VIEWS: with ``ce`` the
    source chunks of one view (3), with ``ce_cr`` of two (6), with L_u the target batch too (7),
    each view the step uses (it checked all views and the weak target view whatever the step used)."""
    from dael_plugin.core import DAEL, DAELHparams
    from dael_plugin.engine import first_step_check
    from dael_plugin.engine.step import DAELStep

    seen = {}

    def record(self, algorithm, x, chunk_sizes, autocast):
        seen["check"] = (x.clone(), list(chunk_sizes))
        self.result = {"fell_back": False}

    monkeypatch.setattr(first_step_check.FirstStepCheck, "__call__", record)
    torch.manual_seed(0)
    net, heads = _model()
    hp = DAELHparams(conf_thre=0.0, losses=losses, views=views)
    algo = DAEL(net, heads, hp, fuse_chunks=True, chunk_bn="grouped")
    encode = algo.encode

    def fused_call(x, chunk_sizes):
        seen.setdefault("step", (x.clone(), list(chunk_sizes)))
        return encode(x, chunk_sizes)

    algo.encode = fused_call
    opt = torch.optim.SGD(list(net.parameters()) + list(heads.parameters()), lr=0.1)
    step = DAELStep(algo, [opt], strategy(check_first_step=True), 3, 4, True)
    x, u = _batches()
    g = torch.Generator().manual_seed(1)
    x["img3"], u["img3"] = torch.randn(x["img"].shape, generator=g), torch.randn(u["img"].shape, generator=g)
    step(x, u)
    (checked, checked_sizes), (fused, fused_sizes) = seen["check"], seen["step"]
    assert checked_sizes == fused_sizes == [4] * 3 * (1 if losses == "ce" else 2) + ([4] if losses == "ce_cr_u" else [])
    assert torch.equal(checked, fused)


def test_the_first_step_check_of_a_compiled_step_checks_the_compiled_branch(monkeypatch):
    """A defect in the compiled branch alone (x1.1 on one layer's weight gradient when compiling): the
    check of a compiled step compiles the fused pass and sees it in that layer; the eager check, which
    does not run that branch, passes. (aot_eager traces the compiled branch on CPU without inductor's
    code generation; what it cannot see is inductor's own rounding, which the H200 run measures.)"""
    from dael_plugin.core import DAEL, DAELHparams
    from dael_plugin.engine.execution import autocast
    from dael_plugin.engine.first_step_check import FirstStepCheck

    torch.manual_seed(0)
    net, heads = _model()
    layer = _norm_layers(net)[-1]
    _plant_on_one_layer(monkeypatch, layer, 1.1, compiled_only=True)
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    results = {}
    for backend in (None, "aot_eager"):
        algo = DAEL(net, heads, DAELHparams(conf_thre=0.0), fuse_chunks=True, chunk_bn="grouped")
        check = FirstStepCheck("fp32", backend)
        check(algo, x, [4, 4, 4, 4], lambda: autocast("fp32", torch.device("cpu")))
        results[backend] = check.result
    assert not results[None]["fell_back"] and not results[None]["compiled"]
    compiled = results["aot_eager"]
    assert compiled["fell_back"] and compiled["compiled"]
    (bad,) = [b for b in compiled["layer_failures"] if b["quantity"] == "weight_grad"]
    assert bad["where"] == "in the whole pass" and bad["error"] == pytest.approx(0.1, rel=0.2)


def test_a_failed_first_step_check_under_torchrun_stops_the_run(monkeypatch):
    """Under torchrun the synchronised batch norm runs the fused kernels whatever CHUNK_BN says, so a
    failed check cannot fall back: the run stops with one line."""
    from dael_plugin.engine import distributed
    from dael_plugin.engine import step as step_module
    from dael_plugin.errors import DAELConfigError

    _plant_a_wrong_input_gradient(monkeypatch)
    step, _ = _checked_step(True)
    monkeypatch.setattr(step_module, "world", lambda: distributed.World(0, 2, 0, True))
    x, u = _batches()
    with pytest.raises(DAELConfigError, match="failed its first-step check"):
        step(x, u)


def test_views_built_for_cuda_find_their_tables_when_a_step_runs_on_cuda_0():
    """The views on the device make their constant tables when built, for ``device="cuda"``; a step's
    images say ``cuda:0``. A cache keyed by the device as written missed, so the tables were made
    inside the step: inside a CUDA graph under ``COMPILE reduce-overhead``, where the next replay
    overwrote them (the H200 run's compiled tests failed so). Fake CUDA tensors report ``cuda:0`` as
    real ones do; what this cannot see is a second GPU (``cuda:1``), which no test here has."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from yacs.config import CfgNode as CN

    from dael_plugin.config.defaults import get_builtin_cfg
    from dael_plugin.transforms import ops as O
    from dael_plugin.transforms.device import DeviceViews

    cfg = get_builtin_cfg()
    cfg.INPUT.SIZE = (32, 32)
    strong = ["random_flip", "cutout", "randaugment2", "normalize"]
    with FakeTensorMode(allow_non_fake_inputs=True):
        views = DeviceViews(
            ["random_flip", "random_translation", "normalize"],
            strong,
            2,
            cfg.INPUT,
            CN({"STRONG_TRANSFORMS": strong}),
            device="cuda",
            size=(32, 32),
        )
        policies = [op for op in views.strong if isinstance(op, O.RandAugmentBatch)]
        assert policies
        made = dict(O._GEOMETRY), [dict(op._tables) for op in policies]
        images = torch.zeros((4, 3, 32, 32), dtype=torch.uint8, device="cuda")
        assert str(images.device) == "cuda:0"
        weak, strong_view = views(images)
        assert weak.shape == strong_view.shape == (4, 3, 32, 32) and strong_view.is_cuda
        assert (dict(O._GEOMETRY), [dict(op._tables) for op in policies]) == made, "tables made inside the step"


def test_counting_launches_keeps_the_profilers_log_off_the_terminal():
    """libkineto writes ``USDT:... profiler_start`` (and, without a GPU, ``ERROR:... gpuGetDeviceCount
    failed``) to file descriptor 2 on every profiled region: bench.py printed 17 such lines.
    Anything else written meanwhile still reaches stderr. (In a fresh process, as bench.py runs:
    libkineto binds its log to the descriptor it finds at its first use.)"""
    import subprocess
    import sys

    code = (
        "import os, torch\n"
        "from dael_plugin.engine.profiling import count_launches\n"
        "def work():\n"
        "    os.write(2, b'a line of the program s own\\n')\n"
        "    return torch.ones(3) + 1\n"
        "for _ in range(2):\n"
        "    assert count_launches(work).ops['aten::add'] == 1\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("a line of the program s own") == 2, proc.stderr
    assert "USDT:" not in proc.stderr and "gpuGetDeviceCount" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("layer", ["MixStyle", "EFDMix"])
def test_dassls_mixing_layers_on_fake_cuda_tensors(layer):
    """Dassl's MixStyle and EFDMix (backbones/mixstyle.py) on a fake CUDA map, mixing on every call:
    their Beta weights are drawn on the host and moved, their partners drawn on the host index the
    device map, as in Dassl; no CPU/CUDA mix is refused. A stand-in cannot see the copies' cost."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dael_plugin.backbones import mixstyle

    mix = getattr(mixstyle, layer)(p=1.0).train()
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(6, 8, 4, 4, device="cuda")
        y = mix(x)
    assert y.is_cuda and y.shape == x.shape
