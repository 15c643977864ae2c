"""The ``EXECUTION`` node and the strategy that gives its options to every trainer
(``config/keys.py``'s resolution, ``engine/strategy.py``): hand-worked resolutions of the two
spellings, the records and checkpoints written before the node, and the options at work in
Dassl's baselines (autocast's dtype, fp16's scaler through several optimisers, the fused
kernels, the layout, compilation against eager)."""

import pytest
import torch
import yaml
from test_contract import build


def _cfg(trainer, *opts):
    from dael_plugin.config import add_dael_config
    from dael_plugin.config.defaults import get_builtin_cfg

    cfg = add_dael_config(get_builtin_cfg())
    cfg.TRAINER.NAME = trainer
    cfg.merge_from_list(list(opts))
    return cfg


def test_the_values_before_the_node_are_the_keys_legacy_values():
    from dael_plugin.config.table import EXECUTION_KEYS, IN_EVERY_CHECKPOINT
    from dael_plugin.engine.results_reader import EXECUTION_BEFORE

    legacy = {k.name: (k.default if k.legacy is IN_EVERY_CHECKPOINT else k.legacy) for k in EXECUTION_KEYS}
    assert EXECUTION_BEFORE == legacy


def test_each_spelling_and_each_trainers_own_choice_by_hand():
    from dael_plugin.config.execution import execution_from_cfg, resolve_execution
    from dael_plugin.errors import DAELConfigError

    dael = execution_from_cfg(_cfg("DAEL"))
    assert (dael.channels_last, dael.fused_optim, dael.prec) == (True, True, "fp32")  # DAEL's own choices
    mme = execution_from_cfg(_cfg("MME"))
    assert (mme.channels_last, mme.fused_optim, mme.prec) == (False, False, "fp32")  # as Dassl's runs
    assert execution_from_cfg(_cfg("MME", "EXECUTION.FUSED_OPTIM", True)).fused_optim
    assert not execution_from_cfg(_cfg("DAEL", "EXECUTION.CHANNELS_LAST", False)).channels_last
    # the older spelling alone, or both agreeing
    assert execution_from_cfg(_cfg("DAEL", "TRAINER.DAEL.PREC", "bf16")).prec == "bf16"
    assert execution_from_cfg(_cfg("DAEL", "TRAINER.DAEL.PREC", "bf16", "EXECUTION.PREC", "bf16")).prec == "bf16"
    with pytest.raises(DAELConfigError, match=r"EXECUTION.PREC='bf16' and TRAINER.DAEL.PREC='fp16' disagree"):
        execution_from_cfg(_cfg("DAEL", "TRAINER.DAEL.PREC", "fp16", "EXECUTION.PREC", "bf16"))
    with pytest.raises(DAELConfigError, match=r"^TRAINER.DAEL.COMPILE='max' is invalid"):
        execution_from_cfg(_cfg("DAEL", "TRAINER.DAEL.COMPILE", "max"))
    with pytest.raises(DAELConfigError, match=r"EXECUTION.AUG_ON_DEVICE=True: MME has no DAEL step"):
        execution_from_cfg(_cfg("MME", "EXECUTION.AUG_ON_DEVICE", True), trainer="MME")
    # written back: the record holds what ran, under both spellings
    cfg = _cfg("DAEL", "TRAINER.DAEL.PREC", "bf16")
    resolve_execution(cfg)
    assert cfg.EXECUTION.PREC == cfg.TRAINER.DAEL.PREC == "bf16" and cfg.EXECUTION.CHANNELS_LAST is True


def _record(config):
    from dael_plugin.engine.results_reader import Record

    return Record("x/results.json", {"engine": "builtin", "provenance": {"config": yaml.safe_dump(config)}})


