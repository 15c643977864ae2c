"""One run on several processes (torchrun, gloo on CPU, 2 processes): the same training run as
one process, per-domain synchronised batch norm, sharded evaluation, rank-0 writes, exact
resume after ``kill -9`` of the whole job, a rank that dies, and a resume with another N.

Tolerances: three steps on fixed batches agree within 1e-5 (measured 1e-6 to 3e-6 on the
2-core AMD EPYC VM). Over longer runs, float noise in the last bit (two processes sum a
chunk's statistics in another order than one) grows the way it grows between two
single-process variants of the same computation: after one epoch of the embedded set at
lr 0.001, the fused and the per-chunk single-process runs differ by 3.4e-2 in a weight, and
one against two processes by 3.1e-2 (docs/several_gpus.md). The CLI comparisons run one epoch
of the tiny set in 3 to 4 steps, where the drift stays under 1e-3 (measured 5e-5 to 8e-5).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from conftest import ROOT, run_here
from dael_plugin.engine import distributed
from dael_plugin.engine.distributed import BACKEND_ENV
from test_hardening import DAEL_CFG, DS_DA
from test_hardening import FAST as HARDENING_FAST

WORKER = os.path.join(ROOT, "tests", "ddp_worker.py")
TRAIN = os.path.join(ROOT, "scripts", "train.py")
# The embedded set's configs and the quick options of the CLI tests, at lr 0.001.
FAST = HARDENING_FAST + ["OPTIM.LR", "0.001"]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("DAEL_DIST_TIMEOUT", "60")
    # The default group refuses CPU tensors, as NCCL's does: a host value exchanged outside the host
    # group, or a device tensor outside the device group, fails here as it would on GPUs.
    env[BACKEND_ENV] = "cuda:gloo"
    return env


FORKED = os.path.join(ROOT, "tests", "forked_torchrun.py")
# torchrun's own flags: each worker forked from the launcher, the script run with runpy.
FORK = ["--run-path", "--start-method", "fork"]


def launcher(fork):
    """torchrun's command: workers forked from a launcher that imported the plugin (``fork``:
    about 4 s of CPU less per worker), or fresh processes (the jobs a test signals or kills)."""
    return [sys.executable, FORKED] + FORK if fork else [sys.executable, "-m", "torch.distributed.run"]


def torchrun(args, nproc=2, timeout=300, env=None, **popen):
    """``torchrun --standalone``; run to its end with forked workers, or started (``popen``: a job
    the test signals or kills) with fresh ones."""
    cmd = launcher(not popen) + ["--standalone", "--nproc_per_node", str(nproc)] + list(args)
    env = dict(_env(), **{k: v for k, v in (env or {}).items() if k not in _env()})
    if popen:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
        )
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


class _Here:
    """What a ``run_train`` subprocess returns, for a run made in this process (``main`` is what
    scripts/train.py calls): the one-process reference runs need no process start of their own."""

    def __init__(self, argv):
        from dael_plugin.tools.train import main

        self.stderr = ""
        self.returncode = main(list(argv))


def one_process(args, timeout=300):
    return subprocess.run(
        [sys.executable] + list(args), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout
    )


# -- steps on fixed batches -----------------------------------------------------------------
CASES = [
    "da:1:split",  # the fused pass: 3 source chunks x 2 views + a target chunk of another size
    "dg:1:split",
    "da:0:split",  # one backbone call per chunk
    "da:1:grouped",
    "da-cs:1:split",  # category shift: every part of CLASS_MASKS, the (K, C) mask in the step
]
# ``COMPILE default`` under DDP: the synchronised batch norm's collectives and its backward are
# traced with the step (the fused DA pass: two runs of chunk sizes). Dynamo and AOTAutograd trace
# the collectives as inductor would; the ``aot_eager`` backend runs the traced graph without
# inductor's code generation (minutes on 2 cores). Inductor's kernels run in test_step.py's
# compiled tests and, with DDP on NCCL, in scripts/gpu_bench.sh.
COMPILED = "da:1:split,compile=default,compile_backend=aot_eager,steps=2"
# bf16 autocast rounds each batch-norm output to 8 bits of mantissa, so two exact forms of the
# same step differ by bf16 rounding: one step on two processes stays within the gap between two
# single-process forms (``split`` and ``grouped``: 3.9e-3 in a gradient here).
BF16, BF16_GROUPED = "da:1:split,prec=bf16,steps=1", "da:1:grouped,prec=bf16,steps=1"


def _max_grad_gap(a, b, step=0):
    assert set(a["grads"][step]) == set(b["grads"][step])
    return max((a["grads"][step][k] - b["grads"][step][k]).abs().max().item() for k in a["grads"][step])


def test_steps_on_two_processes_equal_one_in_fp32_compiled_and_bf16(tmp_path):
    """Every case in one launch on one process and one under torchrun (a process start costs
    about 4 s of CPU): three fp32 steps of four execution forms, two compiled steps, and one bf16
    step; the one-process launch adds the bf16 step's other exact form, for its rounding gap."""
    cases = CASES + [COMPILED, BF16]
    single = one_process(
        [WORKER, "--out", str(tmp_path / "one.pt")] + [x for c in cases + [BF16_GROUPED] for x in ("--case", c)]
    )
    assert single.returncode == 0, single.stderr[-2000:]
    ddp = torchrun([WORKER, "--out", str(tmp_path / "two.pt")] + [x for c in cases for x in ("--case", c)])
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one = [torch.load(tmp_path / f"one.pt.{i}", weights_only=True) for i in range(len(cases) + 1)]
    two = [torch.load(tmp_path / f"two.pt.{i}", weights_only=True) for i in range(len(cases))]
    for case, a, b in zip(cases, one, two):
        assert b["same_on_every_rank"], case  # parameters and running statistics, bitwise on both processes
        assert len(a["grads"]) == len(b["grads"]) == (2 if case == COMPILED else 1 if case == BF16 else 3), case
    for case, a, b in zip(CASES + [COMPILED], one, two):
        for step in range(len(a["grads"])):
            assert _max_grad_gap(a, b, step) < 1e-5, (case, step)
    for case, a, b in zip(CASES, one, two):
        for la, lb in zip(a["loss"], b["loss"]):
            assert abs(la - lb) < 1e-5, case
        for k, v in a["state"].items():  # parameters, running means and variances, counters
            assert (v.float() - b["state"][k].float()).abs().max().item() < 1e-5, (case, k)
        if case.startswith("da"):
            assert a["parts"][0]["mask_u"] == 1.0  # L_u was in the loss
        else:
            assert "mask_u" not in a["parts"][0]
    bf16_one, bf16_two, bf16_grouped = one[len(cases) - 1], two[len(cases) - 1], one[len(cases)]
    # bf16's rounding differs between the shards' and the whole batch's passes: on this project's 2-core
    # AMD EPYC VM (2026-11-28, at 70adf66 and after) the gap is 5.4e-3 with the exact forms 2.0e-3 apart,
    # 5.5 bf16 steps on gradients near 0.13 (another CPU gave under 4e-3). A wrong average over the
    # processes (none, or twice) is of the order of the gradient itself, 0.1.
    assert _max_grad_gap(bf16_one, bf16_two) <= max(3 * _max_grad_gap(bf16_one, bf16_grouped), 1e-2)
    assert abs(bf16_one["loss"][0] - bf16_two["loss"][0]) < 1e-2


