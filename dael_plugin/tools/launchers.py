"""Where a sweep's runs execute: here (``local``, N at a time, each on its GPUs or its share of
the cores) or as submitit jobs (``submitit-local``, ``slurm``), each run a training command
whose output goes to its folder's log. A run stops with the sweep, however the sweep stops."""

from __future__ import annotations

import argparse
import json
import os
import signal
import stat
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Dict, List, Optional, Sequence, Set

from dael_plugin.engine.atomic import write_text
from dael_plugin.engine.results_reader import JOB, LOG
from dael_plugin.errors import EXIT_BUSY, EXIT_CLASH, DAELConfigError
from dael_plugin.tools.sweep_plan import DIST_ENV, PACKAGE_PARENT, Run


def _die_with_parent(parent: int):
    """In the child, before exec: the kernel sends it SIGTERM when the sweep dies, however it
    dies (kill -9 included). train.py stops at SIGTERM as at Ctrl-C, releasing its lock."""

    def setup() -> None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # not Linux: the sweep's own handlers stop its runs
            return
        if os.getppid() != parent:  # the sweep died before the line above
            os._exit(143)

    return setup


def _start(argv: Sequence[str], env: Optional[Dict[str, str]], log) -> "subprocess.Popen":
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    return subprocess.Popen(
        list(argv), stdout=log, stderr=subprocess.STDOUT, env=full_env, preexec_fn=_die_with_parent(os.getpid())
    )


try:  # submitit is optional: only its launchers need it
    from submitit.helpers import Checkpointable as _Checkpointable
except ImportError:  # pragma: no cover
    _Checkpointable = object


class RunJob(_Checkpointable):
    """One training command (``python -m dael_plugin.tools.train``), its output to ``<output_dir>/sweep_log.txt``; as a
    submitit job, it is requeued when Slurm preempts it or its time
    limit nears (submitit's USR2 at ``--signal=USR2@90``): the run is stopped as Ctrl-C
    stops it, the job goes back in the queue, and the training command resumes it from its
    last checkpoint, bit for bit. submitit gives up after 3 timeouts."""

    live: Set[subprocess.Popen] = set()  # this process's running train.py commands

    def __init__(self) -> None:
        self._proc: Optional[subprocess.Popen] = None

    def __call__(self, argv: Sequence[str], output_dir: str, env: Optional[Dict[str, str]] = None) -> int:
        if env and env.get(DIST_ENV):
            # One task of an N-task submitit job: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
            # MASTER_PORT from Slurm's (or the local executor's) task environment, the way
            # submitit documents distributed jobs; the training command inherits them.
            from submitit.helpers import TorchDistributedEnvironment

            TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, LOG), "a") as log:
            self._proc = proc = _start(argv, env, log)
            RunJob.live.add(proc)
            try:
                # poll, not wait(): a blocking wait() holds the Popen's lock, and the signal
                # handler's checkpoint() (run on this thread) could then never reap the process
                while (code := proc.poll()) is None:
                    time.sleep(0.5)
                return code
            finally:
                RunJob.live.discard(proc)
                self._proc = None

    @classmethod
    def stop_all(cls) -> None:
        """SIGTERM to every running command (they stop as at Ctrl-C and release their locks)."""
        for proc in list(cls.live):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def checkpoint(self, argv, output_dir, env=None):
        import signal

        from submitit.helpers import DelayedSubmission

        proc, self._proc = self._proc, None  # a process does not travel with the resubmission
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # train.py stops cleanly; its lock is released
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with open(os.path.join(output_dir, LOG), "a") as log:
            log.write("sweep: job interrupted (time limit or preemption); requeued, the run resumes\n")
        return DelayedSubmission(self, argv, output_dir, env)


def run_one(argv: Sequence[str], output_dir: str, env: Optional[Dict[str, str]] = None) -> int:
    """Run one training command here (the local launcher)."""
    return RunJob()(argv, output_dir, env)


def _outcome(run: Run, code: int) -> str:
    """done, busy (its folder is held by another live run: a second sweep, or an orphan), or failed."""
    if code == 0 and run.done():
        return "done"
    return "busy" if code == EXIT_BUSY else "failed"


def _report(run: Run, code: int, n_done: int, total: int, seconds: float) -> str:
    outcome = _outcome(run, code)
    if outcome == "done":
        try:
            with open(os.path.join(run.output_dir, "results.json")) as f:
                acc = json.load(f).get("accuracy")
        except (OSError, ValueError):
            acc = "?"
        return f"[{n_done}/{total}] done   {run.name}: accuracy {acc} ({seconds:.0f} s) {run.output_dir}"
    if outcome == "busy":
        return (
            f"[{n_done}/{total}] running elsewhere {run.name}: another live process holds {run.output_dir} "
            "(another sweep on this folder, or a run left from a sweep that was killed); not started here"
        )
    if code == EXIT_CLASH:
        return (
            f"[{n_done}/{total}] FAILED {run.name}: a live run with other settings holds {run.output_dir} "
            "(another sweep with other options on this folder); give this sweep another --output-dir"
        )
    said = last_words(run.log_path())
    return f"[{n_done}/{total}] FAILED {run.name}: exit {code}{': ' + said if said else ''} (log {run.log_path()})"


def last_words(log: str, tail: int = 8192) -> str:
    """What a failed run said last (its ``error:`` line, else its last line: a traceback's
    exception), from the end of its log; "" for no such regular file."""
    try:
        st = os.stat(log)
        if not stat.S_ISREG(st.st_mode):
            return ""
        with open(log, "rb") as f:
            f.seek(max(0, st.st_size - tail))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if ln.startswith("error: ")]
    said = (errors or lines or [""])[-1]
    return said[:300] + (" ..." if len(said) > 300 else "")