def test_a_record_from_before_the_node_is_the_same_setting():
    from dael_plugin.engine.results_reader import setting_key

    old = {"TRAINER": {"NAME": "DAEL", "DAEL": {"PREC": "bf16", "CHANNELS_LAST": True}}}
    new = {
        "TRAINER": {"NAME": "DAEL", "DAEL": {"PREC": "bf16", "CHANNELS_LAST": True}},
        "EXECUTION": {"FUSE_CHUNKS": True, "CHUNK_BN": "auto", "PREC": "bf16", "CHANNELS_LAST": True,
                      "COMPILE": "none", "FUSED_OPTIM": False, "AUG_ON_DEVICE": False},
    }  # fmt: skip
    assert setting_key(_record(old)) == setting_key(_record(new))
    fp32 = {**new, "EXECUTION": {**new["EXECUTION"], "PREC": "fp32"}}
    assert setting_key(_record(fp32)) != setting_key(_record(new))
    plain = {"EXECUTION": dict(new["EXECUTION"], PREC="fp32", CHANNELS_LAST=False), "TRAINER": {"NAME": "MME"}}
    assert setting_key(_record({"TRAINER": {"NAME": "MME"}})) == setting_key(_record(plain))


def test_a_checkpoint_from_before_the_node_resumes_and_a_changed_option_is_named():
    from dael_plugin.config.execution import resolve_execution
    from dael_plugin.engine.checkpoint import config_diff

    saved = _cfg("MME")
    saved.pop("EXECUTION")  # a baseline's checkpoint written before the node
    now = _cfg("MME")
    resolve_execution(now, trainer="MME")
    assert [d for d in config_diff(saved.dump(), now) if d[0].startswith("EXECUTION")] == []
    bf16 = _cfg("MME", "EXECUTION.PREC", "bf16")
    resolve_execution(bf16, trainer="MME")
    assert ("EXECUTION.PREC", "fp32", "bf16") in config_diff(saved.dump(), bf16)
    old_dael = _cfg("DAEL", "TRAINER.DAEL.PREC", "bf16")
    old_dael.pop("EXECUTION")
    dael = _cfg("DAEL", "EXECUTION.PREC", "bf16")
    resolve_execution(dael)
    assert [d for d in config_diff(old_dael.dump(), dael) if "PREC" in d[0]] == []


def _steps(tr, n=2):
    tr.modules.train()
    batches = tr._batches()
    return [tr.forward_backward(*next(batches)) for _ in range(n)]


def test_bf16_autocasts_a_baselines_update_and_the_fused_kernels_and_layout_apply(tiny_root, tmp_path):
    tr = build("MCD", tiny_root, tmp_path / "r", None, None, "EXECUTION.PREC", "bf16",
               "EXECUTION.FUSED_OPTIM", True, "EXECUTION.CHANNELS_LAST", True)  # fmt: skip
    assert all(o.defaults.get("fused") for o in tr.optims.values())
    assert tr.modules["F"].features[0].weight.is_contiguous(memory_format=torch.channels_last)
    dtypes = []
    tr.modules["F"].register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    out = _steps(tr)
    assert dtypes and set(dtypes) == {torch.bfloat16}
    assert all(torch.isfinite(v) for o in out for v in o.values())
    plain = build("MCD", tiny_root, tmp_path / "p")
    assert not any(o.defaults.get("fused") for o in plain.optims.values())
    assert plain.modules["F"].features[0].weight.is_contiguous()


def test_fp16_scales_each_of_a_baselines_updates_and_checkpoints_the_scaler(tiny_root, tmp_path):
    """MCD steps its optimisers in three updates a batch: each is a scaled step of its own."""
    tr = build("MCD", tiny_root, tmp_path / "r", None, None, "EXECUTION.PREC", "fp16")
    assert tr.scaler is not None and tr.scaler.get_scale() == 2.0**16
    calls = []
    update = tr.scaler.update
    tr.scaler.update = lambda *a: (calls.append(1), update(*a))
    out = _steps(tr)
    assert len(calls) == 2 * 3  # two batches, three updates each (N_STEP_F 1)
    assert all(torch.isfinite(v) for o in out for v in o.values())
    assert tr.run_state(1)["scaler"]["scale"] == tr.scaler.get_scale()


