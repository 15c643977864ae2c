"""Tests that need Dassl.pytorch (marked ``dassl``; skipped with a reason without it)."""

import json
import os
import random
import re

import pytest
import torch

from conftest import ROOT, run_here

pytestmark = pytest.mark.dassl

DS_DA = os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml")
DS_DG = os.path.join(ROOT, "configs/datasets/dg/embedded_digits_dg.yaml")
# no per-epoch records, which the default writes on this small set (tests/test_selection.py covers them)
FAST = ["OPTIM.MAX_EPOCH", "1", "DATALOADER.NUM_WORKERS", "0", "USE_CUDA", "False", "SELECTION.EVAL_FREQ", "0"]


def test_registration_replaces_dassl_builtins_and_keeps_them_importable():
    from dassl.data.datasets import DATASET_REGISTRY
    from dassl.engine import TRAINER_REGISTRY
    from dassl.engine.da.dael import DAEL as DasslDAEL
    from dassl.engine.dg.daeldg import DAELDG as DasslDAELDG
    from dassl.modeling.backbone import BACKBONE_REGISTRY

    import dael_plugin  # noqa: F401
    from dael_plugin.dassl_adapter import DAELTrainer

    assert issubclass(TRAINER_REGISTRY.get("DAEL"), DAELTrainer) and TRAINER_REGISTRY.get("DAEL").__name__ == "DAEL"
    assert issubclass(TRAINER_REGISTRY.get("DAELDG"), DAELTrainer)
    assert DasslDAEL is not DAELTrainer and DasslDAELDG is not DAELTrainer
    for name in ("EmbeddedDigits", "EmbeddedDigitsDG", "DomainFolders", "DomainFoldersDG"):
        assert name in DATASET_REGISTRY.registered_names()
    assert "dael_small_cnn" in BACKBONE_REGISTRY.registered_names()
    for name in ("M3SDA", "MME", "SourceOnly"):
        assert name in TRAINER_REGISTRY.registered_names()


_CHECK_REGISTERED = """
from dassl.engine import TRAINER_REGISTRY
from dassl.data.datasets import DATASET_REGISTRY
from dassl.modeling.backbone import BACKBONE_REGISTRY
# (the plugin's adapter is not imported here: importing it registers by itself)
ours = "dael_plugin.dassl_adapter.trainer"
assert TRAINER_REGISTRY.get("DAEL").__module__ == ours and TRAINER_REGISTRY.get("DAELDG").__module__ == ours
assert "EmbeddedDigits" in DATASET_REGISTRY.registered_names()
assert "dael_small_cnn" in BACKBONE_REGISTRY.registered_names()
"""


