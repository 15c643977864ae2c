"""How a run stops when it does not finish: SIGTERM, a loader worker killed with the run, out of
memory (one line with what to lower), and where the run can be resumed from. The exit codes that
are not the errors module's own (out of memory 4, a lost torchrun peer 5) are defined here."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Optional

from dael_plugin.engine.checkpoint import LAST, checkpoint_epoch
from dael_plugin.engine.results import (
    write_failure,
)
from dael_plugin.errors import Terminated, say

EXIT_OOM = 4  # out of device or host memory: one line with the settings to lower

EXIT_LOST_PEER = 5  # under torchrun: another process of the job died or stalled


def raise_terminated(signum, _frame):
    raise Terminated(signum)


def redeliver_swallowed_stops(unraisable) -> None:
    """A run's ``sys.unraisablehook``: a SIGTERM (or Ctrl-C) whose exception rose inside a finalizer
    or a weakref callback, where Python prints "Exception ignored" with a traceback and goes on as if
    no signal had come, is delivered again, quietly: the signal is sent anew 50 ms later (a timer
    thread), so that its handler runs in the run's own code once the callback has returned (raised
    at once, it would run inside this hook and be swallowed again). Anything else gets Python's
    own report."""
    import threading

    if isinstance(unraisable.exc_value, KeyboardInterrupt):  # Terminated too
        signum = signal.SIGTERM if isinstance(unraisable.exc_value, Terminated) else signal.SIGINT
        threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
    else:
        sys.__unraisablehook__(unraisable)


RANK0_WAIT_S = 60.0  # how long a rank other than 0 waits for rank 0 to say a stop both read


def wait_for_rank0(seconds: Optional[float] = None) -> bool:
    """On a rank other than 0, a config error every rank reads from the same command: wait for
    torchrun to stop this process. Rank 0 says the line; exiting first would have torchrun stop
    rank 0 before it does (rank 0 imports more, so on a busy machine it is seconds behind), and
    the user would see torchrun's report and no cause. Returns whether the stop came (SIGTERM or
    Ctrl-C); ``False`` after ``seconds`` (rank 0 did not stop at this line, or no torchrun watches
    the ranks), and this rank then says its own line."""
    try:  # the SIGTERM handler raises out of the sleep (PEP 475 retries it only when none raises)
        time.sleep(RANK0_WAIT_S if seconds is None else seconds)
    except (Terminated, KeyboardInterrupt):
        return True
    return False


def say_on_rank0(rank: int, line: str) -> None:
    """A stop every rank reads: rank 0 says ``line``; another rank waits for torchrun to stop it
    (:func:`wait_for_rank0`), and says it as its own only if no stop comes."""
    if rank == 0:
        say(f"error: {line}")
    elif not wait_for_rank0():
        say(f"error: rank {rank}: {line}")


def worker_terminated(exc: BaseException) -> bool:
    """A data-loader worker stopped by SIGTERM: a scheduler (``scancel``, ``timeout``, a job's
    cgroup) signals every process of the run at once, and the main process can see its worker's
    death (torch's SIGCHLD check) before its own SIGTERM."""
    return "DataLoader worker" in str(exc) and "killed by signal: Terminated" in str(exc)


def stop_listening(sigchld) -> None:
    """Stopping: a second SIGTERM (the rest of a group-wide one) must not interrupt the cleanup,
    and the loaders' dead workers no longer concern anyone (torch's SIGCHLD check would otherwise
    raise again from wherever the interpreter is, down to its exit hooks).

    ``signal.signal`` first runs the handlers of signals already pending, with the handlers being
    replaced: torch's SIGCHLD check can raise the worker's error from the very call that removes
    it, and a late SIGTERM its ``Terminated``. Each such signal is spent once it has run, so the
    swap is retried until it goes through."""
    for _ in range(64):
        try:
            signal.signal(signal.SIGCHLD, sigchld if sigchld is not None else signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            return
        except Terminated:
            continue
        except RuntimeError as exc:
            if not worker_terminated(exc):
                raise


def torch_distributed():
    import torch.distributed

    return torch.distributed


def oom_types() -> tuple:
    import torch

    return (torch.OutOfMemoryError, MemoryError)


def out_of_memory(exc: BaseException, state: dict) -> str:
    """One line for an out-of-memory stop: where, and what to lower. A smaller batch is another
    run, so it needs another output directory; the same command resumes this one."""
    import torch

    cfg = state.get("cfg")
    on_gpu = isinstance(exc, torch.OutOfMemoryError)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
    now = ""
    if cfg is not None:
        d = cfg.DATALOADER
        u = d.TRAIN_X.BATCH_SIZE if d.TRAIN_U.SAME_AS_X else d.TRAIN_U.BATCH_SIZE
        now = (
            f" (now DATALOADER.TRAIN_X.BATCH_SIZE {d.TRAIN_X.BATCH_SIZE}, TRAIN_U {u}, TEST {d.TEST.BATCH_SIZE}, "
            f"NUM_WORKERS {d.NUM_WORKERS}, INPUT.SIZE {tuple(cfg.INPUT.SIZE)})"
        )
    lower = (
        "the batch sizes or INPUT.SIZE, or use TRAINER.DAEL.PREC bf16"
        if on_gpu
        else ("the batch sizes, INPUT.SIZE or DATALOADER.NUM_WORKERS")
    )
    return (
        f"out of {'GPU' if on_gpu else 'host'} memory ({first}): lower {lower}{now}; a new setting is another "
        "run, so give it another --output-dir (the same command resumes this one from its last checkpoint)"
    )


def oom_exit(exc: BaseException, state: dict) -> int:
    line = out_of_memory(exc, state)
    if state.get("output_dir"):
        write_failure(state["output_dir"], line)
    say(f"error: {line}")
    return EXIT_OOM


def where_to_resume(output_dir: Optional[str], eval_only: bool = False) -> str:
    if eval_only:
        return "the evaluation stopped before its results_eval.json; the model it read is unchanged: rerun it"
    if not output_dir:
        return "nothing was saved"
    path = os.path.join(output_dir, LAST)
    epoch = checkpoint_epoch(path) if os.path.isfile(path) else None
    if epoch is None:
        return f"no epoch finished, so no checkpoint was saved in {output_dir}"
    return f"the last checkpoint is {path} (epoch {epoch}); rerun the same command to resume"


def record_config_error(args, state: dict, message: str) -> None:
    """A run stopped by its config before it trained says so in its folder (``failed.json``): a
    sweep's table and ``--select`` then call it failed, not a run still to come. Only in a folder
    that holds nothing of a run (a config error also names a folder that holds another run's
    checkpoint or record, which must not be marked) and that no live run holds; never for
    ``--eval-only`` (its folder reads another run)."""
    from dael_plugin.engine import distributed
    from dael_plugin.engine.results_reader import FAILED, IDENTITY, JOB, LOG
    from dael_plugin.engine.runlock import LOCK, OWNER, RunLock
    from dael_plugin.errors import DAELConfigError

    out = state.get("output_dir") or args.output_dir
    if args.eval_only or args.no_train or not out or distributed.from_env().rank != 0 or not os.path.isdir(out):
        return
    if set(os.listdir(out)) - {LOG, IDENTITY, JOB, LOCK, OWNER, FAILED, "log.txt"}:
        return
    held = state.get("lock")
    try:
        lock = held if held is not None and held.held else RunLock(out).acquire()
    except DAELConfigError:  # a live run holds it (then it is that run's to record), or it cannot be locked
        return
    try:
        write_failure(out, message)
    finally:
        if lock is not held:
            lock.release()
