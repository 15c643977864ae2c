"""Issue 15, reliability round two: sweeps never pass old results off as new, config files are
data, checkpoints are checked before they are evaluated, divergence is seen in the buffers too,
the lock is the kernel's, every write survives a full disk, SIGTERM stops a run as Ctrl-C does,
a sweep owns its runs, and the tools that read records survive bad ones.

Built-in engine unless marked ``dassl``."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT
from test_hardening import (
    DS_DA,
    args_for,
    cli,
    one_error_line,
    spawn,
    wait_for_checkpoint,
)

SWEEP_FAST = [
    "OPTIM.MAX_EPOCH",
    "1",
    "DATALOADER.NUM_WORKERS",
    "0",
    "USE_CUDA",
    "False",
    "DATALOADER.TRAIN_X.BATCH_SIZE",
    "24",
    "DATALOADER.TRAIN_U.BATCH_SIZE",
    "8",
    # no per-epoch records, which the default writes on this small set (tests/test_selection.py covers them)
    "SELECTION.EVAL_FREQ",
    "0",
]


def sweep(argv, capsys):
    from dael_plugin.tools.sweep import main

    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def sweep_args(root, out, *extra, opts=SWEEP_FAST):
    return [
        "--root",
        root,
        "--dataset-config-file",
        DS_DA,
        "--output-dir",
        str(out),
        "--engine",
        "builtin",
        "--trainers",
        "SourceOnly",
        "--targets",
        "street",
        *extra,
        *opts,
    ]


# -- sweeps that never pass old results off as new -----------------------------------------
def test_a_relaunch_with_other_settings_is_refused_and_the_old_result_stays(tmp_path, tiny_root, capsys):
    code, out, err = sweep(sweep_args(tiny_root, tmp_path), capsys)
    assert code == 0, out + err
    record = tmp_path / "EmbeddedDigits" / "SourceOnly" / "street" / "seed1" / "results.json"
    first = record.read_bytes()
    longer = SWEEP_FAST[:1] + ["2"] + SWEEP_FAST[2:] + ["OPTIM.LR", "0.2"]
    for argv, changed in (
        (sweep_args(tiny_root, tmp_path, opts=longer), "options: OPTIM.MAX_EPOCH=1"),
        (sweep_args(tiny_root, tmp_path, "--sources", "hand", "blend"), "sources: hand blend font"),
        (sweep_args(tiny_root, tmp_path, "--seeds", "1", "--dry-run"), None),
    ):
        code, out, err = sweep(argv, capsys)
        if changed is None:  # the same settings: done, nothing to run
            assert code == 0 and "(1 done, 0 to run)" in out
            continue
        line = one_error_line(err)
        assert code == 2 and "was launched with other settings" in line and changed in line, line
        assert "pass another --output-dir" in line
    assert record.read_bytes() == first
    from dael_plugin.tools.collect import main as collect

    assert collect([str(tmp_path)]) == 0
    assert "| SourceOnly |" in capsys.readouterr().out


def test_collect_gives_each_setting_its_own_row_and_refuses_two_records_of_one_seed(tmp_path, capsys):
    from dael_plugin.tools.collect import main as collect

    def record(folder, seed, acc, epochs, setting=None):
        d = tmp_path / folder
        d.mkdir(parents=True)
        config = f"OPTIM:\n  MAX_EPOCH: {epochs}\nSEED: {seed}\n"
        (d / "results.json").write_text(
            json.dumps(
                {
                    "dataset": "EmbeddedDigits",
                    "trainer": "DAEL",
                    "target_domains": ["blend"],
                    "seed": seed,
                    "accuracy": acc,
                    "engine": "builtin",
                    "setting": setting,
                    "provenance": {"config": config},
                }
            )
        )
        return d

    record("EmbeddedDigits/DAEL/blend/seed1", 1, 70.0, 15)
    record("by_hand/a", 2, 72.0, 15)
    record("by_hand/b", 1, 40.0, 1)  # one epoch: another setting, never averaged with the others
    record("dg/EmbeddedDigitsDG", 1, 66.0, 15, setting="DG")
    assert collect([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| DAEL [MAX_EPOCH=15] | 71.00 ± 1.41 |" in out and "| DAEL [MAX_EPOCH=1] | 40.00" in out
    assert "### EmbeddedDigits (DG)" in out  # the record says DG: not in the DA table
    record("by_hand/c", 2, 73.0, 15)  # seed 2 again, same setting
    assert collect([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "two records for DAEL [MAX_EPOCH=15] -> blend seed 2" in err and "by_hand/a" in err and "by_hand/c" in err


def test_tables_and_figures_survive_bad_records(tmp_path, capsys):
    from dael_plugin.tools import plots
    from dael_plugin.tools.collect import main as collect

    good = tmp_path / "EmbeddedDigits" / "DAEL" / "blend" / "seed1"
    good.mkdir(parents=True)
    (good / "results.json").write_text(
        json.dumps(
            {"dataset": "EmbeddedDigits", "trainer": "DAEL", "target_domains": ["blend"], "seed": 1, "accuracy": 70.0}
        )
    )
    truncated = tmp_path / "EmbeddedDigits" / "DAEL" / "street" / "seed1"
    truncated.mkdir(parents=True)
    (truncated / "results.json").write_text('{"dataset": "EmbeddedDigits", "accur')
    listed = tmp_path / "EmbeddedDigits" / "DAEL" / "font" / "seed1"
    listed.mkdir(parents=True)
    (listed / "results.json").write_text("[1, 2]")
    assert collect([str(tmp_path)]) == 0
    cap = capsys.readouterr()
    assert f"warning: skipping {truncated / 'results.json'}: truncated or not JSON" in cap.err
    assert f"warning: skipping {listed / 'results.json'}: holds a JSON list" in cap.err
    assert "| DAEL | 70.00 ± 0.00 | corrupt | corrupt | — |" in cap.out, cap.out
    assert plots.main([str(tmp_path), "--out", str(tmp_path / "figs")]) == 0
    assert "warning: skipping" in capsys.readouterr().err


# -- config files are data -------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)])
def test_a_python_config_file_is_refused_and_never_runs(tmp_path, tiny_root, capsys, engine):
    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil.py"
    evil.write_text(f"OPTIM: __import__('os').system('touch {marker}')\n")  # valid YAML and valid Python
    argv = args_for(tiny_root, tmp_path / "out")
    argv[argv.index("--config-file") + 1] = str(evil)
    argv[argv.index("--engine") + 1] = engine
    code, _, err = cli(argv, capsys)
    assert code == 2 and "is a Python file" in one_error_line(err)
    assert not marker.exists()


# -- evaluation checks what it loads ------------------------------------------------------------
def test_eval_only_maps_the_experts_by_domain_name(tmp_path, tiny_root, capsys):
    out = tmp_path / "run"
    assert cli(args_for(tiny_root, out), capsys)[0] == 0
    trained = json.loads((out / "results.json").read_text())["expert_accuracy"]
    argv = args_for(tiny_root, tmp_path / "eval", flags=["--eval-only", "--model-dir", str(out)])
    i = argv.index("--source-domains")
    argv[i + 1 : i + 4] = ["font", "blend", "hand"]  # the run's sources, in another order
    code, stdout, err = cli(argv, capsys)
    assert code == 0, err
    assert "mapped by domain name" in stdout
    evaluated = json.loads((tmp_path / "eval" / "results_eval.json").read_text())["expert_accuracy"]
    assert list(evaluated) == ["font", "blend", "hand"] and evaluated == {d: trained[d] for d in evaluated}
    argv[i + 1 : i + 4] = ["font", "blend", "street"]
    argv[argv.index("--target-domains") + 1] = "hand"
    code, _, err = cli(argv, capsys)
    assert code == 2 and "has experts for source domains ['hand', 'blend', 'font']" in one_error_line(err)


@pytest.mark.dassl
def test_a_checkpoint_of_the_other_engine_is_one_line(tmp_path, tiny_root, capsys):
    built_in = tmp_path / "builtin"
    assert cli(args_for(tiny_root, built_in), capsys)[0] == 0
    argv = args_for(tiny_root, tmp_path / "eval", flags=["--eval-only", "--model-dir", str(built_in)])
    argv[argv.index("--engine") + 1] = "dassl"
    code, _, err = cli(argv, capsys)
    assert code == 2 and "written by the builtin engine; evaluate it with --engine builtin" in one_error_line(err)
    on_dassl = tmp_path / "dassl"
    argv = args_for(tiny_root, on_dassl)
    argv[argv.index("--engine") + 1] = "dassl"
    assert cli(argv, capsys)[0] == 0
    (on_dassl / "results.json").unlink()  # as if killed after its last checkpoint
    code, _, err = cli(args_for(tiny_root, on_dassl), capsys)  # resumed on the built-in engine
    assert code == 2 and "written by the dassl engine; resume it with --engine dassl" in one_error_line(err)


# -- divergence, buffers included -------------------------------------------------------------
@pytest.mark.parametrize("engine", ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)])
def test_a_one_epoch_run_that_diverges_exits_3_without_a_result(tmp_path, tiny_root, capsys, engine):
    """At lr 1e6 the losses can stay finite for an epoch while batch-norm's running variance
    overflows; the run ended at 'chance accuracy' with exit 0. The buffers are checked now."""
    out = tmp_path / "nan"
    argv = args_for(tiny_root, out, extra=["OPTIM.LR", "1e6"])
    argv[argv.index("--engine") + 1] = engine
    code, _, err = cli(argv, capsys)
    line = one_error_line(err)
    assert code == 3 and "NaN/inf" in line and "no results.json was written" in line, line
    assert not (out / "results.json").exists() and (out / "failed.json").exists()


# -- no selection on test data by accident ------------------------------------------------------
@pytest.mark.dassl
def test_best_val_without_a_validation_split_is_refused(tmp_path, tiny_root, capsys):
    argv = args_for(tiny_root, tmp_path / "o", extra=["TEST.FINAL_MODEL", "best_val"])
    argv[argv.index("--engine") + 1] = "dassl"
    code, _, err = cli(argv, capsys)
    line = one_error_line(err)
    assert code == 2 and "no validation split" in line and "TEST.FINAL_MODEL last_step" in line


def test_best_val_on_the_builtin_engine_names_last_step(tmp_path, tiny_root, capsys):
    code, _, err = cli(args_for(tiny_root, tmp_path / "o", extra=["TEST.FINAL_MODEL", "best_val"]), capsys)
    assert code == 2 and "last_step" in one_error_line(err)


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("TRAIN.COUNT_ITER", "train_uu", "['train_x', 'train_u', 'smaller_one'] on the built-in engine"),
        ("OPTIM.LR_SCHEDULER", "linear", "['cosine', 'single_step', 'multi_step'] on the built-in engine"),
    ],
)
def test_a_value_the_loop_cannot_honour_is_one_line_naming_the_values_it_takes(tmp_path, tiny_root, capsys, key, value, said):  # fmt: skip
    code, _, err = cli(args_for(tiny_root, tmp_path / "o", extra=[key, value]), capsys)
    line = one_error_line(err)
    assert code == 2 and line.startswith(f"error: {key}={value!r}: DAEL takes ") and said in line, line
    assert not (tmp_path / "o").exists()  # refused before the output folder


def test_a_dataset_only_dassl_reads_says_so(tmp_path, tiny_root, capsys):
    ds = tmp_path / "mine.yaml"  # a dataset class of the user's own in Dassl's registry
    ds.write_text('DATASET:\n  NAME: "MyDasslSet"\n')
    argv = args_for(tiny_root, tmp_path / "o")
    argv[argv.index("--dataset-config-file") + 1] = str(ds)
    code, _, err = cli(argv, capsys)
    line = one_error_line(err)
    assert code == 2 and "dataset 'MyDasslSet' is not one the built-in engine reads" in line, err
    assert "'PACS'" in line and "'STL10'" in line and "Dassl's registry needs --engine dassl" in line


# -- every write survives a full disk ----------------------------------------------------------
def test_a_failed_write_removes_its_temporary_file_and_names_the_bytes(tmp_path, monkeypatch):
    import errno

    from dael_plugin.engine import atomic

    target = tmp_path / "checkpoint.pth.tar"
    atomic.write_bytes(str(target), b"old")
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(atomic.WriteError, match=r"no space left on the device \(it needs 1,000 bytes"):
        atomic.write_bytes(str(target), b"x" * 1000)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["checkpoint.pth.tar"]
    stale = tmp_path / "results.json.tmp.99999999"  # a writer that was killed: its pid is gone
    stale.write_text("half")
    assert atomic.remove_stale_temps(str(tmp_path)) == [str(stale)] and not stale.exists()


def _mount_tmpfs(path, size):
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return proc.returncode == 0


def test_a_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_last_one(tmp_path, tiny_root):
    """A real full disk: a tmpfs that holds the first epoch's checkpoint but not a second one beside
    it (the atomic write needs both until the rename). Needs root to mount (skipped otherwise)."""
    sizing = tmp_path / "sizing"
    # the checkpoint alone is under test: no records (the default keeps chosen models beside it)
    no_records = ["SELECTION.EVAL_FREQ", "0"]
    proc = spawn(args_for(tiny_root, sizing, extra=no_records))
    assert proc.wait(300) == 0, proc.stderr.read()[-2000:]
    need = (sizing / "checkpoint.pth.tar").stat().st_size
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, need * 13 // 10 + 200 * 1024):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        proc = spawn(args_for(tiny_root, disk / "run", epochs=3) + ["TEST.NO_TEST", "True"] + no_records)
        _, err = proc.communicate(timeout=300)
        line = one_error_line(err)
        assert proc.returncode == 2 and "no space left on the device" in line and "checkpoint.pth.tar" in line, err
        assert "bytes," in line and "are free" in line
        assert torch.load(disk / "run" / "checkpoint.pth.tar", weights_only=True)["epoch"] >= 1
        assert not [f for f in os.listdir(disk / "run") if ".tmp." in f]
    finally:
        subprocess.run(["umount", str(disk)])


def test_stale_temporary_files_are_removed_at_the_next_start(tmp_path, tiny_root, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "checkpoint.pth.tar.tmp.99999999").write_bytes(b"\0" * 1000)
    code, stdout, _ = cli(args_for(tiny_root, out), capsys)
    assert code == 0 and "left by a write that was killed" in stdout
    assert not (out / "checkpoint.pth.tar.tmp.99999999").exists()


# -- SIGTERM like Ctrl-C -------------------------------------------------------------------------
def test_sigterm_stops_a_run_like_ctrl_c(tmp_path, tiny_root):
    """SIGTERM to the run's whole process group, data-loader workers included, as ``scancel``,
    ``timeout`` or a job's cgroup sends it: the main process may see a worker's death (torch's
    SIGCHLD check raises) before its own SIGTERM, and stops with the same one line either way."""
    out = tmp_path / "term"
    proc = spawn(args_for(tiny_root, out, epochs=50, extra=["DATALOADER.NUM_WORKERS", "2"]), start_new_session=True)
    assert wait_for_checkpoint(out, 1, proc), "never finished epoch 1"
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("terminated (SIGTERM): the last checkpoint is ") and "(epoch " in last
    assert "Traceback" not in err and not (out / ".dael_run.json").exists()


# -- a sweep owns its runs ------------------------------------------------------------------------
def _sweep_proc(root, out, epochs):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    opts = ["OPTIM.MAX_EPOCH", str(epochs)] + SWEEP_FAST[2:]
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "scripts", "sweep.py"), *sweep_args(root, out, opts=opts)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run_pid(run_dir, timeout=120):
    t = time.time()
    while time.time() - t < timeout:
        try:
            return json.loads((run_dir / ".dael_run.json").read_text())["pid"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    raise AssertionError("the run never started")


def _gone(pid, timeout=60):
    t = time.time()
    while time.time() - t < timeout:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie of ours counts as gone
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_a_sweep_killed_with_9_takes_its_runs_with_it(tmp_path, tiny_root):
    run_dir = tmp_path / "EmbeddedDigits" / "SourceOnly" / "street" / "seed1"
    proc = _sweep_proc(tiny_root, tmp_path, epochs=50)
    child = _run_pid(run_dir)
    proc.kill()
    proc.wait(30)
    assert _gone(child), "the sweep's run outlived it"
    log = (run_dir / "sweep_log.txt").read_text()
    assert "terminated (SIGTERM)" in log, log[-2000:]


def test_two_sweeps_on_one_folder_share_the_work(tmp_path, tiny_root, capsys):
    run_dir = tmp_path / "EmbeddedDigits" / "SourceOnly" / "street" / "seed1"
    first = _sweep_proc(tiny_root, tmp_path, epochs=300)
    try:
        _run_pid(run_dir)
        code, out, err = sweep(
            sweep_args(tiny_root, tmp_path, opts=["OPTIM.MAX_EPOCH", "300"] + SWEEP_FAST[2:]), capsys
        )
        assert code == 0, out + err
        assert "running elsewhere SourceOnly -> street seed 1" in out and "1 running elsewhere" in out
        assert "FAILED" not in out
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(60)


# -- one-line errors instead of tracebacks -------------------------------------------------------
@pytest.mark.dassl
def test_a_backbone_dassl_does_not_have_is_one_line(tmp_path, tiny_root, capsys):
    argv = args_for(tiny_root, tmp_path / "o", extra=["MODEL.BACKBONE.NAME", "__import__('os')"])
    argv[argv.index("--engine") + 1] = "dassl"
    code, _, err = cli(argv, capsys)
    assert code == 2 and "is not a backbone Dassl has" in one_error_line(err)


def test_exif_orientation_is_not_applied_as_in_dassl(tmp_path):
    """JPEGs are read as stored, their EXIF orientation ignored, as Dassl's and torchvision's
    readers do (the published numbers were made so); README 'Bad data' says so."""
    from PIL import Image

    from dael_plugin.data.images import decode

    img = Image.new("RGB", (20, 10), (255, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    img.save(tmp_path / "rotated.jpg", exif=exif)
    assert decode(str(tmp_path / "rotated.jpg")).size == (20, 10)


@pytest.mark.parametrize("accuracy", ["70", 1e5, [70.0], float("nan"), None, True, -1])
def test_a_record_with_a_bad_accuracy_is_corrupt_never_averaged(tmp_path, capsys, accuracy):
    """A hand-edited results.json whose accuracy is a string, out of range, a list, NaN, null or a
    bool is marked corrupt with a warning naming it: never averaged, never dropped silently."""
    from dael_plugin.tools.collect import main as collect

    for target, acc in (("blend", 70.0), ("street", accuracy)):
        d = tmp_path / "EmbeddedDigits" / "DAEL" / target / "seed1"
        d.mkdir(parents=True)
        rec = {"dataset": "EmbeddedDigits", "trainer": "DAEL", "target_domains": [target], "seed": 1, "accuracy": acc}
        (d / "results.json").write_text(json.dumps(rec))  # NaN is written as the token NaN
    assert collect([str(tmp_path)]) == 0
    cap = capsys.readouterr()
    assert "warning: skipping" in cap.err and "street" in cap.err and "accuracy" in cap.err, cap.err
    assert "| DAEL | 70.00 ± 0.00 | corrupt | — |" in cap.out, cap.out


@pytest.mark.parametrize("saved_config", [True, False])
def test_rows_of_two_engines_are_named_by_the_engine(tmp_path, capsys, saved_config):
    """Runs of the two engines differ in keys only one engine's config holds (Dassl's
    K_TRANSFORMS); their rows are named by the engine, not by such a key. Records written before
    they kept their config are two settings by their engine as well, not two records of one seed."""
    from dael_plugin.tools.collect import main as collect

    for engine, extra in (("builtin", ""), ("dassl", "INPUT:\n  K_TRANSFORMS: 1\n")):
        d = tmp_path / engine / "seed1"
        d.mkdir(parents=True)
        rec = {
            "dataset": "EmbeddedDigits",
            "trainer": "DAEL",
            "target_domains": ["blend"],
            "seed": 1,
            "accuracy": 70.0 if engine == "builtin" else 71.0,
            "engine": engine,
            "provenance": {"config": "OPTIM:\n  MAX_EPOCH: 15\n" + extra} if saved_config else {},
        }
        (d / "results.json").write_text(json.dumps(rec))
    assert collect([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| DAEL [engine=builtin] | 70.00" in out and "| DAEL [engine=dassl] | 71.00" in out, out


def test_threads_follow_the_cpus_this_process_may_use(tmp_path, monkeypatch):
    """A container's CPU quota or an affinity mask caps torch's threads when OMP_NUM_THREADS is
    unset (torch's default follows the host's cores); OMP_NUM_THREADS, the user's or torchrun's,
    always wins."""
    import torch

    from dael_plugin.engine.execution import cpu_budget, pin_cpu_threads

    cg = tmp_path / "cgroup"
    cg.mkdir()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert cpu_budget(str(cg)) == (8, "8 CPUs in its affinity mask")  # no quota file: the mask
    (cg / "cpu.max").write_text("max 100000\n")
    assert cpu_budget(str(cg))[0] == 8
    (cg / "cpu.max").write_text("150000 100000\n")  # docker --cpus 1.5
    assert cpu_budget(str(cg)) == (2, "a CPU quota of 1.5 CPUs (cpu.max)")
    (cg / "cpu.max").unlink()
    (cg / "cpu").mkdir()
    (cg / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")  # cgroup v1, 3 CPUs
    (cg / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_budget(str(cg))[0] == 3
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        torch.set_num_threads(6)
        line = pin_cpu_threads(str(cg))
        assert torch.get_num_threads() == 3 and line.startswith("3 CPU threads (OMP_NUM_THREADS unset;"), line
        assert "quota of 3 CPUs" in line
        monkeypatch.setenv("OMP_NUM_THREADS", "5")
        torch.set_num_threads(5)
        assert pin_cpu_threads(str(cg)) == "5 CPU threads (OMP_NUM_THREADS=5)" and torch.get_num_threads() == 5
    finally:
        torch.set_num_threads(before)


def test_a_worker_stopped_by_sigterm_first_is_the_same_stop(tmp_path, monkeypatch, capsys):
    """The order the group-wide SIGTERM above cannot force: torch's error for a worker killed by
    SIGTERM reaches the main process first. Exit 143 and the one line, as for the main's own."""
    from dael_plugin.tools import train

    def stopped(args, state):
        raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Terminated. ")

    monkeypatch.setattr(train, "_main", stopped)
    assert train.main(["--output-dir", str(tmp_path / "o")]) == 143
    assert capsys.readouterr().err.strip().startswith("terminated (SIGTERM): ")
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # main's handlers are given back

    def crashed(args, state):
        raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Segmentation fault. ")

    monkeypatch.setattr(train, "_main", crashed)
    with pytest.raises(RuntimeError, match="Segmentation fault"):  # a real crash stays one
        train.main(["--output-dir", str(tmp_path / "o")])


