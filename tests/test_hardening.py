"""Issue 7: no code from checkpoints, exact resume, loud failures, bad data named.

These run on the built-in engine (so they also run without Dassl); the Dassl
engine's counterparts are in ``test_dassl_hardening.py``.
"""

import collections
import contextlib
import json
import multiprocessing
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import ROOT, run_here

DS_DA = os.path.join(ROOT, "configs/datasets/da/embedded_digits.yaml")
DS_DG = os.path.join(ROOT, "configs/datasets/dg/embedded_digits_dg.yaml")
DAEL_CFG = os.path.join(ROOT, "configs/trainers/da/dael/embedded_digits.yaml")
FAST = [
    # no per-epoch records, which the default writes on this small set (tests/test_selection.py covers them)
    "SELECTION.EVAL_FREQ",
    "0",
    "DATALOADER.NUM_WORKERS",
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


def args_for(root, out, epochs=1, trainer="DAEL", ds=DS_DA, cfg=DAEL_CFG, extra=(), flags=()):
    """train.py arguments: ``flags`` go before the trailing KEY VALUE opts, ``extra`` after."""
    return (
        [
            "--engine",
            "builtin",
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


def cli(argv, capsys):
    from dael_plugin.tools.train import main

    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def one_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


def finished(argv):
    """A run to its end in this process (``run_here``): the uninterrupted reference of a kill -9
    test, or its resume. Only the run that is killed needs a process of its own (4 s of imports)."""
    from conftest import run_here

    done = run_here(argv)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def spawn(argv, **kw):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "scripts", "train.py")] + argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def weights(out):
    return torch.load(os.path.join(out, "checkpoint.pth.tar"), weights_only=True)["model"]


def wait_for(path, text, proc, timeout=120):
    t = time.time()
    while time.time() - t < timeout:
        if os.path.exists(path) and text in open(path).read():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def wait_for_checkpoint(out, epoch, proc, timeout=120):
    """Until ``out/checkpoint.pth.tar`` holds ``epoch`` finished epochs (written atomically)."""
    path = os.path.join(str(out), "checkpoint.pth.tar")
    t = time.time()
    while time.time() - t < timeout:
        if os.path.exists(path):
            try:
                if torch.load(path, weights_only=True)["epoch"] >= epoch:
                    return True
            except (RuntimeError, EOFError, OSError):
                pass
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


# -- 2. exact resume -----------------------------------------------------------
@pytest.mark.parametrize("engine", ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)])
def test_resume_after_kill_9_is_bitwise_exact_with_persistent_workers(tmp_path, tiny_root, engine):
    """Killed with SIGKILL once epoch 1's checkpoint is written and rerun, the run ends with the
    same weights, accuracy, per-epoch records (epochs.jsonl, byte for byte) and chosen model as
    an uninterrupted one, on both engines. Both use 2 persistent loader workers, whose random
    state drifts over epochs: only per-draw seeding makes the resumed run's fresh workers draw
    the same augmentations (Dassl's RandomDomainSampler draws from Python's random: its state is
    restored at the epoch boundary). Epoch 2's record may or may not be on disk when the kill lands."""
    if engine == "dassl":
        pytest.importorskip("dassl")
    extra = ["DATALOADER.NUM_WORKERS", "2", "SELECTION.EVAL_FREQ", "1", "SELECTION.TARGET_CAP", "40"]
    extra += ["SELECTION.KEEP_BEST", "['source_val']"]

    def argv(out):
        a = args_for(tiny_root, out, epochs=3, extra=extra)
        a[a.index("--engine") + 1] = engine
        return a

    full, killed = tmp_path / "full", tmp_path / "killed"
    finished(argv(full))
    proc = spawn(argv(killed))
    assert wait_for_checkpoint(killed, 1, proc), "never finished epoch 1"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert not (killed / "results.json").exists(), "killed too late to test a resume"
    assert json.loads((killed / ".dael_run.json").read_text())["pid"] == proc.pid  # left behind by kill -9

    out = finished(argv(killed)).stdout
    # Runs made in this process (run_here) stop their loaders' workers when they end, not at a later
    # garbage collection, which took 5 s a worker (train.main's release_loaders)
    assert multiprocessing.active_children() == []
    assert "removing a stale lock" in out
    assert "will resume training from epoch 2" in out or "will resume training from epoch 3" in out
    a, b = (torch.load(d / "checkpoint.pth.tar", weights_only=True) for d in (full, killed))
    a, b = a["model"], b["model"]
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ra = json.loads((full / "results.json").read_text())
    rb = json.loads((killed / "results.json").read_text())
    assert ra["accuracy"] == rb["accuracy"] and ra["expert_accuracy"] == rb["expert_accuracy"]
    assert (killed / "epochs.jsonl").read_text() == (full / "epochs.jsonl").read_text()
    best = "model-best-source_val.pth.tar"
    assert torch.load(full / best, weights_only=True)["epoch"] == torch.load(killed / best, weights_only=True)["epoch"]


def _stoppable_trainer(engine, out, root, prec, backbone):
    from test_gpu_stand_ins import _cfg, _trainer

    cfg = _cfg(out, root, engine, epochs=2)
    cfg.defrost()
    cfg.TRAINER.DAEL.PREC = prec
    if backbone:
        cfg.MODEL.BACKBONE.NAME = backbone
    else:
        # fp16 and bf16 on CPU are emulated: 16x16 views (the small CNN pools to 2x2 at any size)
        # make each step a quarter of the work; the scaler's state and its round trip are read here
        cfg.INPUT.SIZE = (16, 16)
    return _trainer(engine, cfg)