# -- the CLI under torchrun ------------------------------------------------------------------
SRC_CFG = os.path.join(ROOT, "configs/trainers/da/source_only/embedded_digits.yaml")


def _args(root, out, engine, epochs=1, extra=(), trainer="DAEL"):
    cfg = DAEL_CFG if trainer == "DAEL" else SRC_CFG
    return (
        [
            "--engine",
            engine,
            "--trainer",
            trainer,
            "--root",
            root,
            "--dataset-config-file",
            DS_DA,
            "--config-file",
            cfg,
            "--source-domains",
            "hand",
            "blend",
            "font",
            "--target-domains",
            "street",
            "--seed",
            "2",
            "--output-dir",
            str(out),
            "OPTIM.MAX_EPOCH",
            str(epochs),
        ]
        + FAST
        + list(extra)
    )


def _weights(path):
    from dael_plugin.engine.checkpoint import load_checkpoint  # weights_only=True, as every load

    return load_checkpoint(str(path))


def _model_state(state):
    return state["model"]


# An epoch of the tiny set in 3 to 4 steps (16 images per domain): last-bit differences have
# no room to grow through max-pooling ties (module docstring), so 1e-3 holds on any CPU.
EPOCH = ["DATALOADER.TRAIN_X.BATCH_SIZE", "48", "DATALOADER.TRAIN_U.BATCH_SIZE", "16"]


# Per-epoch records on, with a held-out source split: the one-process comparisons below check them too.
RECORDS = ["SELECTION.EVAL_FREQ", "1", "SELECTION.TARGET_CAP", "40", "SELECTION.KEEP_BEST", "['source_val']"]


