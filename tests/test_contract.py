"""The contract every method in the built-in engine's registry keeps, in the manner of DomainBed's
``test_init_update_predict``: a method added to the registry (``dael_plugin/methods/``: ``TRAINERS``,
``register``) is tested here without a line added. The method's config is the one a
sweep finds (``sweep_plan.method_config``); tests/test_plugins.py runs the same contract on methods
from a file outside the package.

For each method, on the embedded set (cut to 6 images a class): it builds; ``uses_target`` is a
bool and is the run's setting; two steps return finite 0-dim device tensors and move the weights
(AdaBN: the batch-norm statistics); ``features_and_experts`` gives ``(B, D)`` features and
``(B, K, C)`` probabilities with ``K = num_experts``, which ``predict_experts`` returns too; and
the checkpoint's state, loaded into a fresh build of the same run, gives the same weights,
optimiser states and predictions; built for the meta device, a step stays there; at bf16 and
compiled, and on a ViT, two steps move the weights. Exact resume through the CLI is
test_baselines.py's and test_cli_builtin.py's (kill and rerun, bitwise).
"""

import os

import pytest
import torch

from conftest import ROOT
from dael_plugin.methods import method_setting, trainer_names

DATASETS = {
    "DA": os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml"),
    "DG": os.path.join(ROOT, "configs/datasets/dg/embedded_digits_dg.yaml"),
}


def build(name, root, out, cfg_file=None, init_weights=None, *opts):
    from dael_plugin.engine.trainer import set_random_seed
    from dael_plugin.methods import build_trainer
    from dael_plugin.tools.sweep_plan import method_config
    from dael_plugin.tools.train import build_parser, setup_cfg

    ds = DATASETS[method_setting(name)]
    cfg_file = cfg_file or method_config(name, method_setting(name).lower(), ds)
    extra = ["MODEL.INIT_WEIGHTS", init_weights] if init_weights else []
    args = build_parser().parse_args(
        ["--engine", "builtin", "--trainer", name, "--root", root, "--output-dir", str(out),
         "--dataset-config-file", ds, "--config-file", cfg_file, "--source-domains", "hand", "street", "font",
         "--target-domains", "blend", "--seed", "1", "--", "DATALOADER.NUM_WORKERS", "0",
         "SELECTION.EVAL_FREQ", "0", "TRAINER.M3SDA.N_STEP_F", "1", "TRAINER.MCD.N_STEP_F", "1",
         "DATALOADER.TRAIN_X.BATCH_SIZE", "24", "DATALOADER.TRAIN_U.BATCH_SIZE", "8", *extra, *opts]
    )  # fmt: skip
    set_random_seed(1)
    return build_trainer(setup_cfg(args, "builtin"))


def check_contract(name, root, tmp_path, cfg_file=None, init_weights=None):
    from dael_plugin.tools.train_engines import run_setting

    tr = build(name, root, tmp_path / "run", cfg_file, init_weights)
    cls = type(tr)
    assert isinstance(cls.uses_target, bool), f"{name}: uses_target must be a class attribute, True or False"
    assert tr.is_da == (tr.has_target_train and cls.uses_target)
    assert run_setting(tr) == ("DA" if tr.is_da else "DG") == method_setting(name)
    assert (tr.train_loader_u is not None) <= tr.is_da  # a DG run never reads target images
    before = {k: v.clone() for k, v in tr.modules.state_dict().items()}
    tr.modules.train()
    batches = tr._batches()
    for _ in range(2):
        batch_x, batch_u = next(batches)
        out = tr.forward_backward(batch_x, batch_u)
        assert isinstance(out, dict) and (out or not tr.optimises), name
        for key, value in out.items():
            assert torch.is_tensor(value) and value.dim() == 0 and value.device == tr.device, (name, key)
            assert torch.isfinite(value), (name, key, value)
    moved = [k for k, v in tr.modules.state_dict().items() if not torch.equal(v, before[k])]
    if tr.optimises:
        assert any(p.requires_grad and not torch.equal(p.detach(), before[k]) for k, p in tr.modules.named_parameters())
    else:  # AdaBN: the statistics alone
        assert moved and all(
            k.rsplit(".", 1)[1] in ("running_mean", "running_var", "num_batches_tracked") for k in moved
        )
    tr.modules.eval()
    x = batch_x["img"][:5].to(tr.device)
    with torch.no_grad():
        feats, probs = tr.features_and_experts(x)
        again = tr.predict_experts(x)
    assert feats.dim() == 2 and feats.shape[0] == 5
    assert probs.shape == (5, tr.num_experts, tr.num_classes), (name, probs.shape)
    torch.testing.assert_close(probs.sum(-1), torch.ones(5, tr.num_experts))
    torch.testing.assert_close(again, probs)
    state = tr.run_state(1)
    fresh = build(name, root, tmp_path / "fresh", cfg_file, init_weights)
    fresh.modules.load_state_dict(state["model"])
    fresh._load_optim_state(state)
    assert all(torch.equal(v, fresh.modules.state_dict()[k]) for k, v in tr.modules.state_dict().items())
    assert fresh._optim_state().keys() == tr._optim_state().keys()
    fresh.modules.eval()
    with torch.no_grad():
        torch.testing.assert_close(fresh.predict_experts(x), probs, rtol=0, atol=0)