@pytest.mark.parametrize(
    "first",
    [
        # Dassl's tools/train.py with the line added first: nothing of Dassl's engine until it is imported
        "import dael_plugin, sys; assert 'dassl.engine' not in sys.modules and 'sklearn' not in sys.modules\n"
        "from dassl.engine import build_trainer",
        "import dassl.engine.trainer; import dael_plugin",  # ... added last (a submodule imported first)
    ],
    ids=["plugin-then-dassl", "dassl-then-plugin"],
)
def test_importing_the_plugin_registers_with_dassl_in_any_order_and_silently(first):
    """``import dael_plugin`` registers into Dassl's registries whenever ``dassl.engine`` is
    imported, before or after it (a built-in process never imports Dassl's engine: 2 s saved per
    process), and stays silent: the replacement of Dassl's DAEL is said in a run's log, not on
    import (it broke a child's first line in two tests, and would land in collect's CSV)."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = first + "\n" + _CHECK_REGISTERED
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def _reference_cfg(data_root, conf_thre, out, backbone="cnn_digit5_m3sda"):
    from dassl.config import get_cfg_default

    from dael_plugin import add_dael_config

    cfg = get_cfg_default()
    add_dael_config(cfg)
    cfg.merge_from_file(DS_DA)
    cfg.merge_from_file(os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml"))
    cfg.merge_from_list(
        [
            "DATASET.ROOT",
            data_root,
            "DATASET.SOURCE_DOMAINS",
            ["hand", "blend", "font"],
            "DATASET.TARGET_DOMAINS",
            ["street"],
            "TRAINER.NAME",
            "DAEL",
            "USE_CUDA",
            False,
            "DATALOADER.NUM_WORKERS",
            0,
            "VERBOSE",
            False,
            "SEED",  # the batches drawn: SEED -1 draws a new seed each run (engine/seed.py)
            1,
            "OUTPUT_DIR",
            str(out),  # the test's own: the data root is shared by the suite's workers
            # Dassl's names only, so the reference can build the same strong view.
            "TRAINER.DAEL.STRONG_TRANSFORMS",
            ["random_crop", "randaugment2", "normalize"],
            "TRAINER.DAEL.CONF_THRE",
            conf_thre,
            # batch norm and dropout, per-domain calls: the paper's Digit-5 backbone, or the tests'
            # small one of the same structure (conftest.DROPOUT_CNN)
            "MODEL.BACKBONE.NAME",
            backbone,
        ]
    )
    return cfg


# Stated tolerance: Dassl computes log(p + 1e-5), this plugin an exact
# log-softmax; the difference is below 1e-5 / p per sample.
LOSS_ATOL = 2e-4
# 4 images per source domain and 8 target images a step: the step's arithmetic at a tenth of the
# configs' 32 + 32 (the equality holds per sample; the batch sizes change no line of either trainer).
SMALL_BATCHES = ["DATALOADER.TRAIN_X.BATCH_SIZE", 12, "DATALOADER.TRAIN_U.BATCH_SIZE", 8]
PARAM_ATOL = 1e-5


@pytest.mark.parametrize("new_layers", [[], ["linears"]])
def test_staged_rates_reach_the_experts_as_in_dassls_dael(data_root, tmp_path, dropout_cnn, new_layers):
    """``OPTIM.STAGED_LR``: Dassl stages the rates by child module, and its DAEL's experts are the
    child ``linears`` (``LR`` where ``NEW_LAYERS`` names it, ``LR * BASE_LR_MULT`` otherwise).
    ``ExpertHeads`` has no child, so Dassl's staging put its weights in no group: the experts never
    trained (16.7% after an epoch on the embedded set, against 21.2% without staging)."""
    from dassl.engine.da.dael import DAEL as Reference

    from dael_plugin.dassl_adapter import DAELTrainer

    cfg = _reference_cfg(data_root, 0.0, tmp_path / "eq", backbone=dropout_cnn)
    cfg.merge_from_list(["OPTIM.STAGED_LR", True, "OPTIM.NEW_LAYERS", new_layers, *SMALL_BATCHES])
    torch.manual_seed(0)
    ref, ours = Reference(cfg), DAELTrainer(cfg)

    def rates(optim, params):
        lr = {id(p): g["lr"] for g in optim.param_groups for p in g["params"]}
        return [lr.get(id(p)) for p in params]

    assert rates(ours.optim_F, ours.F.parameters()) == rates(ref.optim_F, ref.F.parameters())
    expected = cfg.OPTIM.LR if new_layers else cfg.OPTIM.LR * cfg.OPTIM.BASE_LR_MULT
    assert set(rates(ref.optim_E, ref.E.parameters())) == {expected}
    assert rates(ours.optim_E, ours.E.parameters()) == [expected, expected]  # ExpertHeads' weight and bias


@pytest.mark.parametrize(
    "conf_thre,channels_last,mixstyle",
    [(0.0, False, False), (0.25, False, False), (0.0, True, False), (0.0, False, True)],
)
def test_losses_and_update_match_dassl_reference_dael(
    data_root, tmp_path, conf_thre, channels_last, mixstyle, dropout_cnn
):
    """The default execution (fused pass, fused optimiser) within PARAM_ATOL; with
    channels_last, the CPU channels_last batch-norm kernel's rounding (normalised
    outputs 2e-5 from float64, against 4e-7) grew to 1.2e-4 through one step at
    lr 0.05 with cnn_digit5_m3sda, the same order as Dassl's own trainer moves (2e-4)
    when its weights are perturbed by 1e-6: the tolerance was 3e-4 there. With the tests'
    ``DROPOUT_CNN`` and 4 + 8 images a step (conftest; 0.3-0.7 s a case instead of
    10-15 s), measured on AMD EPYC, one thread (2026-11-29): weights within 5.9e-6
    (default) and 6.7e-6 (channels_last), losses within 1.4e-4 (Dassl's log(p + 1e-5)); the
    channels_last tolerance is now 3e-5, at which L_cr weighted 1.05 in the total loss fails
    (at 3e-4 it passed; broken by hand, 2026-11-29). ``mixstyle``: Dassl's ``resnet18_ms_l123``,
    whose MixStyle layers mix the statistics of the samples of one backbone call (and draw from
    Python's and torch's RNG in each call): the fused pass, which would mix the domains Dassl's
    per-chunk calls keep apart, falls back to Dassl's calls."""
    from dassl.engine.da.dael import DAEL as Reference

    from dael_plugin.dassl_adapter import DAELTrainer

    backbone = "resnet18_ms_l123" if mixstyle else dropout_cnn
    cfg = _reference_cfg(data_root, conf_thre, tmp_path / "eq", backbone=backbone)
    if mixstyle:
        cfg.merge_from_list(["MODEL.BACKBONE.PRETRAINED", False])
    # SEED 1: the batch drawn (the float noise varies with it: 3.9e-6 to 1.3e-5 on four seeds' first
    # batches with the defaults; with channels_last one of them moved a weight by 1.1e-3, the same
    # before and after the trainer hosted the method, 2026-12-05)
    cfg.merge_from_list(["SEED", 1, "TRAINER.DAEL.CHANNELS_LAST", channels_last, *SMALL_BATCHES])
    param_atol = 3e-5 if channels_last else PARAM_ATOL
    # A ResNet-18 at its initialisation puts about 0.1 on each class, where Dassl's log(p + 1e-5) is
    # 1e-4 to 2e-4 from log p: measured (AMD EPYC, 2026-12-06) 2.0e-4 for loss_x with Dassl's plain
    # resnet18 and 2.2e-4 with resnet18_ms_l123 (loss_cr, without the epsilon, within 1.2e-7); the
    # fused pass through MixStyle gave 0.39. Through the update that epsilon moves the first
    # convolution's weights by 8.3e-5 (resnet18) and 2.1e-4 (resnet18_ms_l123) after one step.
    loss_atol = 1e-3 if mixstyle else LOSS_ATOL
    param_atol = 5e-4 if mixstyle else param_atol
    torch.manual_seed(0)
    ref = Reference(cfg)
    ours = DAELTrainer(cfg)
    ours.F.load_state_dict(ref.F.state_dict())
    ours.E.load_from_linears(ref.E.linears)
    batch_x = next(iter(ours.train_loader_x))
    batch_u = next(iter(ours.train_loader_u))
    ref.batch_idx, ref.num_batches = 0, 100
    ours.batch_idx, ours.num_batches = 0, 100
    ref.set_model_mode("train")
    ours.set_model_mode("train")

    torch.manual_seed(1)  # same dropout masks: both call the backbone in the same order
    random.seed(1)  # MixStyle's draw of whether to mix
    r = ref.forward_backward(batch_x, batch_u)
    torch.manual_seed(1)
    random.seed(1)
    o = {k: float(v) for k, v in ours.forward_backward(batch_x, batch_u).items()}

    for key in ("loss_x", "loss_cr", "loss_u"):
        assert abs(r[key] - o[key]) < loss_atol, (key, r[key], o[key])
        print(f"equivalence {key}: dassl {r[key]:.6f} ours {o[key]:.6f} diff {abs(r[key] - o[key]):.2e}")
    assert abs(r["acc_x"] - o["acc_x"]) < 1e-4
    if conf_thre == 0.0:
        assert o["loss_u"] > 0 and o["mask_u"] == 1.0
    else:
        assert 0.0 < o["mask_u"] < 1.0, "pick a threshold that masks some samples"

    for (name, p_ref), p_ours in zip(ref.F.state_dict().items(), ours.F.state_dict().values()):
        torch.testing.assert_close(p_ours.float(), p_ref.float(), atol=param_atol, rtol=0, msg=name)
    for k, lin in enumerate(ref.E.linears):
        torch.testing.assert_close(ours.E.weight[k], lin.weight, atol=param_atol, rtol=0)
        torch.testing.assert_close(ours.E.bias[k], lin.bias, atol=param_atol, rtol=0)


def _train(tmp_path, tiny_root, trainer, cfg_file, ds=DS_DA, extra=()):
    out = str(tmp_path / trainer)
    args = (
        [
            "--engine",
            "dassl",
            "--trainer",
            trainer,
            "--root",
            tiny_root,
            "--dataset-config-file",
            ds,
            "--config-file",
            os.path.join(ROOT, cfg_file),
            "--source-domains",
            "hand",
            "blend",
            "font",
            "--target-domains",
            "street",
            "--output-dir",
            out,
            "--seed",
            "1",
        ]
        + FAST
        + list(extra)
    )
    proc = run_here(args)  # in-process: the script's own process is tested in test_cli_builtin
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "* accuracy:" in proc.stdout
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f), proc