# Runs scripts/train.py's ``main`` with rank 1's own extra arguments (RANK1_ARGS, split on "|"), as two
# nodes' own commands would differ; ``--root|PATH`` replaces rank 1's root.
PER_RANK = (
    "import os, sys\n"
    "from dael_plugin.tools.train import main\n"
    "argv = sys.argv[1:]\n"
    "extra = os.environ['RANK1_ARGS'].split('|') if os.environ['RANK'] == '1' else []\n"
    "if extra and extra[0] == '--root':\n"
    "    argv[argv.index('--root') + 1] = extra[1]; extra = []\n"
    "sys.exit(main(argv + extra))\n"
)


def _per_rank(tmp_path):
    wrapper = tmp_path / "per_rank.py"
    wrapper.write_text(PER_RANK)
    return str(wrapper)


def _check_cli_matches(tmp_path, tiny_root, engine, trainer="DAEL", extra=(), rank1_root_elsewhere=False):
    """The one-process run and the two-process one. ``rank1_root_elsewhere``: rank 1 reads a copy of
    the root at another path, as a second node mounts the same data elsewhere; it is the same data,
    so the run trains (without torch's FutureWarning for the gathered fingerprints) to the same weights."""
    import shutil

    one = _Here(_args(tiny_root, tmp_path / "one", engine, extra=EPOCH + list(extra), trainer=trainer))
    assert one.returncode == 0, one.stderr[-3000:]
    script, env = [TRAIN], None
    if rank1_root_elsewhere:
        same = tmp_path / "same"
        shutil.copytree(tiny_root, same)
        script, env = [_per_rank(tmp_path)], {"RANK1_ARGS": f"--root|{same}"}
    two = torchrun(
        script + _args(tiny_root, tmp_path / "two", engine, extra=EPOCH + list(extra), trainer=trainer), env=env
    )
    assert two.returncode == 0, two.stderr[-3000:]
    if rank1_root_elsewhere:
        assert "FutureWarning" not in two.stderr  # torch's all_gather_into_tensor notice, per rank and run
    a = _model_state(_weights(tmp_path / "one" / "checkpoint.pth.tar"))
    b = _model_state(_weights(tmp_path / "two" / "checkpoint.pth.tar"))
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    print(f"{engine} {trainer}: largest weight difference {worst:.2e}")
    assert worst < 1e-3, worst
    ra = json.loads((tmp_path / "one" / "results.json").read_text())
    rb = json.loads((tmp_path / "two" / "results.json").read_text())
    assert ra["world_size"] == 1 and rb["world_size"] == 2
    assert abs(ra["accuracy"] - rb["accuracy"]) <= 1.0
    # Rank 0 alone writes and prints: one log, one TensorBoard stream, one result line.
    assert two.stdout.count("dael_plugin: wrote") == 1
    assert len(os.listdir(tmp_path / "two" / "tensorboard")) == 1
    return two


def test_torchrun_builtin_engine_gives_the_one_process_run(tmp_path, tiny_root):
    """Also: two nodes of one process each give the two-process run bit for bit; the two-process run,
    resumed on one process, is refused in one line (its batches and random streams are split over 2)."""
    two = _check_cli_matches(tmp_path, tiny_root, "builtin", extra=RECORDS, rank1_root_elsewhere=True)
    assert "8 images per domain per batch" in two.stdout  # each process's share of the 16
    _check_records_match(tmp_path, two)
    # Two nodes of one process each give the one-node, two-process run bit for bit, and rank 0 alone
    # writes. What this cannot see: a network between the nodes (both are loopback) and NCCL across hosts.
    outs = _two_nodes(tmp_path, _args(tiny_root, tmp_path / "nodes", "builtin", extra=EPOCH + RECORDS))
    a = _model_state(_weights(tmp_path / "nodes" / "checkpoint.pth.tar"))
    b = _model_state(_weights(tmp_path / "two" / "checkpoint.pth.tar"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "nodes" / "results.json").read_text())["world_size"] == 2
    assert sum(o[0].count("dael_plugin: wrote") for o in outs) == 1
    os.remove(tmp_path / "two" / "results.json")  # unfinished, as if it had been stopped
    again = run_here(_args(tiny_root, tmp_path / "two", "builtin", extra=EPOCH + RECORDS))
    assert again.returncode == 2
    last = again.stderr.strip().splitlines()[-1]
    assert "was written by a run on 2 process(es) and this run has 1" in last and "--nproc_per_node 2" in last
    assert "Traceback" not in again.stderr


@pytest.mark.dassl
def test_torchrun_dassl_engine_gives_the_one_process_run(tmp_path, tiny_root):
    two = _check_cli_matches(tmp_path, tiny_root, "dassl", extra=RECORDS, rank1_root_elsewhere=True)
    _check_records_match(tmp_path, two)