@pytest.mark.skipif(not hasattr(torch.amp, "GradScaler"), reason="fp16 loss scaling on CPU needs torch >= 2.3")
@pytest.mark.parametrize("prec, dropout", [("fp16", False), ("bf16", False), ("fp32", True)])
@pytest.mark.parametrize("engine", ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)])
def test_a_run_stopped_and_resumed_ends_bit_for_bit(tmp_path, tiny_root, engine, prec, dropout, request):
    """Stopped at epoch 2's checkpoint write and resumed, in-process, a run ends with the
    uninterrupted run's weights, bit for bit:
    - fp16's loss scaler is part of the run: by the end of epoch 1 its scale has left 2^16 (the first
      steps overflow), the checkpoint holds it, and the resumed run goes on from that scale, not from
      2^16; bf16 has no scaler (none in the checkpoint);
    - a backbone with dropout draws from torch's global generator (the views and samplers draw from
      generators seeded per draw): the checkpoint's RNG states put it back (without them the weights
      differ, broken by hand).
    The ``kill -9`` resume of a process, with its stale lock and fresh loader workers, is
    test_resume_after_kill_9_is_bitwise_exact_with_persistent_workers (fp32, both engines)."""
    backbone = request.getfixturevalue("dropout_cnn") if dropout else None
    if engine == "dassl":
        pytest.importorskip("dassl")
    from dael_plugin.engine import checkpoint as ckpt

    whole = _stoppable_trainer(engine, tmp_path / "whole", tiny_root, prec, backbone)
    whole.train()
    cut = _stoppable_trainer(engine, tmp_path / "cut", tiny_root, prec, backbone)
    hooked = getattr(cut, "method", cut)  # the Dassl engine's trainer hosts the method
    real, calls = hooked.checkpointer.save, []

    def stopped_at_the_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("stopped")
        return real(*a, **k)

    hooked.checkpointer.save = stopped_at_the_second  # the hook's own save (engine/hooks.py)
    with pytest.raises(KeyboardInterrupt):
        cut.train()
    path = tmp_path / "cut" / ckpt.LAST
    saved = ckpt.load_checkpoint(str(path))
    assert saved["epoch"] == 1
    if prec == "fp16":
        assert saved["scaler"]["scale"] < 2.0**16  # the scale moved, and was saved
    else:
        assert "scaler" not in saved
    again = _stoppable_trainer(engine, tmp_path / "cut", tiny_root, prec, backbone)
    again.train()
    a = ckpt.load_checkpoint(str(tmp_path / "whole" / ckpt.LAST))
    b = ckpt.load_checkpoint(str(path))
    assert a["epoch"] == b["epoch"] == 2 and a.get("scaler") == b.get("scaler")
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())


def test_worker_count_does_not_change_a_run(tmp_path, tiny_root, capsys):
    a, b = tmp_path / "w0", tmp_path / "w2"
    assert cli(args_for(tiny_root, a, epochs=1), capsys)[0] == 0
    assert cli(args_for(tiny_root, b, epochs=1, extra=["DATALOADER.NUM_WORKERS", "2"]), capsys)[0] == 0
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize(
    "change,key",
    [
        (["OPTIM.LR", "0.2"], "OPTIM.LR"),
        (["OPTIM.MAX_EPOCH", "3"], "OPTIM.MAX_EPOCH"),
        (["TRAINER.DAEL.WEIGHT_U", "1.0"], "TRAINER.DAEL.WEIGHT_U"),
    ],
)
def test_resume_with_a_changed_config_is_refused(tmp_path, tiny_root, capsys, change, key):
    out = tmp_path / "run"
    assert cli(args_for(tiny_root, out, epochs=1), capsys)[0] == 0
    code, _, err = cli(args_for(tiny_root, out, epochs=1, extra=change), capsys)
    line = one_error_line(err)
    assert code == 2 and key in line and "--output-dir" in line and "checkpoint.pth.tar" in line
    # Where things are and how they are logged may change.
    code, out_, _ = cli(args_for(tiny_root, out, epochs=1, extra=["TRAIN.PRINT_FREQ", "7"]), capsys)
    assert code == 0


def test_lr_after_each_epoch_follows_the_cosine_schedule(tmp_path, tiny_root, capsys):
    """The scheduler steps once per epoch, including across a resume."""
    out = tmp_path / "lr"
    code, stdout, _ = cli(args_for(tiny_root, out, epochs=3), capsys)
    assert code == 0
    state = torch.load(out / "checkpoint.pth.tar", weights_only=True)
    assert state["sched"]["last_epoch"] == 3
    lrs = [
        float(line.rsplit("lr ", 1)[1])
        for line in stdout.splitlines()
        if line.startswith("epoch [") and " batches " in line
    ]
    base = 0.05  # the embedded DAEL config's OPTIM.LR
    expected = [base * (1 + np.cos(np.pi * e / 3)) / 2 for e in range(3)]
    assert lrs == pytest.approx(expected, rel=1e-4)


# -- 1. no code from checkpoints -----------------------------------------------
class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(directory, marker, real_state=None):
    os.makedirs(directory, exist_ok=True)
    state = dict(real_state) if real_state is not None else {"epoch": 1}
    state["extra"] = Evil(marker)
    torch.save(state, os.path.join(directory, "checkpoint.pth.tar"))


@pytest.mark.parametrize("how", ["resume", "eval_only", "rerun_into_dir", "real_plus_one_object"])
def test_a_checkpoint_with_pickled_code_is_refused(tmp_path, tiny_root, capsys, how):
    marker = tmp_path / "PWNED"
    victim = tmp_path / "victim"
    if how == "real_plus_one_object":
        good = tmp_path / "good"
        assert cli(args_for(tiny_root, good, epochs=1), capsys)[0] == 0
        _plant(victim, marker, torch.load(good / "checkpoint.pth.tar", weights_only=True))
        argv = args_for(tiny_root, tmp_path / "eval", flags=["--eval-only", "--model-dir", str(victim)])
    else:
        _plant(victim, marker)
        argv = {
            "resume": args_for(tiny_root, tmp_path / "new", flags=["--resume", str(victim)]),
            "eval_only": args_for(tiny_root, tmp_path / "eval", flags=["--eval-only", "--model-dir", str(victim)]),
            "rerun_into_dir": args_for(tiny_root, victim),
        }[how]
    code, _, err = cli(argv, capsys)
    line = one_error_line(err)
    assert code == 2 and "refusing to load" in line and str(victim / "checkpoint.pth.tar") in line
    assert not marker.exists()


def test_eval_only_needs_a_model_dir_and_never_reads_the_cwd(tmp_path, tiny_root, capsys, monkeypatch):
    marker = tmp_path / "PWNED"
    _plant(tmp_path, marker)  # ./checkpoint.pth.tar in the current directory
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(args_for(tiny_root, tmp_path / "eval", flags=["--eval-only"]), capsys)
    assert code == 2 and "--model-dir" in one_error_line(err) and not marker.exists()


def test_truncated_checkpoint_is_one_line_naming_the_file(tmp_path, tiny_root, capsys):
    out = tmp_path / "run"
    assert cli(args_for(tiny_root, out, epochs=1), capsys)[0] == 0
    path = out / "checkpoint.pth.tar"
    path.write_bytes(path.read_bytes()[:5000])
    code, _, err = cli(args_for(tiny_root, out, epochs=1), capsys)
    line = one_error_line(err)
    assert code == 2 and str(path) in line and "truncated or corrupt" in line