def _log_value(text, prefix):
    return [float(line.split(prefix, 1)[1].split("%")[0]) for line in text.splitlines() if line.startswith(prefix)]


def test_dael_da_through_train_script(tmp_path, tiny_root):
    res, proc = _train(tmp_path, tiny_root, "DAEL", "configs/trainers/da/dael/embedded_digits.yaml")
    assert "domain adaptation (L_u on)" in proc.stdout
    assert res["trainer"] == "DAEL" and res["engine"] == "dassl" and res["dataset"] == "EmbeddedDigits"
    assert res["source_domains"] == ["hand", "blend", "font"] and res["target_domains"] == ["street"]
    assert res["seed"] == 1 and res["epochs"] == 1 and res["wall_seconds"] > 0
    assert res["provenance"]["versions"]["dassl"] not in (None, "") and "SEED: 1" in res["provenance"]["config"]
    assert res["per_class_accuracy"] and set(res["per_class_expert_accuracy"]) == {"hand", "blend", "font"}
    per = res["per_class_accuracy"].values()  # (each rounded to 2 decimals)
    assert res["mean_class_accuracy"] == pytest.approx(sum(per) / len(per), abs=0.006)
    assert "* per-class accuracy: " in proc.stdout
    # The record is the run's own final test, as printed by Dassl's evaluator ...
    assert _log_value(proc.stdout, "* accuracy: ") == [pytest.approx(res["accuracy"], abs=0.05)]
    experts = proc.stdout.split("* expert accuracy: ", 1)[1].splitlines()[0]
    for name, acc in res["expert_accuracy"].items():
        assert f"{name} {acc:.2f}%" in experts
    # ... and the weights it saved reproduce it.
    state = torch.load(tmp_path / "DAEL" / "checkpoint.pth.tar", weights_only=True)
    assert (
        state["epoch"] == 1 and state["engine"] == "dassl" and {k.split(".")[0] for k in state["model"]} == {"F", "E"}
    )
    assert os.path.isdir(tmp_path / "DAEL" / "tensorboard")
    log = open(tmp_path / "DAEL" / "log.txt").read()
    assert "loss_u" in log and "mask_u" in log