def launch_local(runs: List[Run], workers: int, bar, per_run: int = 1) -> int:
    """``workers`` runs at a time; with GPUs, each run holds a group of ``per_run`` GPUs while it
    runs (its own, when ``workers * per_run`` GPUs are there)."""
    import queue

    try:
        import torch

        gpus = torch.cuda.device_count()
    except Exception:
        gpus = 0
    free: "queue.Queue[int]" = queue.Queue()
    for slot in range(max(1, workers)):
        free.put(slot)

    # On CPU, runs side by side (and their processes) share the cores instead of each taking all.
    threads = str(max(1, (os.cpu_count() or 1) // max(1, workers * per_run)))

    def work(run: Run):
        run.claim()
        slot = free.get()
        try:
            group = ",".join(str((slot * per_run + i) % gpus) for i in range(per_run)) if gpus else ""
            env = {"CUDA_VISIBLE_DEVICES": group} if gpus else {}
            if not gpus and workers * per_run > 1:
                env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
            t0 = time.time()
            return run, run_one(run.argv, run.output_dir, env), time.time() - t0
        finally:
            free.put(slot)

    tally: Counter = Counter()
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        futures = [pool.submit(work, r) for r in runs]
        for n, fut in enumerate(as_completed(futures), 1):
            run, code, secs = fut.result()
            tally[_outcome(run, code)] += 1
            bar.write(_report(run, code, n, len(runs), secs))
            bar.update(1)
    except BaseException:  # Ctrl-C or SIGTERM: the runs stop with the sweep, none starts
        pool.shutdown(wait=False, cancel_futures=True)
        RunJob.stop_all()
        raise
    pool.shutdown()
    return tally


def launch_submitit(runs: List[Run], args: argparse.Namespace, bar) -> int:
    try:
        import submitit
    except ImportError:
        raise DAELConfigError("--launcher slurm/submitit-local needs submitit: pip install submitit") from None
    folder = os.path.join(args.output_dir, ".submitit", "%j")
    if args.launcher == "slurm":
        try:
            ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
        except RuntimeError as exc:  # submitit: no srun here
            raise DAELConfigError(
                f"--launcher slurm needs a Slurm cluster: {exc} (use --launcher local or submitit-local here)"
            ) from None
        per_run = args.gpus_per_run
        # One task per process and one GPU per task (submitit's distributed recipe); each
        # task exports torch.distributed's environment (RunJob).
        gpus = max(args.gpus, per_run) if (args.gpus or per_run > 1) else 0
        ex.update_parameters(
            timeout_min=args.time,
            slurm_partition=args.partition,
            gpus_per_node=gpus,
            tasks_per_node=per_run,
            cpus_per_task=args.cpus,
            slurm_array_parallelism=args.workers,
            name="dael_sweep",
        )
    else:
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(
            timeout_min=args.time,
            visible_gpus=tuple(range(args.gpus)) if args.gpus else (),
            tasks_per_node=args.gpus_per_run,
        )
    for run in runs:
        run.claim()
    if args.launcher == "slurm":  # one job array; Slurm keeps --workers of them running
        dist_env = {DIST_ENV: "1"} if args.gpus_per_run > 1 else {}
        jobs = ex.map_array(
            RunJob(), [list(r.argv) for r in runs], [r.output_dir for r in runs], [dist_env] * len(runs)
        )
        for job, run in zip(jobs, runs):
            write_text(os.path.join(run.output_dir, JOB), f"{job.job_id}\n")
            if args.no_wait:
                bar.write(f"submitted {run.name}: Slurm job {job.job_id}; log {run.log_path()}")
        if args.no_wait:
            return Counter()
        now = time.time()
        queue, pending = [], {j: (r, now) for j, r in zip(jobs, runs)}
        env = {}
    else:  # the local executor starts every job at once: keep --workers of them running
        threads = str(max(1, (os.cpu_count() or 1) // max(1, args.workers * args.gpus_per_run)))
        env = {} if args.gpus else {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        if args.gpus_per_run > 1:
            env[DIST_ENV] = "1"
        queue, pending = list(runs), {}
    tally: Counter = Counter()
    try:
        return _wait_for_jobs(ex, queue, pending, runs, env, args, bar, tally)
    except BaseException:  # Ctrl-C or SIGTERM: the sweep's jobs are cancelled (scancel on Slurm)
        for job in pending:
            job.cancel(check=False)
        raise


def _wait_for_jobs(ex, queue, pending, runs, env, args, bar, tally) -> Counter:
    n = 0
    while pending or queue:
        while queue and len(pending) < max(1, args.workers):
            run = queue.pop(0)
            pending[ex.submit(RunJob(), list(run.argv), run.output_dir, env)] = (run, time.time())
        for job in [j for j in pending if j.done()]:
            run, started = pending.pop(job)
            try:
                codes = job.results()  # one per task: a run of N tasks failed if any task did
                code = next((c for c in codes if c), 0)
            except Exception as exc:  # the job itself failed (killed, timed out)
                print(f"submitit job {job.job_id} of {run.name} failed: {str(exc).splitlines()[0][:160]}")
                code = 1
            n += 1
            tally[_outcome(run, code)] += 1
            bar.write(_report(run, code, n, len(runs), time.time() - started))
            bar.update(1)
        time.sleep(0.5)
    return tally