def test_eval_only_writes_its_own_record_with_the_checkpoints_epoch(tmp_path, tiny_root, capsys):
    out = tmp_path / "run"
    assert cli(args_for(tiny_root, out, epochs=2), capsys)[0] == 0
    before = (out / "results.json").read_text()
    code, _, _ = cli(
        args_for(tiny_root, out, epochs=15, flags=["--eval-only", "--model-dir", str(out), "--load-epoch", "2"]), capsys
    )
    assert code == 0
    assert (out / "results.json").read_text() == before
    rec = json.loads((out / "results_eval.json").read_text())
    assert rec["eval_only"] and rec["epochs"] == 2 and rec["accuracy"] == json.loads(before)["accuracy"]


@pytest.mark.parametrize("engine", ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)])
def test_eval_only_of_weights_that_do_not_fit_is_one_line(tmp_path, tiny_root, capsys, engine):
    """--eval-only of a run's own checkpoint whose expert heads lost a key (a file edited or cut
    by hand): one line naming the file on both engines (engine/checkpoint.load_weights), never
    load_state_dict's traceback."""
    if engine == "dassl":
        pytest.importorskip("dassl")
    import torch

    from dael_plugin.engine import checkpoint as ckpt

    out = tmp_path / "run"
    argv = args_for(tiny_root, out)
    argv[argv.index("builtin")] = engine
    assert cli(argv, capsys)[0] == 0
    flags = ["--eval-only", "--model-dir", str(out)]
    path = out / ckpt.LAST
    state = torch.load(path, map_location="cpu", weights_only=True)
    heads = state["model"]
    heads.pop(next(k for k in heads if "E." in k or k.startswith(("linears", "weight", "w"))))
    torch.save(state, path)
    evaluate = args_for(tiny_root, tmp_path / "eval", flags=flags)
    evaluate[evaluate.index("builtin")] = engine
    code, _, err = cli(evaluate, capsys)
    line = one_error_line(err)
    assert code == 2 and "does not fit" in line and str(path) in line, err


# -- 3. loud failures ----------------------------------------------------------
def test_divergence_stops_with_nan_line_and_keeps_the_last_good_checkpoint(tmp_path, tiny_root, capsys):
    """Epoch 1 trains at lr 0.05; the step schedule then multiplies it by 1e7."""
    out = tmp_path / "nan"
    blowup = ["OPTIM.LR_SCHEDULER", "multi_step", "OPTIM.STEPSIZE", "(1,)", "OPTIM.GAMMA", "1e7"]
    code, _, err = cli(args_for(tiny_root, out, epochs=3, extra=blowup), capsys)
    line = one_error_line(err)
    assert code == 3 and "NaN/inf" in line and "epoch 2" in line and "learning rate" in line
    assert "checkpoint.pth.tar (epoch 1)" in line
    assert not (out / "results.json").exists()
    assert json.loads((out / "failed.json").read_text())["failed"] is True
    state = torch.load(out / "checkpoint.pth.tar", weights_only=True)
    assert state["epoch"] == 1 and all(
        torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point()
    )
    # MultiStepLR keeps its milestones in a Counter, which torch < 2.4 refuses in a weights-only load:
    # the checkpoint holds a dict instead (and the scheduler gets its Counter back on resume).
    assert not _holds(state, collections.Counter)


def _holds(obj, cls) -> bool:
    if isinstance(obj, cls):
        return True
    if isinstance(obj, dict):
        return any(_holds(v, cls) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_holds(v, cls) for v in obj)
    return False


HOLDER = """
import json, os, socket, sys, time
from dael_plugin.engine.runlock import RunLock
lock = RunLock(sys.argv[1], settings=sys.argv[2] if len(sys.argv) > 2 else None).acquire()
print("held", flush=True)
time.sleep(60)
"""