def test_torchrun_source_only_gives_the_one_process_run(tmp_path, tiny_root):
    """SourceOnly (built-in engine): one classifier under DDP, batch norm synchronised over the
    whole pooled batch (its one chunk)."""
    _check_cli_matches(tmp_path, tiny_root, "builtin", trainer="SourceOnly")


def test_one_process_trainers_under_torchrun_are_refused_in_rank_0s_line(tmp_path, tiny_root):
    """Rank 0 held back 4 s (it imports more; a busy machine makes it later still): rank 1 reads
    the same error first and waits for torchrun to stop it, so rank 0 still says the line. (A rank
    1 that exited at once had torchrun stop rank 0 before it spoke: CI of 2026-12-03.) Dassl's own
    trainers are refused by the same check before any process joins a group: the test below."""
    engine, trainer, said = "builtin", "M3SDA", "M3SDA on the built-in engine runs on one process: "
    slow = tmp_path / "slow_rank0.py"
    slow.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '0':\n"
        "    time.sleep(4)\n"
        "from dael_plugin.tools.train import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    proc = torchrun([str(slow)] + _args(tiny_root, tmp_path / "run", engine, trainer=trainer))
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-2000:]  # rank 0's, once
    assert said in lines[0] and not lines[0].startswith("error: rank 1"), lines[0]
    assert not os.path.exists(tmp_path / "run")  # refused before the output folder is made


def test_a_divergence_under_torchrun_is_recorded_by_rank_0(tmp_path, tiny_root):
    """Every rank reads the same NaN; rank 0's failed.json write held back 3 s: rank 1 waits for
    torchrun, so the run is marked failed and says so once (an early exit of rank 1 had torchrun
    stop rank 0 before its record)."""
    slow = tmp_path / "slow_record.py"
    slow.write_text(
        "import os, sys, time\n"
        "from dael_plugin.tools import train\n"
        "if os.environ['RANK'] == '0':\n"
        "    record = train.write_failure\n"
        "    train.write_failure = lambda *a: (time.sleep(3), record(*a))[1]\n"
        "sys.exit(train.main(sys.argv[1:]))\n"
    )
    blowup = ["OPTIM.LR", "0.05", "OPTIM.LR_SCHEDULER", "multi_step", "OPTIM.STEPSIZE", "(1,)", "OPTIM.GAMMA", "1e7"]
    proc = torchrun([str(slow)] + _args(tiny_root, tmp_path / "run", "builtin", epochs=3, extra=blowup))
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode != 0 and len(lines) == 1 and "NaN/inf" in lines[0], proc.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "failed.json").read_text())["failed"] is True
    assert not (tmp_path / "run" / "results.json").exists()