def test_dael_dg_through_train_script(tmp_path, tiny_root):
    res, proc = _train(tmp_path, tiny_root, "DAELDG", "configs/trainers/dg/daeldg/embedded_digits_dg.yaml", ds=DS_DG)
    assert "domain generalisation (no L_u)" in proc.stdout
    assert res["trainer"] == "DAELDG" and len(res["expert_accuracy"]) == 3
    log = open(tmp_path / "DAELDG" / "log.txt").read()
    assert "loss_x" in log and "loss_cr" in log and "loss_u" not in log and "mask_u" not in log


def test_daeldg_on_a_da_dataset_never_reads_target_training_data(tmp_path, tiny_root, monkeypatch):
    from dael_plugin.dassl_adapter import DAELTrainer

    cfg = _reference_cfg(tiny_root, 0.95, tmp_path / "eq")
    cfg.defrost()
    cfg.TRAINER.NAME = "DAELDG"
    cfg.TRAINER.DAELDG = cfg.TRAINER.DAEL.clone()
    cfg.OUTPUT_DIR = str(tmp_path / "dg")
    cfg.OPTIM.MAX_EPOCH = 1
    trainer = DAELTrainer(cfg)
    assert not trainer.is_da and trainer.dm.train_loader_u is not None  # the DA dataset has a target split ...
    assert trainer.train_loader_u is None  # ... for which DAELDG builds no loader

    class Refuse:  # ... and Dassl's own loader of it is never iterated nor measured
        def __iter__(self):
            raise AssertionError("DAELDG touched the target training data")

        __len__ = __iter__

    trainer.dm.train_loader_u = Refuse()
    trainer.train()
    assert (tmp_path / "dg" / "checkpoint.pth.tar").exists()


