"""Issue 7 on the Dassl engine: exact resume, safe loads, Dassl's own entry
point and checkpoints, timm in Dassl's registry, and equivalence with Dassl's
DAEL and DAELDG over several steps. Marked ``dassl``."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, run_here
from test_hardening import Evil, damaged_root, finished, spawn, wait_for, wait_for_checkpoint  # noqa: F401 (fixture)

pytestmark = pytest.mark.dassl

DS_DA = os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml")
DS_DG = os.path.join(ROOT, "configs/datasets/dg/embedded_digits_dg.yaml")
DAEL_CFG = os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml")
DG_CFG = os.path.join(ROOT, "configs/trainers/dg/daeldg/embedded_digits_dg.yaml")
FAST = [
    # no per-epoch records, which the default writes on this small set (tests/test_selection.py covers them)
    "SELECTION.EVAL_FREQ",
    "0",
    "USE_CUDA",
    "False",
    "DATALOADER.TRAIN_X.BATCH_SIZE",
    "24",
    "DATALOADER.TRAIN_U.BATCH_SIZE",
    "8",
    "TRAIN.PRINT_FREQ",
    "3",
]


def dassl_args(root, out, epochs=1, trainer="DAEL", ds=DS_DA, cfg=DAEL_CFG, flags=(), extra=()):
    return (
        [
            "--engine",
            "dassl",
            "--trainer",
            trainer,
            "--root",
            root,
            "--dataset-config-file",
            ds,
            "--config-file",
            cfg,
            "--source-domains",
            "hand",
            "blend",
            "font",
            "--target-domains",
            "street",
            "--output-dir",
            str(out),
            "--seed",
            "3",
        ]
        + list(flags)
        + FAST
        + ["OPTIM.MAX_EPOCH", str(epochs)]
        + list(extra)
    )


# The Dassl engine's resume after kill -9 (fp32, 2 workers, records): test_hardening.py's
# test_resume_after_kill_9_is_bitwise_exact_with_persistent_workers[dassl].


def test_dassl_engine_worker_count_does_not_change_a_run(tmp_path, tiny_root):
    """Each draw is seeded from (seed, epoch, position): 0 or 2 long-lived workers, one run."""
    runs = []
    for workers in ("0", "2"):
        out = tmp_path / f"w{workers}"
        finished(dassl_args(tiny_root, out, epochs=2, extra=["DATALOADER.NUM_WORKERS", workers]))
        runs.append(torch.load(out / "checkpoint.pth.tar", weights_only=True)["model"])
    assert runs[0].keys() == runs[1].keys() and all(torch.equal(v, runs[1][k]) for k, v in runs[0].items())


def test_dassl_engine_refuses_pickled_code_and_config_changes(tmp_path, tiny_root):
    marker = tmp_path / "PWNED"
    victim = tmp_path / "victim"
    victim.mkdir()
    torch.save({"epoch": 1, "x": Evil(marker)}, victim / "checkpoint.pth.tar")
    proc = run_here(
        dassl_args(tiny_root, tmp_path / "new", flags=["--resume", str(victim)], extra=["DATALOADER.NUM_WORKERS", "0"])
    )
    assert proc.returncode == 2 and "refusing to load" in proc.stderr.strip().splitlines()[-1]
    assert not marker.exists() and "Traceback" not in proc.stderr

    # A baseline's --eval-only goes through the plugin's loader too.
    (victim / "model").mkdir()
    torch.save({"state_dict": {}, "epoch": 1, "x": Evil(marker)}, victim / "model" / "model.pth.tar-1")
    proc = run_here(
        dassl_args(
            tiny_root,
            tmp_path / "ev",
            trainer="SourceOnly",
            cfg=os.path.join(ROOT, "configs/trainers/da/source_only/embedded_digits.yaml"),
            flags=["--eval-only", "--model-dir", str(victim), "--load-epoch", "1"],
            extra=["DATALOADER.NUM_WORKERS", "0"],
        )
    )
    assert proc.returncode == 2 and "refusing to load" in proc.stderr.strip().splitlines()[-1]
    assert not marker.exists()


def test_dassl_engine_divergence_exits_3_without_a_result(tmp_path, tiny_root):
    out = tmp_path / "nan"
    proc = run_here(dassl_args(tiny_root, out, epochs=2, extra=["DATALOADER.NUM_WORKERS", "0", "OPTIM.LR", "1e6"]))
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 3 and last.startswith("error: the ") and "NaN/inf at epoch 1" in last
    assert not (out / "results.json").exists() and (out / "failed.json").exists()
    # Dassl's own trainer: its detect_anomaly raised FloatingPointError, a stack and no failed.json
    # (a sweep's table said 'missing', as for a run not yet done)
    out = tmp_path / "nan_dassl"
    source_only = os.path.join(ROOT, "configs/trainers/da/source_only/embedded_digits.yaml")
    extra = ["DATALOADER.NUM_WORKERS", "0", "OPTIM.LR", "1e30"]
    proc = run_here(dassl_args(tiny_root, out, trainer="SourceOnly", cfg=source_only, extra=extra))
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert last.startswith("error: the loss became NaN/inf at epoch 1 (by batch ") and "detect_anomaly" in last
    assert not (out / "results.json").exists() and json.loads((out / "failed.json").read_text())["failed"]


def _ref_cfg(root, out, trainer="DAEL", backbone="cnn_digit5_m3sda"):
    from dassl.config import get_cfg_default

    from dael_plugin import add_dael_config

    cfg = add_dael_config(get_cfg_default())
    da = trainer == "DAEL"
    cfg.merge_from_file(DS_DA if da else DS_DG)
    cfg.merge_from_file(DAEL_CFG if da else DG_CFG)
    node = f"TRAINER.{trainer}"
    cfg.merge_from_list(
        [
            "DATASET.ROOT",
            root,
            "DATASET.SOURCE_DOMAINS",
            ["hand", "blend", "font"],
            "DATASET.TARGET_DOMAINS",
            ["street"],
            "TRAINER.NAME",
            trainer,
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
            f"{node}.STRONG_TRANSFORMS",
            ["random_crop", "randaugment2", "normalize"],
            f"{node}.CONF_THRE",
            0.25,
            "MODEL.BACKBONE.NAME",
            backbone,
        ]
    )
    return cfg


@pytest.mark.parametrize("trainer,channels_last", [("DAEL", False), ("DAELDG", False), ("DAEL", True)])
def test_three_steps_match_dassls_own_trainer(data_root, tmp_path, trainer, channels_last, dropout_cnn):
    """The same weights and batches, three SGD steps in a row: the losses and the
    parameters after each step agree with Dassl's DAEL / DAELDG.

    At lr 1e-3 (measured: losses within 1.3e-4, parameters and batch-norm
    running statistics within 3.2e-5 after 3 steps; tolerance 1e-4). At the configs' lr 0.05 this network is chaotic: Dassl's own
    trainer, started from weights perturbed by 1e-6, is 2e-4 away after one
    step and 1e-2 after two, so no tight multi-step tolerance is meaningful
    there. The loss gap is Dassl's log(p + 1e-5) against an exact log-softmax.

    The default execution (fused pass, fused optimiser) is held to that
    tolerance; channels_last adds the CPU channels_last batch-norm kernel's
    rounding (its normalised outputs are 2e-5 from float64 against 4e-7 in
    the default layout), measured after 3 steps 1.0e-4 (Intel Xeon, 2 threads), 2.4e-4 (AMD EPYC,
    2 threads) and 5.1e-4 (AMD EPYC, 1 thread, as under pytest -n 2): tolerance 1e-3. The
    default layout stays held to 1e-4 (measured 2.7e-6 to 8.3e-6 on the same machines).

    Those figures are cnn_digit5_m3sda's at the configs' batches. The test now runs the tests'
    ``DROPOUT_CNN`` (conftest: batch norm and dropout, called per domain, as that backbone) at 4
    images per source domain and 8 target images a step: about 1 s a case instead of 25-35 s.
    Measured there (AMD EPYC, one thread, 2026-11-29): parameters within 4.7e-6 (DAEL), 3.1e-6
    (DAELDG) and 5.7e-6 (channels_last), losses within 1.4e-4. Tolerances 2e-5 (default layout)
    and 5e-5 (channels_last): at the old 1e-4 / 1e-3, L_cr weighted 1.05 instead of 1 in the
    total loss passed all three cases (broken by hand, 2026-11-29); at these it fails each.
    """
    from dassl.engine.da.dael import DAEL as RefDAEL
    from dassl.engine.dg.daeldg import DAELDG as RefDAELDG

    from dael_plugin.dassl_adapter import DAELTrainer

    cfg = _ref_cfg(data_root, tmp_path / "eq", trainer, backbone=dropout_cnn)
    cfg.defrost()
    # SEED 4: the batches. channels_last's rounding depends on them: after 3 steps, one thread,
    # seeds 1-6 gave 6.9e-6 to 2.1e-4 with channels_last and 3.2e-6 to 1.1e-5 without (AMD EPYC,
    # 2026-12-05); on seed 4's, L_cr weighted 1.05 fails both tolerances (broken by hand)
    cfg.merge_from_list(["DATALOADER.TRAIN_X.BATCH_SIZE", 12, "DATALOADER.TRAIN_U.BATCH_SIZE", 8, "SEED", 4])
    cfg.OPTIM.LR = 1e-3
    cfg.TRAINER[trainer].CHANNELS_LAST = channels_last
    tol = 5e-5 if channels_last else 2e-5
    torch.manual_seed(0)
    ref = (RefDAEL if trainer == "DAEL" else RefDAELDG)(cfg)
    ours = DAELTrainer(cfg)
    ours.F.load_state_dict(ref.F.state_dict())
    ours.E.load_state_dict(ref.E.state_dict())  # Dassl's linears.<k>.* layout, converted as it loads
    it_x = iter(ours.train_loader_x)
    it_u = iter(ours.train_loader_u) if trainer == "DAEL" else None
    for m in (ref, ours):
        m.batch_idx, m.num_batches = 0, 100
        m.set_model_mode("train")
    for step in range(3):
        batch_x = next(it_x)
        batch_u = next(it_u) if it_u is not None else None
        torch.manual_seed(10 + step)
        r = ref.forward_backward(batch_x, batch_u) if trainer == "DAEL" else ref.forward_backward(batch_x)
        torch.manual_seed(10 + step)
        o = {k: float(v) for k, v in ours.forward_backward(batch_x, batch_u).items()}
        assert ("loss_u" in o) == (trainer == "DAEL")
        for key in ["loss_x", "loss_cr"] + (["loss_u"] if trainer == "DAEL" else []):
            assert abs(r[key] - o[key]) < 2e-4, (step, key, r[key], o[key])
        for (name, p_ref), p_ours in zip(ref.F.state_dict().items(), ours.F.state_dict().values()):
            diff = (p_ours.float() - p_ref.float()).abs().max().item()
            assert diff < tol, (step, name, diff)
        for k, lin in enumerate(ref.E.linears):
            torch.testing.assert_close(ours.E.weight[k], lin.weight, atol=tol, rtol=0)


def test_a_checkpoint_of_dassls_dael_loads_with_the_experts_converted(data_root, tmp_path):
    from dassl.engine.da.dael import DAEL as RefDAEL

    from dael_plugin.dassl_adapter import DAELTrainer

    cfg = _ref_cfg(data_root, tmp_path / "conv")
    torch.manual_seed(0)
    ref = RefDAEL(cfg)
    ref.save_model(0, str(tmp_path))  # Dassl's layout: F/model.pth.tar-1, E/model.pth.tar-1
    torch.manual_seed(1)  # different initial weights, so a silent non-load would show
    ours = DAELTrainer(cfg)
    assert ours.load_model(str(tmp_path), epoch=1) == 1
    x = next(iter(ours.test_loader))["img"]
    ref.set_model_mode("eval")
    ours.set_model_mode("eval")
    with torch.no_grad():
        torch.testing.assert_close(ours.model_inference(x), ref.model_inference(x), atol=1e-6, rtol=0)


def _dassl_tools_train(tmp_path):
    import dassl

    src = os.path.join(os.path.dirname(os.path.dirname(dassl.__file__)), "tools", "train.py")
    if not os.path.isfile(src):
        pytest.skip(f"Dassl was installed without tools/train.py (looked for {src})")
    dst = tmp_path / "dassl_train.py"
    shutil.copy(src, dst)
    text = dst.read_text()
    dst.write_text("import dael_plugin  # the only line added\n" + text)
    return str(dst)


@pytest.mark.parametrize("trainer", ["DAEL", "DAELDG"])
def test_dassls_own_train_script_runs_the_plugin_with_one_import(tmp_path, tiny_root, trainer):
    script = _dassl_tools_train(tmp_path)
    ds, cfg = (DS_DA, DAEL_CFG) if trainer == "DAEL" else (DS_DG, DG_CFG)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [
            sys.executable,
            script,
            "--root",
            tiny_root,
            "--trainer",
            trainer,
            "--source-domains",
            "hand",
            "blend",
            "font",
            "--target-domains",
            "street",
            "--dataset-config-file",
            ds,
            "--config-file",
            cfg,
            "--output-dir",
            str(out),
            "--seed",
            "1",
            "OPTIM.MAX_EPOCH",
            "1",
            "DATALOADER.NUM_WORKERS",
            "0",
            "USE_CUDA",
            "False",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "replaced Dassl's built-in trainer" in proc.stdout and "* accuracy:" in proc.stdout
    assert "CR_TARGET" not in proc.stdout  # the plugin's keys were never added: defaults were used
    assert (out / "checkpoint.pth.tar").exists()


@pytest.mark.parametrize(
    "name", ["timm_resnet18", "timm_test_convnext", "timm_mobilenetv3_small_050", "timm_resnet18.tv_in1k"]
)
def test_dassls_build_backbone_takes_any_timm_model(name):
    from dassl.modeling import build_backbone

    import dael_plugin  # noqa: F401

    m = build_backbone(name, verbose=False, pretrained=False)
    x = torch.randn(2, 3, 32, 32)
    assert m(x).shape == (2, m.out_features)
    with pytest.raises(ValueError):
        build_backbone("timm_no_such_model_xyz", verbose=False, pretrained=False)


def test_dassl_engine_replaces_unreadable_images_and_check_data_lists_them(damaged_root, tmp_path):
    root, bad = damaged_root
    out = tmp_path / "run"
    proc = run_here(dassl_args(root, out, extra=["DATALOADER.NUM_WORKERS", "0"]))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads((out / "results.json").read_text())
    # Dassl's sampler ends an epoch before every image is drawn, so count what was met.
    assert rec["unreadable_images"] >= 1 and set(rec["unreadable_image_paths"]) <= set(bad)
    for p in rec["unreadable_image_paths"]:
        assert f"cannot decode {p}; replaced by another image of the same domain" in proc.stdout
    proc = run_here(dassl_args(root, tmp_path / "chk", flags=["--check-data"], extra=["DATALOADER.NUM_WORKERS", "0"]))
    assert proc.returncode == 2
    listed = sorted(
        line.split(" (")[0].replace("bad image: ", "")
        for line in proc.stderr.splitlines()
        if line.startswith("bad image: ")
    )
    assert listed == sorted(bad) and "Traceback" not in proc.stderr


def test_bench_script_runs_and_its_losses_agree(tmp_path):
    """scripts/bench.py builds both trainers by hand; a new attribute of the trainer must not break
    it silently. Its launch count is exact (counted, not timed), so it is held here: the default
    configuration launches at most half of Dassl's DAEL's operators per step (issue 14's target)."""
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "bench.py"),
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--steps",
            "1",
            "--per-domain",
            "10",
            "--device",
            "cpu",
            "--epoch",
            "--epoch-data",
            "synthetic",
            "--epoch-images",
            "10",  # one image per class and domain: 1 batch of 10 per domain an epoch (the lines asserted
            # below, not a timing; at --per-domain 2 and 4 images it was 5 batches, 40 s more)
            "--workers",
            "0",
            "--launch-size",
            "16",
            "--launch-per-domain",
            "8",  # the plugin's counts do not depend on it; at 8, Dassl's DAEL makes 3% fewer launches than at 64
            "--timed-epochs",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]  # a writer left open wrote into its removed folder
    out = proc.stdout
    diff = float(out.split("max abs diff ", 1)[1].split()[0])
    assert diff < 2e-4 and out.strip().splitlines()[-1].startswith("speedup_vs_dassl_dael: ")
    for line in (
        "+ fused pass",
        "+ fused optimiser",
        "+ channels_last",
        "share fused pass",
        "share aug on device",
        "epoch ratio dael_plugin (dassl engine):",
        "epoch ratio dael_plugin + aug on device:",
        "epoch ratio dael_plugin (built-in engine):",  # Dassl's digit-5 backbone, rebuilt
        "views only, per batch",
        "waiting for data",
    ):
        assert line in out, line
    ratio = float(out.split("launches_per_step_vs_dassl: ", 1)[1].split()[0])
    assert ratio <= 0.50, f"the default step launches {ratio:.2f} of Dassl's operators (target: at most 0.50)"
    table = out.split("== launches per step", 1)[1].split("launches_per_step_vs_dassl", 1)[0].splitlines()[3:]
    plugin_rows = [line for line in table if not line.startswith("dassl DAEL") and line.strip()]
    assert len(plugin_rows) == 8 and all(line.split()[-1] == "0" for line in plugin_rows), plugin_rows  # no host read
    views = next(line for line in plugin_rows if line.startswith("views only, per batch"))
    assert int(views.split()[4]) <= 300, views  # the paper's views, source and target batches (551 before)