@pytest.fixture(scope="module")
def source_model(tiny_root, tmp_path_factory):
    """ADDA's and AdaBN's MODEL.INIT_WEIGHTS: a finished one-epoch SourceOnly run."""
    from conftest import run_here

    out = tmp_path_factory.mktemp("contract_source")
    proc = run_here(
        ["--engine", "builtin", "--trainer", "SourceOnly", "--root", tiny_root, "--output-dir", str(out),
         "--dataset-config-file", DATASETS["DA"],
         "--config-file", os.path.join(ROOT, "configs/trainers/da/source_only/embedded_digits.yaml"),
         "--source-domains", "hand", "street", "font", "--target-domains", "blend", "--seed", "1", "--",
         "DATALOADER.NUM_WORKERS", "0", "OPTIM.MAX_EPOCH", "1", "SELECTION.EVAL_FREQ", "0"]
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return str(out / "model.pth.tar-1")


@pytest.mark.parametrize("name", trainer_names())
def test_every_registered_method_keeps_the_contract(name, tiny_root, tmp_path, source_model):
    from dael_plugin.methods import trainer_class

    init = source_model if getattr(trainer_class(name), "needs_init_weights", False) else None
    check_contract(name, tiny_root, tmp_path, init_weights=init)


def check_meta_device(name, root, tmp_path, cfg_file=None, init_weights=None):
    """The method built for the meta device (a device that is not the CPU, where ``distributed.device``
    names the training device): one step whose losses and gradients, and whose prediction, stay
    there; any CPU tensor mixed into the device math raises. It cannot see CUDA's kernels, streams
    or memory, nor a host sync (test_gpu.py reads them where a GPU is lent)."""
    from dael_plugin.engine import distributed

    meta = torch.device("meta")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(distributed, "device", lambda use_cuda: meta)
        tr = build(name, root, tmp_path / "meta", cfg_file, init_weights)
    assert all(p.device == meta for p in tr.modules.parameters())
    tr.modules.train()
    batch_x, batch_u = next(tr._batches())
    out = tr.forward_backward(batch_x, batch_u)
    assert all(v.device == meta for v in out.values()) and (out or not tr.optimises), (name, out)
    trained = [p for p in tr.modules.parameters() if p.grad is not None]
    assert all(p.grad.device == meta for p in trained) and (trained or not tr.optimises), name
    assert tr.predict_experts(batch_x["img"].to(meta)).device == meta


@pytest.mark.parametrize("name", trainer_names())
def test_every_registered_method_steps_on_the_meta_device(name, tiny_root, tmp_path, source_model):
    from dael_plugin.methods import trainer_class

    init = source_model if getattr(trainer_class(name), "needs_init_weights", False) else None
    check_meta_device(name, tiny_root, tmp_path, init_weights=init)


def two_steps_move_weights(tr, name):
    """Two training steps with finite losses, and some weight (or statistic) moved."""
    before = {k: v.clone() for k, v in tr.modules.state_dict().items()}
    tr.modules.train()
    batches = tr._batches()
    for _ in range(2):
        out = tr.forward_backward(*next(batches))
        assert all(torch.isfinite(v) for v in out.values()), (name, out)
    assert any(not torch.equal(v, before[k]) for k, v in tr.modules.state_dict().items()), name


def check_bf16_compiled(name, root, tmp_path, cfg_file=None, init_weights=None):
    """``EXECUTION.PREC bf16`` and ``EXECUTION.COMPILE default``: two finite steps that move the
    weights, every module compiled (DAEL: its step). Call with ``Strategy.compile_backend`` set."""
    # bf16 on CPU is emulated: 16x16 images (the small CNN pools to 2x2 at any size) are a quarter of
    # the work (DDAIG's image generator took 15 s of CPU at 32x32); the contract does not read the size
    tr = build(name, root, tmp_path / "run", cfg_file, init_weights, "EXECUTION.PREC", "bf16",
               "EXECUTION.COMPILE", "default", "INPUT.SIZE", "(16, 16)")  # fmt: skip
    assert tr.execution.prec == "bf16" and tr.execution.compile == "default"
    compiled = [m._compiled_call_impl is not None for m in tr.modules.values()]
    assert tr.step.compiled if tr.dael_step else all(compiled), name
    two_steps_move_weights(tr, name)


@pytest.mark.parametrize("name", trainer_names())
def test_every_registered_method_runs_bf16_compiled(name, tiny_root, tmp_path, source_model, monkeypatch):
    """Every method at bf16, compiled (aot_eager on CPU: inductor's graph without its C++ build)."""
    from dael_plugin.engine.strategy import Strategy
    from dael_plugin.methods import trainer_class

    monkeypatch.setattr(Strategy, "compile_backend", "aot_eager")
    init = source_model if getattr(trainer_class(name), "needs_init_weights", False) else None
    check_bf16_compiled(name, tiny_root, tmp_path, init_weights=init)


@pytest.mark.parametrize("name", trainer_names())
def test_every_registered_method_steps_with_a_vit(name, tiny_root, tmp_path, source_model):
    """Every method on a ViT at the embedded set's 32x32 (a backbone without batch norm): two finite
    steps that move its weights. ADDA and AdaBN start from a ViT SourceOnly run's model; AdaBN,
    which re-estimates batch-norm statistics, refuses a backbone without any in one line."""
    from dael_plugin.methods import trainer_class

    vit = ["MODEL.BACKBONE.NAME", "timm_vit_tiny_patch16_224"]
    init = None
    if getattr(trainer_class(name), "needs_init_weights", False):
        from conftest import run_here

        src = tmp_path / "source"
        proc = run_here(
            ["--engine", "builtin", "--trainer", "SourceOnly", "--root", tiny_root, "--output-dir", str(src),
             "--dataset-config-file", DATASETS["DA"],
             "--config-file", os.path.join(ROOT, "configs/trainers/da/source_only/embedded_digits.yaml"),
             "--source-domains", "hand", "street", "font", "--target-domains", "blend", "--seed", "1", "--",
             "DATALOADER.NUM_WORKERS", "0", "OPTIM.MAX_EPOCH", "1", "SELECTION.EVAL_FREQ", "0", *vit]
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        init = str(src / "model.pth.tar-1")
    if name == "AdaBN":
        from dael_plugin.errors import DAELConfigError

        with pytest.raises(DAELConfigError, match="has no batch-norm layer; choose a backbone with batch norm"):
            build(name, tiny_root, tmp_path / "run", None, init, *vit)
        return
    tr = build(name, tiny_root, tmp_path / "run", None, init, *vit)
    assert "VisionTransformer" in {type(m).__name__ for m in tr.modules.modules()}
    two_steps_move_weights(tr, name)