@pytest.mark.parametrize(
    "trainer,cfg_file",
    [
        ("M3SDA", "configs/trainers/da/m3sda/embedded_digits.yaml"),
        ("MME", "configs/trainers/da/mme/embedded_digits.yaml"),
        ("SourceOnly", "configs/trainers/da/source_only/embedded_digits.yaml"),
    ],
)
def test_dassl_baselines_through_the_same_script(tmp_path, tiny_root, trainer, cfg_file):
    res, proc = _train(tmp_path, tiny_root, trainer, cfg_file, extra=["TEST.PER_CLASS_RESULT", "True"])
    assert res["trainer"] == trainer and res["accuracy"] is not None and res["expert_accuracy"] == {}
    # the mean class accuracy from Dassl's own evaluator's labels: its printed average
    average = float(re.findall(r"\* average: ([\d.]+)%", proc.stdout)[-1])
    assert res["mean_class_accuracy"] == pytest.approx(average, abs=0.051)
    if trainer == "M3SDA":
        # --eval-only of a baseline: Dassl's own load_model crashes on val_result=None here.
        proc = run_here(
            [
                "--engine",
                "dassl",
                "--trainer",
                trainer,
                "--root",
                tiny_root,
                "--dataset-config-file",
                DS_DA,
                "--config-file",
                os.path.join(ROOT, cfg_file),
                "--source-domains",
                "hand",
                "blend",
                "font",
                "--target-domains",
                "street",
                "--output-dir",
                str(tmp_path / "eval"),
                "--eval-only",
                "--model-dir",
                str(tmp_path / trainer),
                "--load-epoch",
                "1",
            ]
            + FAST
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        with open(tmp_path / "eval" / "results_eval.json") as f:
            rec = json.load(f)
        assert rec["accuracy"] == pytest.approx(res["accuracy"]) and rec["epochs"] == 1
        assert not (tmp_path / "eval" / "results.json").exists()


def test_timm_backbone_under_dassl(tmp_path, tiny_root):
    res, _ = _train(
        tmp_path,
        tiny_root,
        "DAEL",
        "configs/trainers/da/dael/embedded_digits.yaml",
        extra=["MODEL.BACKBONE.NAME", "timm_test_convnext"],
    )
    assert res["backbone"] == "timm_test_convnext"  # the config, echoed; the weights say what trained:
    import timm
    import torch

    state = torch.load(tmp_path / "DAEL" / "checkpoint.pth.tar", map_location="cpu", weights_only=True)
    f = {k[2:]: v for k, v in state["model"].items() if k.startswith("F.")}
    ref = timm.create_model("test_convnext", pretrained=False, num_classes=0).state_dict()
    ours = {k.split("backbone.", 1)[-1].removeprefix("model."): v.shape for k, v in f.items() if "backbone." in k}
    assert ours == {k: v.shape for k, v in ref.items()}
    assert state["model"]["E.weight"].shape == (3, 10, 64)  # 3 experts read its 64 features


def test_backbone_weights_on_the_dassl_engine_are_read_or_refused(tmp_path, tiny_root):
    """MODEL.BACKBONE.WEIGHTS on the Dassl engine: the plugin's own backbone reads the file (its
    first convolution is the file's at the start: the one-epoch run's record names the file and its
    sha256); Dassl's own backbone, which would ignore it, is one line."""
    from dael_plugin.backbones import build_backbone

    torch.manual_seed(5)
    start = build_backbone("dael_small_cnn")
    path = tmp_path / "start.pth"
    torch.save(start.state_dict(), path)
    res, proc = _train(tmp_path, tiny_root, "DAEL", "configs/trainers/da/dael/embedded_digits.yaml",
                       extra=["MODEL.BACKBONE.WEIGHTS", str(path)])  # fmt: skip
    assert f"Loaded the backbone's weights from {path}" in proc.stdout
    assert res["backbone_weights"]["file"] == str(path) and len(res["backbone_weights"]["sha256"]) == 64
    args = ["--engine", "dassl", "--trainer", "SourceOnly", "--root", tiny_root, "--dataset-config-file", DS_DA,
            "--config-file", os.path.join(ROOT, "configs/trainers/da/source_only/embedded_digits.yaml"),
            "--source-domains", "hand", "blend", "font", "--target-domains", "street",
            "--output-dir", str(tmp_path / "so"), *FAST, "MODEL.BACKBONE.NAME", "cnn_digit5_m3sda",
            "MODEL.BACKBONE.WEIGHTS", str(path)]  # fmt: skip
    proc = run_here(args)
    assert proc.returncode == 2 and "would be ignored by Dassl's own cnn_digit5_m3sda" in proc.stderr


def test_eval_only_reloads_the_last_checkpoint(tmp_path, tiny_root):
    res, _ = _train(tmp_path, tiny_root, "DAEL", "configs/trainers/da/dael/embedded_digits.yaml")
    out = str(tmp_path / "DAEL")
    proc = run_here(
        [
            "--engine",
            "dassl",
            "--trainer",
            "DAEL",
            "--root",
            tiny_root,
            "--dataset-config-file",
            DS_DA,
            "--config-file",
            os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml"),
            "--source-domains",
            "hand",
            "blend",
            "font",
            "--target-domains",
            "street",
            "--output-dir",
            str(tmp_path / "eval"),
            "--eval-only",
            "--model-dir",
            out,
            "--load-epoch",
            "1",
        ]
        + FAST
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(tmp_path / "eval" / "results_eval.json") as f:
        assert json.load(f)["accuracy"] == pytest.approx(res["accuracy"])


def test_dassl_shipped_dael_configs_still_merge():
    """Dassl's own DAEL / DAELDG YAML files work unchanged, with and without the
    plugin's keys: the values in the files arrive, the plugin's keys keep the
    paper's defaults, and a trainer node without them reads the same defaults."""
    import dassl
    from dassl.config import get_cfg_default

    from dael_plugin import add_dael_config
    from dael_plugin.config import hparams_from_cfg
    from dael_plugin.core import DAELHparams

    base = os.path.join(os.path.dirname(os.path.dirname(dassl.__file__)), "configs", "trainers")
    files = {
        "da/dael/digit5.yaml": "DAEL",
        "da/dael/domainnet.yaml": "DAEL",
        "da/dael/mini_domainnet.yaml": "DAEL",
        "dg/daeldg/pacs.yaml": "DAELDG",
        "dg/daeldg/office_home_dg.yaml": "DAELDG",
        "dg/daeldg/digits_dg.yaml": "DAELDG",
    }
    present = {f: t for f, t in files.items() if os.path.isfile(os.path.join(base, f))}
    if not present:
        pytest.skip(f"Dassl was installed without its configs/ folder (looked in {base})")
    import yaml

    for f, trainer in present.items():
        path = os.path.join(base, f)
        with open(path) as fh:
            node = yaml.safe_load(fh)["TRAINER"][trainer]
        for with_plugin_keys in (True, False):
            cfg = get_cfg_default()
            if with_plugin_keys:
                add_dael_config(cfg)
            cfg.merge_from_file(path)
            cfg.TRAINER.NAME = trainer
            assert list(cfg.TRAINER[trainer].STRONG_TRANSFORMS) == node["STRONG_TRANSFORMS"], f
            hp = hparams_from_cfg(cfg)
            assert hp.conf_thre == cfg.TRAINER[trainer].CONF_THRE and hp.weight_u == cfg.TRAINER[trainer].WEIGHT_U
            assert (hp.cr_target, hp.cr_mode, hp.classifier, hp.pseudo_label, hp.views, hp.losses) == (
                DAELHparams().cr_target,
                "collaborative",
                "experts",
                "expert",
                "weak_strong",
                "ce_cr_u",
            )


def test_dael_on_dassl_with_views_on_the_device_and_a_log_per_print_freq(tmp_path, tiny_root):
    res, proc = _train(
        tmp_path,
        tiny_root,
        "DAEL",
        "configs/trainers/da/dael/embedded_digits.yaml",
        extra=["TRAINER.DAEL.AUG_ON_DEVICE", "True", "TRAIN.PRINT_FREQ", "2"],
    )
    assert 0.0 <= res["accuracy"] <= 100.0
    # The device-side meters are read at PRINT_FREQ, in Dassl's line format: "name last (mean)".
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("epoch [1/1] batch [")]
    assert lines and all(" loss_u " in ln and " (" in ln and " eta " in ln for ln in lines)
    total = int(lines[0].split("batch [")[1].split("/")[1].split("]")[0])
    printed = [int(ln.split("batch [")[1].split("/")[0]) for ln in lines]
    assert printed == ([b for b in range(1, total + 1) if b % 2 == 0] if total >= 2 else [1])


def _run_state(modules, optims) -> dict:
    """A built-in run's weights, batch-norm statistics and SGD momentum buffers, by name."""
    state = {n: t.detach().clone() for n, t in modules.state_dict().items()}
    names = {id(p): n for n, p in modules.named_parameters()}
    for optim in optims:
        for p, s in optim.state.items():
            if s.get("momentum_buffer") is not None:
                state["momentum:" + names[id(p)]] = s["momentum_buffer"].clone()
    return state


def _set_reference(ref, state: dict) -> None:
    """Dassl's DAEL (``F.backbone``, ``E.linears``, ``optim_F``, ``optim_E``) put in a built-in state."""
    ref.F.backbone.load_state_dict({k[2:]: v for k, v in state.items() if k.startswith("F.")})
    for k, lin in enumerate(ref.E.linears):
        lin.weight.data.copy_(state["E.weight"][k])
        lin.bias.data.copy_(state["E.bias"][k])
    pairs = [(ref.optim_F, "F." + n, p) for n, p in ref.F.backbone.named_parameters()]
    for k, lin in enumerate(ref.E.linears):
        pairs += [(ref.optim_E, f"E.{n}", (p, k)) for n, p in (("weight", lin.weight), ("bias", lin.bias))]
    for optim, name, p in pairs:
        p, k = p if isinstance(p, tuple) else (p, None)
        buf = state.get("momentum:" + name)
        if buf is not None:
            optim.state[p]["momentum_buffer"] = (buf if k is None else buf[k]).clone()


def _reference_state(ref) -> dict:
    state = {"F." + k: v.detach().clone() for k, v in ref.F.backbone.state_dict().items()}
    state["E.weight"] = torch.stack([lin.weight.detach() for lin in ref.E.linears])
    state["E.bias"] = torch.stack([lin.bias.detach() for lin in ref.E.linears])
    return state


def test_a_built_in_run_is_dassls_own_dael_step_by_step(tmp_path, tiny_root, dropout_cnn, monkeypatch):
    """The built-in engine held to Dassl's own DAEL trainer over a whole run. 2 epochs of the
    built-in engine's own loop (its sampler and epoch, Dassl's transforms on the host, the fused
    pass, the fused optimiser, its cosine schedule) are recorded step by step: the batches, torch's
    random state (the dropout masks), the weights, batch-norm statistics and momentum buffers
    before the step. Each step is then replayed through ``dassl.engine.da.dael.DAEL``'s
    ``forward_backward`` from that state; its losses and the state it leaves must be the built-in
    run's next state, to float rounding. The learning rate is Dassl's own: the reference's
    scheduler runs by itself (it steps after an epoch's last batch), so a wrong schedule, epoch
    length or step count fails here. Step by step, because the runs cannot be compared free-running:
    batch norm over small chunks amplifies a 1e-6 difference (Dassl's log(p + 1e-5)) up to 200
    times a step (the one-step test above). Dassl's own loop draws other batches (Python's ``random`` in its sampler), hence
    the built-in engine's batches; test_cli_builtin.py shows the Dassl engine's loop draws these."""
    from dassl.engine.da.dael import DAEL as Reference

    from dael_plugin.methods.dael import DAELBuiltin

    strong = "randaugment2"  # Dassl's Digit-5 strong view
    steps = []
    step = DAELBuiltin.forward_backward

    def recording(self, batch_x, batch_u):
        record = {"x": {k: v.clone() for k, v in batch_x.items() if torch.is_tensor(v)}}
        record["u"] = {k: v.clone() for k, v in batch_u.items() if torch.is_tensor(v)}
        record.update(state=_run_state(self.modules, self.optims.values()), rng=torch.get_rng_state())
        record.update(epoch=self.epoch, batch_idx=self.batch_idx, num_batches=self.num_batches)
        summary = step(self, batch_x, batch_u)
        record["losses"] = {k: float(v) for k, v in summary.items()}
        steps.append(record)
        return summary

    monkeypatch.setattr(DAELBuiltin, "forward_backward", recording)
    out = tmp_path / "builtin"
    opts = ["OPTIM.MAX_EPOCH", "2", "DATALOADER.TRAIN_X.BATCH_SIZE", "24", "DATALOADER.TRAIN_U.BATCH_SIZE", "8",
            "MODEL.BACKBONE.NAME", dropout_cnn, "TRAINER.DAEL.STRONG_TRANSFORMS", f"['{strong}', 'normalize']",
            "TRAINER.DAEL.CONF_THRE", "0.25"]  # fmt: skip
    args = ["--engine", "builtin", "--trainer", "DAEL", "--root", tiny_root, "--dataset-config-file", DS_DA,
            "--config-file", os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml"),
            "--source-domains", "hand", "blend", "font", "--target-domains", "street",
            "--output-dir", str(out), "--seed", "1", *FAST[2:], *opts]  # fmt: skip
    proc = run_here(args)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    final = torch.load(out / "model.pth.tar-2", map_location="cpu", weights_only=True)["model"]
    assert [s["epoch"] for s in steps].count(1) == steps[0]["num_batches"] > 4, "two whole epochs"
    masked = [s["losses"]["mask_u"] for s in steps]
    assert 0 < sum(masked) / len(masked) < 1, "L_u kept some target samples and masked others"

    cfg = _reference_cfg(tiny_root, 0.25, tmp_path / "ref", backbone=dropout_cnn)
    cfg.merge_from_list(["OPTIM.MAX_EPOCH", 2, "DATALOADER.TRAIN_X.BATCH_SIZE", 24,
                         "DATALOADER.TRAIN_U.BATCH_SIZE", 8, "TRAINER.DAEL.STRONG_TRANSFORMS", [strong, "normalize"]])  # fmt: skip
    ref = Reference(cfg)
    assert steps[0]["num_batches"] == len(ref.train_loader_x), "Dassl's epoch: its sampler's length"
    ref.set_model_mode("train")
    worst_w = worst_l = 0.0  # the weights' and momenta's largest difference after a step; the losses'
    for i, s in enumerate(steps):
        _set_reference(ref, s["state"])
        ref.epoch, ref.batch_idx, ref.num_batches = s["epoch"], s["batch_idx"], s["num_batches"]
        torch.set_rng_state(s["rng"])
        r = ref.forward_backward(s["x"], s["u"])
        for key in ("loss_x", "loss_cr", "loss_u"):
            worst_l = max(worst_l, abs(r[key] - s["losses"][key]))
        nxt = steps[i + 1]["state"] if i + 1 < len(steps) else final
        theirs = _reference_state(ref)
        for k, v in theirs.items():  # the running statistics relative to their size (variances of 100s)
            d = (v.float() - nxt[k].float()).abs().max() / (nxt[k].float().abs().max() if "running" in k else 1)
            worst_w = max(worst_w, float(d))
    print(f"built-in run against Dassl's DAEL, {len(steps)} steps: weights within {worst_w:.2e}, losses {worst_l:.2e}")
    # Measured (Intel Xeon VM, one thread): weights 8.5e-5, losses 1.5e-4 (Dassl's log(p + 1e-5):
    # eps / p for a confident mistake). A schedule that never steps moves a step by 1e-2 (broken by hand).
    assert worst_l < 1e-3 and worst_w < 5e-4, (worst_l, worst_w)


def test_best_val_deploys_the_model_of_the_best_validation_epoch(tmp_path, tiny_root, monkeypatch):
    """``TEST.FINAL_MODEL best_val`` on the Dassl engine: Dassl's ``after_train`` reloads the best
    model with ``load_model(OUTPUT_DIR)``. The plugin's ``load_model`` read the last checkpoint
    there, so the final test scored the last epoch's model under Dassl's line "Deploy the model
    with the best val performance" (epoch 4 deployed where epoch 2 was best, 2026-12-05). The
    validation results are scripted so that the first of two epochs is the best. ``--eval-only``
    without ``--load-epoch`` reads that model too, as Dassl's ``load_model`` does."""
    from dassl.config import get_cfg_default

    from dael_plugin import add_dael_config
    from dael_plugin.dassl_adapter import DAELTrainer

    out = tmp_path / "dg"
    cfg = get_cfg_default()
    add_dael_config(cfg)
    cfg.merge_from_file(DS_DG)  # its val split: the sources' test split
    cfg.merge_from_file(os.path.join(ROOT, "configs/trainers/dg/daeldg/embedded_digits_dg.yaml"))
    cfg.merge_from_list(["DATASET.ROOT", tiny_root, "DATASET.SOURCE_DOMAINS", ["hand", "blend", "font"],
                         "DATASET.TARGET_DOMAINS", ["street"], "TRAINER.NAME", "DAELDG", "OUTPUT_DIR", str(out),
                         "TEST.FINAL_MODEL", "best_val", *FAST[:2], "OPTIM.MAX_EPOCH", 2, *FAST[2:]])  # fmt: skip
    results, deployed = iter([50.0, 40.0]), {}
    test = DAELTrainer.test

    def scripted(self, split=None):
        if split == "val":
            return next(results)
        deployed.update({k: v.clone() for k, v in self.F.state_dict().items()})
        return test(self, split)

    monkeypatch.setattr(DAELTrainer, "test", scripted)
    DAELTrainer(cfg).train()
    best = torch.load(out / "F" / "model-best.pth.tar", map_location="cpu", weights_only=True)
    last = torch.load(out / "checkpoint.pth.tar", map_location="cpu", weights_only=True)["model"]
    last = {k[2:]: v for k, v in last.items() if k.startswith("F.")}
    assert best["epoch"] == 1 and best["val_result"] == 50.0 and deployed
    for k, v in best["state_dict"].items():
        assert torch.equal(deployed[k], v), k
    assert any(not torch.equal(deployed[k], v) for k, v in last.items()), "the last epoch's model differs"
    assert DAELTrainer(cfg).load_model(str(out)) == 1  # --eval-only without --load-epoch: Dassl's best too


@pytest.mark.parametrize("count", ["train_x", "train_u", "smaller_one"])
def test_an_epoch_is_as_long_as_dassls_count_iter_says(tmp_path, tiny_root, count, monkeypatch, dropout_cnn):
    """``TRAIN.COUNT_ITER`` on the Dassl engine's loop (dassl_adapter/method_trainer.py): an epoch has as
    many batches as Dassl's own DAEL's loader of that name (the shorter loader cycled)."""
    from dassl.engine.da.dael import DAEL as Reference

    from dael_plugin.dassl_adapter import DAELTrainer

    cfg = _reference_cfg(tiny_root, 0.95, tmp_path / "c", backbone=dropout_cnn)
    cfg.merge_from_list(["TRAIN.COUNT_ITER", count, "TRAIN.PRINT_FREQ", 1000, "DATALOADER.TRAIN_X.BATCH_SIZE", 6,
                         "DATALOADER.TRAIN_U.BATCH_SIZE", 12])  # fmt: skip
    ref, ours = Reference(cfg), DAELTrainer(cfg)
    lengths = {"train_x": len(ref.train_loader_x), "train_u": len(ref.train_loader_u)}
    lengths["smaller_one"] = min(lengths.values())
    assert lengths["train_x"] != lengths["train_u"]
    steps = []

    def counted(batch_x, batch_u):
        steps.append((len(batch_x["label"]), len(batch_u["label"])))
        return {"loss_x": torch.zeros(())}

    monkeypatch.setattr(ours.method, "forward_backward", counted)
    ours.epoch = 0
    ours.run_epoch()
    assert len(steps) == ours.num_batches == lengths[count]


def test_seed_minus_one_under_dassls_own_script_is_one_drawn_seed_for_the_run(tmp_path, tiny_root, capsys, dropout_cnn):
    """Dassl's own ``tools/train.py`` leaves ``SEED -1`` unseeded, and a hosted method drew every
    batch from seed 0 there (Dassl's own trainers draw at random; so did the plugin's earlier DAEL
    trainer). The host draws one seed for the run, as scripts/train.py does, and a rerun in the
    same folder (a resume) takes the seed its checkpoint holds."""
    from dael_plugin.dassl_adapter import DAELTrainer

    cfg = _reference_cfg(tiny_root, 0.95, tmp_path / "s", backbone=dropout_cnn)
    cfg.merge_from_list([*FAST[:2], "SEED", -1])
    a, b = DAELTrainer(cfg), DAELTrainer(cfg)
    assert a.cfg.SEED >= 0 and a.method.seed == a.cfg.SEED != b.cfg.SEED
    assert f"SEED -1: drew seed {a.cfg.SEED}" in capsys.readouterr().out
    a.train()
    again = DAELTrainer(cfg)
    assert again.cfg.SEED == a.cfg.SEED and "this run drew" in capsys.readouterr().out