@pytest.mark.parametrize("name", ["SourceOnly", "MCD", "DAEL"])
def test_compile_gives_eagers_steps(name, tiny_root, tmp_path, monkeypatch):
    """EXECUTION.COMPILE default (aot_eager: inductor's graph without a C++ build) against eager."""
    import torch._inductor.config as inductor_config

    from dael_plugin.engine.strategy import Strategy

    monkeypatch.setattr(Strategy, "compile_backend", "aot_eager")
    monkeypatch.setattr(inductor_config, "fallback_random", False)
    torch._dynamo.reset()  # compiled here, not found in another test's cache
    eager = _steps(build(name, tiny_root, tmp_path / "e"))
    tr = build(name, tiny_root, tmp_path / "c", None, None, "EXECUTION.COMPILE", "default")
    assert inductor_config.fallback_random  # inductor would draw eager's dropout masks (DAEL's step too)
    if name != "DAEL":
        assert all(m._compiled_call_impl is not None for m in tr.modules.values())
    compiled = _steps(tr)
    for a, b in zip(eager, compiled):
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-4, msg=f"{name} {k}")


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="inductor on the CPU builds C++: no g++ here")
def test_inductor_draws_eagers_dropout_masks(monkeypatch):
    """EXECUTION.COMPILE with inductor itself (a C++ build on the CPU, a few seconds): a dropout net
    compiled by the strategy gives eager's outputs and gradients bit for bit from the same seeds,
    step after step (without ``fallback_random`` inductor draws its own masks: 0.9 off, measured)."""
    import copy

    import torch._inductor.config as inductor_config
    from torch import nn

    from dael_plugin.config.execution import Execution
    from dael_plugin.engine.strategy import Strategy

    monkeypatch.setattr(inductor_config, "fallback_random", False)
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Dropout(0.5), nn.Linear(8 * 14 * 14, 10))
    compiled = {"net": copy.deepcopy(eager)}
    Strategy(Execution(compile="default"), torch.device("cpu")).prepare(compiled, ("net",), (3, 16, 16))
    assert inductor_config.fallback_random and compiled["net"]._compiled_call_impl is not None
    x = torch.randn(4, 3, 16, 16)
    for step in range(3):
        outs = []
        for net in (eager, compiled["net"]):
            net.zero_grad()
            torch.manual_seed(100 + step)
            outs.append(net(x))
            outs[-1].square().sum().backward()
        assert torch.equal(outs[0], outs[1]), step
        assert torch.equal(eager[0].weight.grad, compiled["net"][0].weight.grad), step


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="inductor on the CPU builds C++: no g++ here")
@pytest.mark.parametrize("kind", ["MixStyle", "EFDMix"])
def test_inductor_gives_eagers_mixstyle_and_efdmix(kind):
    """Dassl's mixing layers run eagerly inside a compiled module, so compiled (inductor) and eager
    draw the same mixes from the same random states: two layers in a small net, four steps whose
    Python draws mix in some and not in others, outputs within float rounding. With the layers
    compiled into inductor's graph the steps were 0.04-0.08 off here, a ResNet-18's 2.3 (measured)."""
    import copy
    import random

    from torch import nn

    from dael_plugin.backbones import mixstyle
    from dael_plugin.config.execution import Execution
    from dael_plugin.engine.strategy import Strategy

    torch._dynamo.reset()
    torch.manual_seed(0)
    mix = getattr(mixstyle, kind)()
    eager = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        mix,
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        mix,
        nn.Flatten(),
        nn.Linear(512, 10),
    ).train()
    compiled = {"net": copy.deepcopy(eager)}
    Strategy(Execution(compile="default"), torch.device("cpu")).prepare(compiled, ("net",), (3, 8, 8))
    x = torch.randn(8, 3, 8, 8)
    draws = [random.Random(step).random() for step in range(4)]  # each step's first layer's draw
    assert any(d <= mix.p for d in draws) and any(d > mix.p for d in draws)
    for step in range(4):
        outs = []
        for net in (eager, compiled["net"]):
            random.seed(step)
            torch.manual_seed(100 + step)
            outs.append(net(x))
        torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=1e-6, msg=f"step {step}")


def test_dassls_own_trainer_refuses_the_options_in_one_line(tmp_path):
    from dael_plugin.errors import DAELConfigError
    from dael_plugin.tools.train_config import resolve_run_execution

    cfg = _cfg("M3SDA", "EXECUTION.PREC", "bf16")
    with pytest.raises(DAELConfigError, match=r"EXECUTION.PREC='bf16': Dassl's own M3SDA runs as Dassl wrote it"):
        resolve_run_execution(cfg, "dassl")
    cfg = _cfg("M3SDA")
    resolve_run_execution(cfg, "dassl")
    assert cfg.EXECUTION.PREC == "fp32" and cfg.EXECUTION.CHANNELS_LAST is False