@pytest.mark.parametrize(
    "rank, engine, trainer, said",
    [
        ("1", "builtin", "M3SDA", "error: rank 1: M3SDA on the built-in engine runs on one process"),
        pytest.param(
            "0",
            "dassl",
            "SourceOnly",
            "error: Dassl's SourceOnly trainer runs on one process only (Dassl has no multi-process training)",
            marks=pytest.mark.dassl,
        ),
    ],
)
def test_a_rank_that_rank_0_does_not_follow_says_its_own_line(
    tmp_path, tiny_root, monkeypatch, capsys, rank, engine, trainer, said
):
    """No torchrun stops it (rank 0 went on, or ranks started by hand): after its wait, rank 1
    says its error itself, named as rank 1's. Rank 0 of a job running one of Dassl's own trainers
    says its line before any process joins a group (no torchrun launch needed to see it)."""
    from dael_plugin.tools import train_stops
    from dael_plugin.tools.train import main

    monkeypatch.setattr(train_stops, "RANK0_WAIT_S", 0.2)
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", rank)
    assert main(_args(tiny_root, tmp_path / "run", engine, trainer=trainer)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(said), err
    assert not os.path.exists(tmp_path / "run")  # refused before the output folder is made


@pytest.mark.parametrize("engine", ["builtin", pytest.param("dassl", marks=pytest.mark.dassl)])
def test_the_ranks_of_one_job_run_one_run_or_stop(tmp_path, tiny_root, engine):
    """Rank 1 launched with another OPTIM.LR, then with a root of one image fewer (two nodes' own
    commands): every rank stops in one line naming rank 1 and what differs, before training. (Two
    `--nnodes 2` launches trained to the end so, with rank 0's settings in results.json.) The same
    root at another path is the same data and runs: the torchrun tests of both engines above.
    Both engines call the one ``distributed.check_same_run``; the config it compares is the same on
    both, the data fingerprint each engine's own, so the Dassl engine runs the data case alone."""
    import shutil

    short = tmp_path / "short"
    shutil.copytree(tiny_root, short)
    hand = short / "embedded_digits" / "hand" / "train" / "0"
    os.remove(hand / sorted(os.listdir(hand))[0])
    cases = [
        ("OPTIM.LR|0.5", "rank 1 runs another run than rank 0: OPTIM.LR is 0.5 there, 0.001 on rank 0"),
        (f"--root|{short}", "rank 1 reads other data than rank 0: train_x of hand has"),
    ]
    wrapper = _per_rank(tmp_path)
    for i, (extra, said) in enumerate(cases if engine == "builtin" else cases[1:]):
        proc = torchrun([wrapper] + _args(tiny_root, tmp_path / f"run{i}", engine), env={"RANK1_ARGS": extra})
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
        assert proc.returncode != 0 and lines and said in lines[0], proc.stderr[-2000:]
        assert os.path.join("dael_plugin", "") not in proc.stderr  # no stack of ours (torchrun's own follows)


def _category_shift(args, tiny_root):
    """``args`` on the category-shift copy of the tiny set (tools/category_shift.py), every part on."""
    from dael_plugin.tools.category_shift import SOURCES, TARGET, build_set

    out = list(args)
    out[out.index("--root") + 1] = build_set(tiny_root)
    out[out.index("--dataset-config-file") + 1] = os.path.join(ROOT, "configs/datasets/da/embedded_digits_cs.yaml")
    i, j = out.index("--source-domains"), out.index("--target-domains")
    out[i + 1 : j + 2] = list(SOURCES) + ["--target-domains", TARGET]
    return out + ["TRAINER.DAEL.CLASS_MASKS", "all"]


def test_sharded_evaluation_equals_one_process(tmp_path, tiny_root):
    """--eval-only of one checkpoint: each process evaluates every second image and the tallies
    are gathered; accuracy, per-class and per-expert figures are the one-process figures. On the
    category-shift set with every part of CLASS_MASKS on: each rank builds the class table, and the
    masked experts and per-class ensemble are evaluated sharded."""
    train = _Here(_category_shift(_args(tiny_root, tmp_path / "run", "builtin"), tiny_root))
    assert train.returncode == 0
    evals = {}
    for name, launch in (
        ("one", _Here),
        ("two", lambda a: torchrun([TRAIN] + a)),
    ):
        args = _category_shift(_args(tiny_root, tmp_path / f"eval_{name}", "builtin"), tiny_root)
        proc = launch(["--eval-only", "--model-dir", str(tmp_path / "run")] + args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        evals[name] = json.loads((tmp_path / f"eval_{name}" / "results_eval.json").read_text())
    for key in ("accuracy", "expert_accuracy", "per_class_accuracy", "per_class_expert_accuracy"):
        assert evals["one"][key] == evals["two"][key], key
    assert evals["two"]["world_size"] == 2
    assert proc.stdout.count("Category shift: hand: 6 of 10 classes") == 1  # rank 0 says it
    assert len(evals["two"]["per_class_accuracy"]) == 10


def _checkpoint_epoch(path):
    """The completed epochs of a checkpoint (loaded with weights_only=True), or None before one exists."""
    from dael_plugin.engine.checkpoint import checkpoint_epoch

    return checkpoint_epoch(str(path)) if os.path.isfile(path) else None


def _wait_for_epoch(job, ckpt, epoch):
    deadline = time.time() + 240
    while time.time() < deadline and job.poll() is None and (_checkpoint_epoch(ckpt) or 0) < epoch:
        time.sleep(0.05)
    assert job.poll() is None, f"the job ended before epoch {epoch}'s checkpoint could be waited for"


def test_sigterm_then_kill_9_of_the_whole_job_resume_bitwise(tmp_path, tiny_root):
    """One run stopped twice, then finished (one launch per stop: a process start costs 4 s of CPU):
    - SIGTERM to torchrun after the first epoch (a scheduler's stop): it reaches both workers,
      which stop as one process does, and rank 0 alone says where to resume;
    - the same command resumes, and torchrun and both workers are killed with SIGKILL after
      its first epoch;
    - the same command resumes again and ends with the weights of the uninterrupted two-process
      run, bit for bit."""
    epochs = 5
    full = torchrun([TRAIN] + _args(tiny_root, tmp_path / "full", "builtin", epochs))
    assert full.returncode == 0, full.stderr[-3000:]
    args = [TRAIN] + _args(tiny_root, tmp_path / "cut", "builtin", epochs)
    ckpt = tmp_path / "cut" / "checkpoint.pth.tar"

    job = torchrun(args, start_new_session=True)
    _wait_for_epoch(job, ckpt, 1)
    job.send_signal(signal.SIGTERM)
    out, err = job.communicate(timeout=90)
    assert job.returncode != 0
    lines = [ln for ln in err.splitlines() if ln.startswith("terminated (SIGTERM)")]
    assert len(lines) == 1 and "rerun the same command to resume" in lines[0], err[-3000:]
    stopped_at = _checkpoint_epoch(ckpt)
    assert stopped_at is not None and stopped_at < epochs - 1

    job = torchrun(args, start_new_session=True)
    _wait_for_epoch(job, ckpt, stopped_at + 1)
    _kill_job(job)
    out = job.stdout.read()
    assert f"will resume training from epoch {stopped_at + 1}" in out
    killed_at = _checkpoint_epoch(ckpt)
    assert killed_at is not None and stopped_at < killed_at < epochs
    assert not (tmp_path / "cut" / "results.json").exists()

    again = torchrun(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"will resume training from epoch {killed_at + 1}" in again.stdout
    a = _weights(tmp_path / "full" / "checkpoint.pth.tar")
    b = _weights(ckpt)
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert a["world_size"] == b["world_size"] == 2 and len(b["rng_ranks"]) == 2


def _children(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def _kill_job(job):
    """SIGKILL to torchrun and every worker at once, as a scheduler kills a job's cgroup
    (torchrun starts its workers in sessions of their own, so its process group is not enough)."""
    workers = _children(job.pid)
    os.killpg(job.pid, signal.SIGKILL)
    for pid in workers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    job.wait(timeout=30)
    for pid in workers:  # gone before the checkpoint is read
        while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
            time.sleep(0.05)


def _rank_of(pid):
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads worker ranks from /proc (Linux)")
def test_a_rank_that_dies_stops_the_job_without_a_hang(tmp_path, tiny_root):
    args = [TRAIN] + _args(tiny_root, tmp_path / "run", "builtin", 50)
    job = torchrun(args, start_new_session=True)
    victim, deadline = None, time.time() + 120
    while victim is None and time.time() < deadline and job.poll() is None:
        for child in _children(job.pid):
            if _rank_of(child) == 1 and os.path.isfile(tmp_path / "run" / "log.txt"):
                victim = child
        time.sleep(0.1)
    assert victim is not None, "no worker of rank 1 found"
    time.sleep(2)  # well into training
    started = time.time()
    os.kill(victim, signal.SIGKILL)
    try:
        out, err = job.communicate(timeout=90)
    finally:
        if job.poll() is None:
            _kill_job(job)
    assert job.returncode != 0
    assert time.time() - started < 90
    assert "exitcode" in err and "-9" in err  # torchrun names the rank that was killed
    assert not os.path.exists(tmp_path / "run" / "results.json")
    # The survivor says one line (it lost its peer in a collective, or torchrun stopped it first)
    # and no stack trace of the plugin's; torchrun's own report follows it.
    said = [ln for ln in err.splitlines() if ln.startswith(("error: rank 0 lost contact", "terminated (SIGTERM)"))]
    assert len(said) == 1, err[-3000:]
    assert "dael_plugin" not in "".join(ln for ln in err.splitlines() if ln.lstrip().startswith("File ")), err[-3000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_their_torchrun(tmp_path, tiny_root):
    """``kill -9`` of torchrun alone: its workers, in sessions of their own, get SIGTERM from the
    kernel (PR_SET_PDEATHSIG) and stop, rather than train on with nobody to reap them."""
    # 400 epochs: minutes of training left when torchrun dies (the tiny set's epoch is under a second)
    job = torchrun([TRAIN] + _args(tiny_root, tmp_path / "run", "builtin", 400), start_new_session=True)
    workers, deadline = [], time.time() + 120
    while len(workers) < 2 and time.time() < deadline and job.poll() is None:
        workers = [c for c in _children(job.pid) if _rank_of(c) is not None]
        time.sleep(0.1)
    assert len(workers) == 2, "no workers found"
    while not os.path.isfile(tmp_path / "run" / "log.txt") and time.time() < deadline:
        time.sleep(0.1)
    job.kill()  # torchrun alone
    job.wait(timeout=30)
    deadline = time.time() + 60
    alive = workers
    while alive and time.time() < deadline:
        alive = [
            p for p in workers if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
        ]
        time.sleep(0.1)
    took = time.time() - (deadline - 60)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived their torchrun by 60 s"
    assert took < 30, f"the workers took {took:.0f} s to stop after their torchrun died"
    assert not os.path.exists(tmp_path / "run" / "results.json")


def test_a_lost_peer_is_one_line():
    """The line a surviving rank prints for gloo's errors, and what it does not take for one."""
    from dael_plugin.engine import distributed as d

    saved = d._WORLD
    d._WORLD = d.World(0, 2, 0, True)
    try:
        gloo = RuntimeError(
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.1]:1234"
        )
        assert d.lost_peer(gloo)
        line = d.lost_peer_line(gloo)
        assert (
            line.startswith("rank 0 lost contact")
            and "(Connection closed by peer" in line
            and "DAEL_DIST_TIMEOUT" in line
        )
        long = RuntimeError("[/gloo/x.cc:81] Connection reset by peer " + "while sending the gradients " * 8)
        assert "(Connection reset by peer while sending" in d.lost_peer_line(long)
        assert " ...):" in d.lost_peer_line(long) and "gradien):" not in d.lost_peer_line(long)  # cut at a word
        assert d.lost_peer(RuntimeError("[/gloo/x.cc:81] Timed out waiting 60000ms for recv operation to complete"))
        assert not d.lost_peer(RuntimeError("DataLoader timed out after 5 seconds"))
        assert not d.lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
        d._WORLD = d.World()
        assert not d.lost_peer(gloo)  # one process has no peer to lose
    finally:
        d._WORLD = saved


# -- sweeps: one run on N processes ---------------------------------------------------------
SWEEP_FAST = ["OPTIM.MAX_EPOCH", "1"] + FAST


def _sweep(argv, capsys):
    from dael_plugin.tools.sweep import main

    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize("launcher", ["local", "submitit-local"])
def test_sweep_runs_each_run_on_n_processes(tmp_path, tiny_root, capsys, launcher):
    """--gpus-per-run 2: torchrun on the local launcher, a 2-task job with torch.distributed's
    environment exported from the task environment on submitit's local executor. The run has the
    execution options under DDP: views made on the device (each rank its own draws), and DAEL's
    defaults channels_last and the fused optimiser, which take effect, as its saved state shows."""
    if launcher != "local":
        pytest.importorskip("submitit")
    argv = [
        "--root",
        tiny_root,
        "--dataset-config-file",
        DS_DA,
        "--output-dir",
        str(tmp_path),
        "--engine",
        "builtin",
        "--trainers",
        "DAEL",
        "--targets",
        "street",
        "--gpus-per-run",
        "2",
        "--launcher",
        launcher,
        *SWEEP_FAST,
        "EXECUTION.AUG_ON_DEVICE",
        "True",
    ]
    code, out, err = _sweep(argv, capsys)
    run = tmp_path / "EmbeddedDigits" / "DAEL" / "street" / "seed1"
    assert code == 0, out + err + (run / "sweep_log.txt").read_text()[-3000:]
    res = json.loads((run / "results.json").read_text())
    assert res["world_size"] == 2
    # The options took effect under DDP, as the saved state shows (not as the config echoes them):
    # the convolutions' weights were trained in channels_last (torch.save keeps strides), and the
    # optimiser is the fused one.
    state = torch.load(run / "checkpoint.pth.tar", weights_only=True)
    assert yaml.safe_load(state["config"])["EXECUTION"]["AUG_ON_DEVICE"] is True
    convs = [v for k, v in state["model"].items() if v.dim() == 4 and v.shape[1] > 1 and v.shape[-1] > 1]
    assert convs and all(v.is_contiguous(memory_format=torch.channels_last) and not v.is_contiguous() for v in convs), [
        tuple(v.stride()) for v in convs
    ]
    assert all(g.get("fused") for g in state["optim"]["param_groups"]), state["optim"]["param_groups"]
    log = (run / "sweep_log.txt").read_text()
    assert "4 images per domain per batch" in log  # each process's half of the 8
    if launcher == "local":
        assert "torch.distributed.run --standalone --nproc_per_node 2 -m dael_plugin.tools.train" in log
    # The same sweep on one process per run is another setting: refused in one line, not resumed.
    one = argv[: argv.index("--gpus-per-run")] + argv[argv.index("--gpus-per-run") + 2 :]
    code, _, err = _sweep(one, capsys)
    assert code == 2 and "was launched with other settings" in err and "processes" in err, err


def test_slurm_job_of_n_tasks(tmp_path, capsys, monkeypatch):
    """--gpus-per-run 2 on Slurm (a stand-in sbatch records the submission): two tasks of one
    GPU each per job, and each task exports torch.distributed's environment."""
    pytest.importorskip("submitit")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "submitted.sh"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {record}\necho "Submitted batch job 4242"\n')
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    for f in ("sbatch", "srun"):
        (bin_dir / f).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    argv = [
        "--root",
        "data",
        "--dataset-config-file",
        DS_DA,
        "--output-dir",
        str(tmp_path / "sweep"),
        "--engine",
        "builtin",
        "--trainers",
        "DAEL",
        "--targets",
        "blend",
        "--launcher",
        "slurm",
        "--gpus-per-run",
        "2",
        "--no-wait",
        *SWEEP_FAST,
    ]
    code, out, err = _sweep(argv, capsys)
    assert code == 0, out + err
    text = record.read_text()
    for line in ("#SBATCH --ntasks-per-node=2", "#SBATCH --gpus-per-node=2"):
        assert line in text, text
    pickled = list((tmp_path / "sweep" / ".submitit").rglob("*_submitted.pkl"))
    assert pickled  # the job's call: RunJob(argv, output_dir, {DAEL_SWEEP_DISTRIBUTED: 1})
    import cloudpickle  # submitit's own pickler

    from dael_plugin.tools.sweep import DIST_ENV

    with open(pickled[0], "rb") as f:
        delayed = cloudpickle.load(f)
    assert delayed.args[2] == {DIST_ENV: "1"} and "torch.distributed.run" not in " ".join(delayed.args[0])


def _check_records_match(tmp_path, two):
    """Per-epoch records under torchrun: every rank draws the same held-out source split (checked
    by the ranks themselves), rank 0 alone writes epochs.jsonl, and the records' sizes and
    accuracies are the one-process run's (with the torchrun tests of both engines above)."""
    ra, rb = (json.loads((tmp_path / n / "epochs.jsonl").read_text().splitlines()[0]) for n in ("one", "two"))
    for key in ("source_val_size", "target_val_size", "target_test_size"):
        assert ra[key] == rb[key], key
    assert abs(ra["source_val_accuracy"] - rb["source_val_accuracy"]) <= 1.0
    sa, sb = (json.loads((tmp_path / n / "results.json").read_text())["source_val_split"] for n in ("one", "two"))
    assert sa == sb and sa["size"] > 0
    assert two.stdout.count("epoch record 1") == 1
    assert os.listdir(tmp_path / "two").count("model-best-source_val.pth.tar") == 1


def test_a_torchrun_job_into_a_busy_folder_says_one_line(tmp_path, tiny_root):
    """A second job into a folder a live run holds: rank 0 says it is busy (exit 75), once; rank 1,
    which loses rank 0, adds no line of its own and no stack trace."""
    from test_hardening import held

    out = tmp_path / "run"
    out.mkdir()
    with held(out):
        job = torchrun([TRAIN] + _args(tiny_root, out, "builtin", 1))
    assert job.returncode != 0
    said = [ln for ln in job.stderr.splitlines() if ln.startswith("error: ")]
    assert len(said) == 1 and "is in use by a live run" in said[0], job.stderr[-3000:]
    assert "dael_plugin" not in "".join(ln for ln in job.stderr.splitlines() if ln.lstrip().startswith("File "))


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(tmp_path, args):
    """Two ``torchrun --nnodes 2 --nproc_per_node 1`` launches, as two machines would start them: a c10d
    rendezvous at one address (here 127.0.0.1) and one shared file system (the same --output-dir).
    Returns each launch's (stdout, stderr)."""
    port = _free_port()
    launch = launcher(True) + ["--nnodes", "2", "--nproc_per_node", "1"]
    launch += ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "dael-two-nodes"]
    nodes = [
        subprocess.Popen(
            launch + [TRAIN] + args, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [node.communicate(timeout=300) for node in nodes]
    assert all(node.returncode == 0 for node in nodes), [o[1][-2000:] for o in outs]
    return outs


def test_a_quiet_rank_swaps_stdout_and_finish_puts_it_back(monkeypatch, capsys):
    """Ranks other than 0 print nothing on stdout, and stderr still reaches the user; finish()
    restores stdout, and ``builtins.print`` is never replaced (it was patched, for good, before)."""
    import builtins
    import sys

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    real_print, real_stdout = builtins.print, sys.stdout
    distributed.quiet_unless_main()
    try:
        print("from rank 1")
        print("an error of rank 1", file=sys.stderr)
        assert builtins.print is real_print and sys.stdout is not real_stdout
    finally:
        distributed.finish()
    assert sys.stdout is real_stdout
    print("after finish")
    out, err = capsys.readouterr()
    assert out == "after finish\n" and "an error of rank 1" in err
    monkeypatch.setenv("RANK", "0")
    distributed.quiet_unless_main()  # rank 0 speaks
    assert sys.stdout is real_stdout