@pytest.mark.parametrize("pending", ["worker", "sigterm"])
def test_a_signal_pending_while_stopping_does_not_break_the_stop(monkeypatch, pending):
    """``signal.signal`` runs the handlers of signals already pending before it swaps one: torch's
    SIGCHLD check raised the worker's error from the very call that was to silence it (seen in CI:
    exit 1 and a traceback instead of 143). Here the first swap raises what the pending handler
    would; the stop retries and ends with both handlers swapped."""
    from dael_plugin.errors import Terminated
    from dael_plugin.tools import train_stops

    real = signal.signal
    saved = {s: signal.getsignal(s) for s in (signal.SIGCHLD, signal.SIGTERM)}
    calls = []

    def swap(signum, handler):
        calls.append(signum)
        if len(calls) == 1:
            if pending == "worker":
                raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Terminated. ")
            raise Terminated(signal.SIGTERM)
        return real(signum, handler)

    monkeypatch.setattr(signal, "signal", swap)
    try:
        train_stops.stop_listening(None)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGCHLD) is signal.SIG_DFL and len(calls) == 3
    finally:
        for s, h in saved.items():
            real(s, h)


SWALLOWED = """
import signal, sys, time, weakref
from dael_plugin.errors import Terminated
from dael_plugin.tools.train_stops import raise_terminated, redeliver_swallowed_stops
signal.signal(signal.SIGTERM, raise_terminated)
if sys.argv[1] == "hook":
    sys.unraisablehook = redeliver_swallowed_stops
class A:
    pass
a = A()
def landed_here(_):
    raise Terminated(15)  # the handler's exception, as when SIGTERM lands inside a weakref callback
ref = weakref.ref(a, landed_here)
try:
    del a
    for _ in range(100):
        time.sleep(0.01)
    print("went on")
except Terminated:
    print("stopped")
"""


@pytest.mark.parametrize("hook", ["hook", "none"])
def test_a_sigterm_inside_a_weakref_callback_still_stops_the_run(hook):
    """A SIGTERM whose handler fires inside a finalizer or weakref callback raises where Python
    swallows exceptions: it printed "Exception ignored" with a traceback and the run went on (a
    torchrun rank stopped so, seen in CI). train.py's unraisable hook sends the signal again, and the
    run's own code stops; without it (the second case) the run goes on, as before."""
    import subprocess
    import sys

    from conftest import ROOT

    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", SWALLOWED, hook], capture_output=True, text=True, env=env, timeout=60)
    if hook == "hook":
        assert proc.stdout.strip() == "stopped" and "Exception ignored" not in proc.stderr, proc.stderr
    else:
        assert proc.stdout.strip() == "went on" and "Exception ignored" in proc.stderr