@contextlib.contextmanager
def held(out, settings=None):
    """Another live process holding ``out``'s run lock (with ``settings``' digest, if given)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [sys.executable, "-c", HOLDER, str(out)] + ([settings] if settings else [])
    holder = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_a_live_run_holds_its_output_directory(tmp_path, tiny_root, capsys):
    """The kernel's lock: a live holder refuses a second run (exit 75, 'try again later'); a holder
    killed with -9 releases it with its file descriptor, and the next run takes over."""
    out = tmp_path / "busy"
    out.mkdir()
    with held(out) as holder:
        code, _, err = cli(args_for(tiny_root, out), capsys)
        assert code == 75 and f"in use by a live run (pid {holder.pid}" in one_error_line(err)
    code, stdout, _ = cli(args_for(tiny_root, out), capsys)  # the holder died without releasing anything
    assert code == 0 and f"removing a stale lock of pid {holder.pid}" in stdout
    assert not (out / ".dael_run.json").exists()
    (out / ".dael_run.lock").unlink()
    (out / ".dael_run.lock").mkdir()  # a lock path that is a folder: one line, no traceback
    code, _, err = cli(args_for(tiny_root, out), capsys)
    assert code == 2 and "is a directory" in one_error_line(err)


def test_a_live_run_of_other_settings_is_named_as_such(tmp_path, tiny_root, capsys):
    """Two sweeps of other trailing options on one folder: the second run is told that the live one
    is another run (exit 78: waiting will not help), not that it is "running elsewhere"."""
    from dael_plugin.errors import EXIT_CLASH

    out = tmp_path / "busy"
    out.mkdir()
    with held(out, settings="0123456789abcdef"):
        code, _, err = cli(args_for(tiny_root, out), capsys)
        line = one_error_line(err)
        assert code == EXIT_CLASH == 78 and "in use by a live run with other settings" in line
        assert "pass another --output-dir" in line


RACER = """
import os, sys, time
from dael_plugin.errors import DAELConfigError
from dael_plugin.engine.runlock import RunLock
folder, rounds = sys.argv[1], int(sys.argv[2])
held = both = 0
for _ in range(rounds):
    try:
        lock = RunLock(folder).acquire()
    except DAELConfigError:
        continue
    try:
        fd = os.open(os.path.join(folder, "holder"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        both += 1  # another process holds the lock at the same time
    else:
        held += 1
        time.sleep(0.001)
        os.close(fd)
        os.remove(os.path.join(folder, "holder"))
    lock.release()
print(held, both)
"""


def test_processes_racing_for_the_lock_never_hold_it_together(tmp_path):
    """Four processes acquiring at once, 150 rounds each: the old create-then-write lock let two
    hold it in about 10% of rounds."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(tmp_path), "150"], stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(4)
    ]
    results = [tuple(int(v) for v in p.communicate(timeout=120)[0].split()) for p in procs]
    assert sum(h for h, _ in results) > 0 and sum(b for _, b in results) == 0, results


def test_ctrl_c_exits_cleanly_naming_the_last_checkpoint(tmp_path, tiny_root):
    out = tmp_path / "int"
    # 2000 epochs: the run cannot finish before the signal, however loaded the machine (with 50
    # it once did, and exited 0)
    # Started with SIGINT ignored, as a background job of a script (and a pytest-xdist worker's
    # children) are: the run must still stop on it.
    proc = spawn(args_for(tiny_root, out, epochs=2000), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert wait_for(str(out / "log.txt"), "epoch [2/2000] batch [3/", proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted: the last checkpoint is ") and "checkpoint.pth.tar (epoch" in last
    assert "Traceback" not in err and not (out / ".dael_run.json").exists()


# -- 4. bad data ---------------------------------------------------------------
@pytest.fixture()
def damaged_root(tiny_root, tmp_path):
    root = tmp_path / "damaged"
    shutil.copytree(tiny_root, root)
    base = root / "embedded_digits"
    bad = []
    zero = base / "hand" / "train" / "3" / "zero.png"
    zero.write_bytes(b"")
    good = sorted((base / "blend" / "train" / "5").glob("*.png"))[0].read_bytes()
    trunc = base / "blend" / "train" / "5" / "truncated.png"
    trunc.write_bytes(good[: len(good) // 2])
    text = base / "font" / "train" / "1" / "notes.png"
    text.write_text("not an image")
    # Entries that are not regular files: opening a FIFO blocks until a writer comes, /dev/zero
    # never ends, and Dassl's Datum asserted os.path.isfile on each of them.
    fifo = base / "hand" / "train" / "4" / "fifo.png"
    os.mkfifo(fifo)
    device = base / "blend" / "train" / "2" / "device.png"
    device.symlink_to("/dev/zero")
    folder = base / "font" / "train" / "7" / "folder.png"
    folder.mkdir()
    bad = [str(zero), str(trunc), str(text), str(fifo), str(device), str(folder)]
    return str(root), bad


def test_unreadable_images_are_named_replaced_and_counted(damaged_root, tmp_path, capsys):
    root, bad = damaged_root
    out = tmp_path / "run"
    # The plugin's CyclingDomainSampler reads every image of every source domain in one epoch
    # (Dassl's RandomDomainSampler leaves each domain's last images short of a chunk unread).
    cycling = ["DATALOADER.TRAIN_X.SAMPLER", "CyclingDomainSampler"]
    code, stdout, err = cli(args_for(root, out, epochs=1, extra=cycling), capsys)
    assert code == 0, err
    for p in bad:
        assert f"cannot decode {p}; replaced by another image of the same domain" in stdout
    rec = json.loads((out / "results.json").read_text())
    assert rec["unreadable_images"] == len(bad) and sorted(rec["unreadable_image_paths"]) == sorted(bad)


def test_check_data_lists_bad_files_and_exits_non_zero(damaged_root, tmp_path, capsys):
    root, bad = damaged_root
    code, _, err = cli(args_for(root, tmp_path / "chk", flags=["--check-data"]), capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert sorted(line.split(" (")[0].replace("bad image: ", "") for line in lines[:-1]) == sorted(bad)
    assert lines[-1].startswith(f"error: --check-data: {len(bad)} of ")
    assert not (tmp_path / "chk" / "checkpoint.pth.tar").exists()  # stopped before training


def test_check_data_passes_on_good_data(tiny_root, tmp_path, capsys):
    code, stdout, _ = cli(args_for(tiny_root, tmp_path / "ok", flags=["--check-data"]), capsys)
    assert code == 0 and "--check-data: all" in stdout


@pytest.mark.parametrize(
    "damage,message",
    [
        ("empty_class", "holds no images"),
        ("missing_class", "classes differ between domains"),
    ],
)
def test_layout_errors_before_training(tiny_root, tmp_path, capsys, damage, message):
    root = tmp_path / "layout"
    shutil.copytree(tiny_root, root)
    cls = root / "embedded_digits" / "blend" / "train" / "7"
    if damage == "empty_class":
        for f in cls.glob("*.png"):
            f.unlink()
    else:
        shutil.rmtree(cls)
    code, _, err = cli(args_for(str(root), tmp_path / "out"), capsys)
    line = one_error_line(err)
    assert code == 2 and message in line
    assert (str(cls) in line) if damage == "empty_class" else (str(cls.parent) in line and "['7']" in line)


def test_a_domain_smaller_than_its_batch_share_is_refused_by_dassls_sampler_and_cycled_by_the_plugins(
    tiny_root, tmp_path, capsys
):
    big = ["DATALOADER.TRAIN_X.BATCH_SIZE", "192"]
    code, _, err = cli(args_for(tiny_root, tmp_path / "dassl", extra=big), capsys)
    line = one_error_line(err)
    assert code == 2 and "source domain 'hand' has 60 training images, fewer than its per-batch share of 64" in line
    assert "CyclingDomainSampler" in line
    cycling = big + ["DATALOADER.TRAIN_X.SAMPLER", "CyclingDomainSampler"]
    code, stdout, _ = cli(args_for(tiny_root, tmp_path / "cycling", extra=cycling), capsys)
    assert code == 0
    assert "warning: source domain 'hand' has 60 training images, fewer than its per-batch share of 64" in stdout
    assert "CyclingDomainSampler: 1 batches per epoch (every image of the largest source domain once" in stdout


@pytest.mark.parametrize("mode", ["I;16", "RGBA", "P", "L", "LA", "CMYK"])
def test_images_in_other_modes_decode_to_rgb(tmp_path, mode):
    from dael_plugin.data.images import decode

    arr = (np.arange(64).reshape(8, 8) * 4).astype(np.uint8)
    if mode == "I;16":
        img = Image.fromarray(arr.astype(np.uint16) * 257)  # a 16-bit grey image
    else:
        img = Image.fromarray(arr, "L").convert(mode)
    path = tmp_path / f"x_{mode.replace(';', '')}.{'png' if mode != 'CMYK' else 'jpg'}"
    img.save(path)
    out = decode(str(path))
    assert out.mode == "RGB" and out.size == (8, 8)
    g = np.asarray(out)[..., 0].astype(int)
    assert g.max() - g.min() > 100  # the content survives, not a blank or saturated image


# -- 5. every bad input: one error line, exit 2 ---------------------------------
def _bad_files(tmp_path):
    (tmp_path / "notyaml.yaml").write_text("OPTIM: [unclosed\n  LR: 0.1\n")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00\x81garbage")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "deep.yaml").write_text("INPUT:\n  TRANSFORMS: " + "[" * 500 + "]" * 500 + "\n")  # a RecursionError
    (tmp_path / "nan.yaml").write_text("TRAINER:\n  DAEL:\n    WEIGHT_OTHER: .nan\n")  # YAML's NaN passed ">= 0"
    # "billion laughs": nine levels of aliases, a few hundred bytes that yacs expanded to gigabytes (a hang)
    laughs = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    laughs += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    (tmp_path / "laughs.yaml").write_text("INPUT:\n  TRANSFORMS: *a9\n".join(["\n".join(laughs) + "\n", ""]))
    (tmp_path / "twice.yaml").write_text("OPTIM:\n  LR_SCHEDULER: cosine\nOPTIM:\n  LR: 0.01\n")
    if not (tmp_path / "fifo.yaml").exists():
        os.mkfifo(tmp_path / "fifo.yaml")


BAD = [
    ("MAX_EPOCH 0", ["OPTIM.MAX_EPOCH", "0"], "OPTIM.MAX_EPOCH=0 is invalid"),
    ("MAX_EPOCH -1", ["OPTIM.MAX_EPOCH", "-1"], "OPTIM.MAX_EPOCH=-1 is invalid"),
    ("BATCH_SIZE 0", ["DATALOADER.TRAIN_X.BATCH_SIZE", "0"], "DATALOADER.TRAIN_X.BATCH_SIZE=0 is invalid"),
    ("BATCH_SIZE -4", ["DATALOADER.TRAIN_X.BATCH_SIZE", "-4"], "DATALOADER.TRAIN_X.BATCH_SIZE=-4 is invalid"),
    ("test BATCH_SIZE 0", ["DATALOADER.TEST.BATCH_SIZE", "0"], "DATALOADER.TEST.BATCH_SIZE=0 is invalid"),
    ("LR 0", ["OPTIM.LR", "0.0"], "OPTIM.LR=0.0 is invalid"),
    ("WEIGHT_U 1e300", ["TRAINER.DAEL.WEIGHT_U", "1e300"], "TRAINER.DAEL.WEIGHT_U must be a number from 0 to 10000"),
    (
        "KEEP_BEST a validator not computed",
        ["SELECTION.KEEP_BEST", "('snd',)", "SELECTION.VALIDATORS", "('im',)"],
        "SELECTION.KEEP_BEST keeps the choice of ['snd'], which SELECTION.VALIDATORS ['im'] does not compute",
    ),
    ("flag after opts", ["--seed", "4"], "flag --seed comes after the trailing KEY VALUE options"),
    (
        "MAX_EPOCH 10^20",
        ["OPTIM.MAX_EPOCH", "100000000000000000000"],
        "OPTIM.MAX_EPOCH=100000000000000000000 is invalid",
    ),
    ("BATCH_SIZE 3e12", ["DATALOADER.TRAIN_X.BATCH_SIZE", "3000000000000"], "must be an integer from 1 to 65536"),
    ("SEED 10^11", ["SEED", "99999999999"], "SEED=99999999999 is invalid"),
    ("INPUT.SIZE one number", ["INPUT.SIZE", "(32,)"], "INPUT.SIZE=(32,) is invalid: (height, width)"),
    # 1.2 TiB for one view of one source batch: a loader would fill memory image by image
    ("INPUT.SIZE beyond memory", ["INPUT.SIZE", "(32768, 32768)"], "GiB of host memory for one view of one source"),
]


def test_the_input_size_check_against_hand_worked_memory():
    """One float32 view of a 96-image source batch at 8192x8192: 96 * 3 * 8192**2 * 4 bytes = 72.0 GiB."""
    from dael_plugin.config.defaults import get_builtin_cfg
    from dael_plugin.config.keys import check_input_size
    from dael_plugin.errors import DAELConfigError

    cfg = get_builtin_cfg()
    cfg.INPUT.SIZE, cfg.DATALOADER.TRAIN_X.BATCH_SIZE = (8192, 8192), 96
    with pytest.raises(DAELConfigError, match=r"needs at least 72.0 GiB .* has 16.0 GiB available"):
        check_input_size(cfg, available=16 * 2**30)
    cfg.DATALOADER.NUM_WORKERS = 0
    check_input_size(cfg, available=72 * 2**30)  # exactly enough
    with pytest.raises(DAELConfigError):
        check_input_size(cfg, available=72 * 2**30 - 1)
    # The loaders: 2 processes x 3 steps (2 ready, 1 being built) x 2 views x (96 + 32) images of
    # 3 x 1024 x 1024 floats = 18.0 GiB, plus one view of the source batch in the run, 1.125 GiB.
    cfg.INPUT.SIZE, cfg.DATALOADER.NUM_WORKERS, cfg.TRAINER.NAME = (1024, 1024), 2, "DAEL"
    cfg.DATALOADER.TRAIN_U.SAME_AS_X, cfg.DATALOADER.TRAIN_U.BATCH_SIZE = False, 32
    cfg.DATASET.TARGET_DOMAINS = ["blend"]
    with pytest.raises(DAELConfigError, match=r"the loader processes hold 18.0 GiB .* has 19.0 GiB available"):
        check_input_size(cfg, available=19 * 2**30)
    check_input_size(cfg, available=19 * 2**30 + 2**27)  # 19.125 GiB: exactly enough
    cfg.TRAINER.NAME = "SourceOnly"  # one view, no target batch: 2 x 3 x 96 images, 6.75 GiB
    check_input_size(cfg, available=int(7.875 * 2**30))
    with pytest.raises(DAELConfigError, match="hold 6.8 GiB"):
        check_input_size(cfg, available=int(7.875 * 2**30) - 1)


@pytest.mark.parametrize("case,opts,message", BAD, ids=[c[0] for c in BAD])
def test_bad_values_are_one_error_line(tmp_path, tiny_root, capsys, case, opts, message):
    code, _, err = cli(args_for(tiny_root, tmp_path / "o") + opts, capsys)
    assert code == 2 and message in one_error_line(err)
    assert not (tmp_path / "o").exists()  # refused before anything was written


BAD_FILES = [
    ("not YAML", lambda t: ["--config-file", str(t / "notyaml.yaml")], "is not valid YAML at line"),
    ("YAML list", lambda t: ["--config-file", str(t / "list.yaml")], "holds a list, not a mapping"),
    ("binary file", lambda t: ["--config-file", str(t / "binary.yaml")], "cannot be read"),
    ("missing file", lambda t: ["--config-file", str(t / "nope.yaml")], "not found"),
    ("YAML aliases", lambda t: ["--config-file", str(t / "laughs.yaml")], "an alias (*a0): config files are read"),
    ("a key twice", lambda t: ["--config-file", str(t / "twice.yaml")], "the key 'OPTIM' appears twice"),
    ("a FIFO", lambda t: ["--config-file", str(t / "fifo.yaml")], "is not a regular file"),
    ("YAML nested 500 deep", lambda t: ["--config-file", str(t / "deep.yaml")], "nested more than 32 levels deep"),
    ("YAML NaN weight", lambda t: ["--config-file", str(t / "nan.yaml")], "WEIGHT_OTHER must be a number from 0"),
    ("output dir is a file", lambda t: ["--output-dir", str(t / "afile")], "exists and is not a directory"),
    ("output dir cannot be made", lambda t: ["--output-dir", str(t / "afile" / "sub")], "cannot be created"),
    ("--select without --eval-only", lambda t: ["--select", "im"], "--select im goes with --eval-only"),
    (
        "--select an unknown protocol",
        lambda t: ["--eval-only", "--model-dir", str(t), "--select", "last"],
        "not a protocol that keeps a model",
    ),
    (
        "--select and --load-epoch",
        lambda t: ["--eval-only", "--model-dir", str(t), "--select", "im", "--load-epoch", "2"],
        "pass one",
    ),
    (
        "--select a model the run did not keep",
        lambda t: ["--eval-only", "--model-dir", str(t), "--select", "bnm"],
        "that run kept no model for --select bnm",
    ),
]


@pytest.mark.parametrize("case,flag,message", BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_bad_files_and_folders_are_one_error_line(tmp_path, tiny_root, capsys, case, flag, message):
    _bad_files(tmp_path)
    code, _, err = cli(args_for(tiny_root, tmp_path / "o", flags=flag(tmp_path)), capsys)  # later flags win
    assert code == 2 and message in one_error_line(err)


TYPOS = [
    ("builtin", ["OPTIM.MAX_EPOHC", "2"], "did you mean OPTIM.MAX_EPOCH?"),
    ("builtin", ["OPTIM.SOMETHING_ELSE", "2"], "OPTIM.SOMETHING_ELSE, which is not a config key"),
    ("builtin", ["INPUT.NO_TRANSFORM", "True"], "one of Dassl's keys, which the built-in engine does not support"),
    pytest.param("dassl", ["OPTIM.MAX_EPOHC", "2"], "did you mean OPTIM.MAX_EPOCH?", marks=pytest.mark.dassl),
]


@pytest.mark.parametrize(
    "engine,opts,message", TYPOS, ids=["builtin typo", "builtin unknown", "builtin Dassl's key", "dassl typo"]
)
def test_a_key_typo_gets_the_hint_that_fixes_it(tmp_path, tiny_root, capsys, engine, opts, message):
    """A near miss is a typo: the hint is the spelling, never "install Dassl", on either engine."""
    argv = args_for(tiny_root, tmp_path / "o") + opts
    argv[argv.index("--engine") + 1] = engine
    code, _, err = cli(argv, capsys)
    line = one_error_line(err)
    assert code == 2 and message in line
    if "did you mean" in message:
        assert "install Dassl" not in line


def test_no_root_is_an_error_and_writes_nothing_into_the_cwd(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = args_for("", tmp_path / "o")
    argv = argv[: argv.index("--root")] + argv[argv.index("--root") + 2 :]
    code, _, err = cli(argv, capsys)
    assert code == 2 and "no dataset root given; pass --root DIR" in one_error_line(err)
    assert os.listdir(tmp_path) == []


# -- 7. logs -------------------------------------------------------------------
def test_redirected_logs_get_lines_not_progress_bars(tmp_path, tiny_root):
    out = tmp_path / "log"
    proc = run_here(args_for(tiny_root, out, epochs=1))  # stdout and stderr are not terminals
    stdout, stderr = proc.stdout, proc.stderr
    assert proc.returncode == 0, stderr[-2000:]
    log = (out / "log.txt").read_text()
    assert "\r" not in log and "\r" not in stderr and "it/s" not in stderr
    # The config dump goes to the log only; the terminal gets a summary and where the dump is.
    assert "** Config **" in log and "DATALOADER:" in log
    assert "** Config **" not in stdout and "DATALOADER:" not in stdout
    assert "DAEL on EmbeddedDigits: sources" in stdout and f"the whole config is in {out / 'log.txt'}" in stdout
    assert "epoch [1/1] batch [3/" in log and "epoch [1/1] batch [6/" in log  # every PRINT_FREQ=3 batches


def test_console_script_is_declared():
    import configparser

    cp = configparser.ConfigParser()
    cp.read(os.path.join(ROOT, "setup.cfg"))
    scripts = dict(line.split("=", 1) for line in cp["options.entry_points"]["console_scripts"].strip().splitlines())
    scripts = {k.strip(): v.strip() for k, v in scripts.items()}
    assert scripts["dael-train"] == "dael_plugin.tools.train:main"
    assert scripts["dael-demo"] == "dael_plugin.tools.demo:main"
    exe = shutil.which("dael-train")
    if exe:  # installed with pip install -e . (as `make test` does)
        proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "--check-data" in proc.stdout


_SPY = """
import gc, runpy, sys
from dael_plugin import startup
resume = startup.resume_after_imports
def spy():
    print("at main: collector paused", not gc.isenabled(), "torch imported", "torch" in sys.modules)
    resume()
    print("after: collector on", gc.isenabled(), "frozen", gc.get_freeze_count())
startup.resume_after_imports = spy
sys.argv = ["train", "--help"]
try:
    runpy.%s
except SystemExit:
    pass
"""


@pytest.mark.parametrize(
    "entry",
    ["run_path('scripts/train.py', run_name='__main__')", "run_module('dael_plugin.tools.train', run_name='__main__')"],
)
def test_a_training_process_imports_torch_with_the_gc_paused_then_freezes_and_resumes_it(entry):
    """Both ways a run starts a process (scripts/train.py, python -m dael_plugin.tools.train)
    pause the cyclic GC for their imports (a fifth of torch's import CPU), and main() freezes what
    they made and turns the collector back on: a run never trains with it off."""
    proc = subprocess.run([sys.executable, "-c", _SPY % entry], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "at main: collector paused True torch imported True" in proc.stdout, proc.stdout
    frozen = int(re.search(r"after: collector on True frozen (\d+)", proc.stdout).group(1))
    assert frozen > 100_000  # torch's and torchvision's objects, never scanned again


def test_main_called_from_python_leaves_the_gc_as_it_was(capsys):
    """In a notebook or a test, main() neither freezes the caller's objects (garbage in cycles,
    a finished trainer's among them, would then never be freed) nor changes the collector."""
    import gc

    from dael_plugin.tools import train

    frozen = gc.get_freeze_count()
    with pytest.raises(SystemExit):
        train.main(["--help"])
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    # Nor does importing scripts/train.py as a module (only its own process pauses the collector).
    runpy.run_path(os.path.join(ROOT, "scripts", "train.py"), run_name="train_script")
    assert gc.isenabled()


# -- 8. scientific validity ----------------------------------------------------
def test_daeldg_on_a_da_dataset_never_uses_target_data(tmp_path, tiny_root, capsys):
    out = tmp_path / "dg"
    code, stdout, _ = cli(
        args_for(
            tiny_root,
            out,
            trainer="DAELDG",
            cfg=os.path.join(ROOT, "configs/trainers/dg/daeldg/embedded_digits_dg.yaml"),
        ),
        capsys,
    )
    assert code == 0
    assert "setting DG" in stdout and "DAELDG runs domain generalisation: the target train split is unused" in stdout
    assert "loss_u" not in (out / "log.txt").read_text()
    code, stdout, _ = cli(args_for(tiny_root, tmp_path / "da"), capsys)
    assert code == 0 and "setting DA" in stdout and "loss_u" in stdout


def test_dassl_resnet_names_mean_torchvision_weights_on_the_builtin_engine():
    from dael_plugin.backbones import build_backbone

    m = build_backbone("resnet18", pretrained=False)
    assert m.model.pretrained_cfg["tag"] == "tv_in1k"
    assert build_backbone("resnet50", pretrained=False).model.pretrained_cfg["tag"] == "tv_in1k"


def test_pretrained_timm_without_a_local_file_fails_fast(monkeypatch):
    from dael_plugin.backbones import TimmBackbone
    from dael_plugin.backbones import timm_backbone as tb
    from dael_plugin.errors import DAELConfigError

    monkeypatch.setattr(tb, "host_resolves", lambda url: False)  # as on a machine without network
    t = time.time()
    with pytest.raises(DAELConfigError, match="MODEL.BACKBONE.WEIGHTS") as exc:
        TimmBackbone("resnet18", pretrained=True)
    assert time.time() - t < 10 and "\n" not in str(exc.value)


@pytest.mark.dassl
def test_dassls_own_pretrained_backbone_offline_is_one_line(tmp_path, tiny_root, monkeypatch):
    """Dassl's resnet18_ms_l123 with PRETRAINED True, its file (resnet18's) not in the torch hub cache
    and no network: one line naming the file and the cache, before the run's folder exists (Dassl's
    load_url stopped in a URLError traceback after the data was read)."""
    import torch

    from dael_plugin.backbones import timm_backbone as tb
    from dael_plugin.backbones.record import dassl_weights_url

    assert dassl_weights_url("resnet18_ms_l123") == dassl_weights_url("resnet18")
    assert dassl_weights_url("resnet18_dynamic_ms_l1").endswith("resnet18_dynamic-074db766.pth")  # the longest name
    monkeypatch.setattr(tb, "host_resolves", lambda url: False)  # as on a machine without network
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))  # an empty cache
    extra = ["MODEL.BACKBONE.NAME", "resnet18_ms_l123", "MODEL.BACKBONE.PRETRAINED", "True"]
    argv = args_for(tiny_root, tmp_path / "run", extra=extra)
    argv[argv.index("builtin")] = "dassl"
    proc = run_here(argv)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert "\n" not in line and "resnet18-5c106cde.pth" in line and str(tmp_path / "hub" / "checkpoints") in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("each_epoch", [False, True])
def test_test_split_is_honoured_and_each_epoch_prefers_val(tmp_path, tiny_root, capsys, each_epoch):
    dg_cfg = os.path.join(ROOT, "configs/trainers/dg/daeldg/embedded_digits_dg.yaml")
    extra = ["TEST.SPLIT", "val"]
    argv = args_for(tiny_root, tmp_path / "dg", trainer="DAELDG", ds=DS_DG, cfg=dg_cfg, extra=extra)
    if each_epoch:
        argv = args_for(tiny_root, tmp_path / "dg", trainer="DAELDG", ds=DS_DG, cfg=dg_cfg, flags=["--eval-each-epoch"])
    code, stdout, _ = cli(argv, capsys)
    assert code == 0
    evals = [line for line in stdout.splitlines() if line.startswith("Evaluate on the")]
    if each_epoch:
        assert evals == ["Evaluate on the *val* set", "Evaluate on the *test* set"]
    else:
        assert evals == ["Evaluate on the *val* set"]
    # A dataset without a validation split says so when each epoch reads the test split.
    code, stdout, _ = cli(args_for(tiny_root, tmp_path / "da", flags=["--eval-each-epoch"]), capsys)
    assert code == 0 and "there is no validation split, so --eval-each-epoch reads the target *test* split" in stdout


def test_n_domain_below_the_number_of_sources_trains_every_expert(tmp_path, tiny_root, capsys, monkeypatch):
    """Two of the three source domains per batch: each batch's chunks map to the
    right experts (checked on every step), and L_cr averages the K-1 = 2 other
    experts (Eq. 2), not only the one other domain present."""
    from dael_plugin.core import losses
    from dael_plugin.methods import dael as bt

    seen, others = [], []
    real_losses = bt.DAEL.losses
    real_cr = losses.consistency_loss

    def spy(self, x_views, labels, expert_idx, chunk_sizes, u_views=None):
        seen.append((tuple(chunk_sizes), sorted(set(expert_idx.tolist()))))
        return real_losses(self, x_views, labels, expert_idx, chunk_sizes, u_views)

    def spy_cr(target, pred_log_probs, expert_idx, mode="collaborative", kind="mse"):
        others.append(pred_log_probs.shape[1])
        return real_cr(target, pred_log_probs, expert_idx, mode, kind)

    monkeypatch.setattr(bt.DAEL, "losses", spy)
    monkeypatch.setattr(losses, "consistency_loss", spy_cr)
    code, stdout, _ = cli(
        args_for(
            tiny_root,
            tmp_path / "nd",
            extra=["DATALOADER.TRAIN_X.N_DOMAIN", "2", "DATALOADER.TRAIN_X.BATCH_SIZE", "16"],
        ),
        capsys,
    )
    assert code == 0
    assert seen and all(chunks == (8, 8) and len(experts) == 2 for chunks, experts in seen)
    assert {e for _, experts in seen for e in experts} == {0, 1, 2}  # every expert gets batches
    assert set(others) == {3}  # the consistency term sees all three experts' predictions


def test_bench_without_dassl_times_the_plugin_alone(tmp_path):
    """Without Dassl, scripts/bench.py times the plugin's own configurations, the built-in
    engine's epoch included (a trainer driven epoch by epoch, as the bench drives it), and says
    that the ratio needs Dassl's DAEL instead of failing."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, DAEL_PLUGIN_HIDE_DASSL="1", TMPDIR=str(scratch))
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
            "--no-launches",
            "--epoch",
            "--epoch-data",
            "synthetic",
            "--epoch-images",
            "10",  # one image per class and domain: one batch an epoch
            "--timed-epochs",
            "1",
            "--workers",
            "0",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "dael_plugin (built-in engine)" in proc.stdout and " images/s " in proc.stdout
    # Each epoch configuration is named before it runs (a run cut by its limit says which) and
    # reports its warm-up epoch apart (compilation on a GPU takes minutes there).
    assert re.search(r"^dael_plugin \(built-in engine\) +\(running: a warm-up epoch", proc.stderr, re.M)
    assert re.search(r"built-in engine\).*images/s .*warm-up epoch \d+\.\d s\)", proc.stdout)
    assert proc.stdout.strip().splitlines()[-1] == (
        "speedup_vs_dassl_dael: needs Dassl's DAEL as the reference (install Dassl; see README)"
    )
    # No stack on the way: a TensorBoard writer left open once wrote into its removed folder.
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    # The epochs' images and output folders are gone with the bench (they once piled up in /tmp).
    assert [p.name for p in scratch.iterdir() if p.name.startswith("dael_bench")] == []


def test_an_error_line_is_written_whole(monkeypatch, tmp_path):
    """Under torchrun every rank writes its error line to the same stderr. With
    PYTHONUNBUFFERED set, ``print`` writes the text and the newline apart, and two ranks'
    lines interleaved mid-line (seen once in CI). The line must reach stderr in one write."""
    from dael_plugin.tools import train

    writes = []

    class Recorder:
        def write(self, s):
            writes.append(s)
            return len(s)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Recorder())
    missing = str(tmp_path / "none.yaml")
    rc = train.main(["--root", str(tmp_path), "--trainer", "DAEL", "--dataset-config-file", missing,
                     "--output-dir", str(tmp_path / "out")])  # fmt: skip
    assert rc == 2
    errors = [w for w in writes if "error" in w]
    assert errors == [f"error: config file '{missing}' not found\n"], writes


@pytest.mark.parametrize("trainer,ds,cfg,key", [("DAELDG", DS_DG, "dg/daeldg", "TRAINER.DAEL.CLASS_MASKS")])
def test_a_key_of_the_other_dael_node_is_refused_not_ignored(tmp_path, tiny_root, capsys, trainer, ds, cfg, key):
    """TRAINER.DAEL.* set for a DAELDG run was read by no one, without a word: one line naming the key
    that run reads."""
    cfg = os.path.join(ROOT, f"configs/trainers/{cfg}/embedded_digits_dg.yaml")
    argv = args_for(tiny_root, tmp_path / "o", trainer=trainer, ds=ds, cfg=cfg, extra=[key, "['all']"])
    code, _, err = cli(argv, capsys)
    assert code == 2 and "set TRAINER.DAELDG.CLASS_MASKS instead" in one_error_line(err)


def test_a_holdout_fraction_that_rounds_to_nothing_is_one_line(tmp_path, tiny_root, capsys):
    """HOLDOUT_FRACTION 0.05 of 6 images per class rounds to 0 in every class: the run had no source
    validation split (or one without a domain), and the log said to set EVAL_FREQ 1, already set."""
    argv = args_for(tiny_root, tmp_path / "o", extra=["SELECTION.EVAL_FREQ", "1", "SELECTION.HOLDOUT_FRACTION", "0.05"])
    code, _, err = cli(argv, capsys)
    line = one_error_line(err)
    assert code == 2 and "SELECTION.HOLDOUT_FRACTION 0.05 holds out no image of source domain(s)" in line
    assert "at least 0.0833 holds out one image of its largest class (6 images)" in line


@pytest.mark.dassl
def test_a_dassl_engine_checkpoint_of_the_earlier_layout_resumes_bit_for_bit(tmp_path, tiny_root):
    """The Dassl engine's DAEL wrote its "last" checkpoint as ``models`` by name (``F``, ``E``) and
    no loader generators until it hosted the built-in method (2026-12-05); such a checkpoint resumes
    and the run ends with the uninterrupted run's weights, bit for bit (the draws are seeded per
    (seed, epoch, position), so the generators' state changes no batch)."""
    pytest.importorskip("dassl")
    from dael_plugin.engine import checkpoint as ckpt

    whole = _stoppable_trainer("dassl", tmp_path / "whole", tiny_root, "fp32", None)
    whole.train()
    cut = _stoppable_trainer("dassl", tmp_path / "cut", tiny_root, "fp32", None)
    real, calls = cut.method.checkpointer.save, []

    def stopped_at_the_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("stopped")
        return real(*a, **k)

    cut.method.checkpointer.save = stopped_at_the_second
    with pytest.raises(KeyboardInterrupt):
        cut.train()
    path = str(tmp_path / "cut" / ckpt.LAST)
    state = ckpt.load_checkpoint(path)
    model = state.pop("model")
    state["models"] = {n: {k[2:]: v for k, v in model.items() if k.startswith(n + ".")} for n in ("F", "E")}
    del state["data"]["loader_generators"]
    ckpt.save_checkpoint(state, path)
    again = _stoppable_trainer("dassl", tmp_path / "cut", tiny_root, "fp32", None)
    again.train()
    a, b = (ckpt.load_checkpoint(str(tmp_path / d / ckpt.LAST)) for d in ("whole", "cut"))
    assert a["epoch"] == b["epoch"] == 2 and "models" not in b
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())
