"""Sweeps: trainers x targets x seeds x an override grid, as runs of ``python -m dael_plugin.tools.train``.

    python scripts/sweep.py --root R --dataset-config-file DS --trainers DAEL SourceOnly \\
        --seeds 1 2 3 [--targets T1 T2 ...] --output-dir DIR [--grid KEY V1 V2 ...]... \\
        [--launcher local|submitit-local|slurm] [--workers N] [--dry-run] [--] [KEY VALUE ...]

- Targets default to every leave-one-domain-out split of the dataset; the
  other domains are the sources. The method config of a trainer defaults to
  ``configs/trainers/<da|dg>/<trainer>/<dataset>.yaml``.
- Each run's directory is ``DIR/<dataset>/<trainer>[/<grid setting>]/<target>/seed<N>``.
- A run's folder keeps the settings it was launched with (``sweep_run.json``:
  trainer, target, sources, seed, engine, grid setting, trailing options, and
  the method and dataset configs with their content's hash). A run with
  ``results.json`` and the same settings is done and skipped; one without a
  record is started and resumes from its checkpoint if it has one. A relaunch
  whose settings differ from a folder's is refused, listing what changed:
  an old result is never counted as the new settings' result.
- A sweep owns its runs: each ``train.py`` gets SIGTERM from the kernel when
  the sweep exits, however it exits (``PR_SET_PDEATHSIG``), and stops as at
  Ctrl-C. A run whose folder another live process holds (a second sweep on
  the same folder, or a run left by a sweep killed on a system without
  ``PR_SET_PDEATHSIG``) is reported as "running elsewhere", not failed.
- Launchers: ``local`` runs N workers here, each pinned to one GPU through
  ``CUDA_VISIBLE_DEVICES`` when GPUs exist; ``slurm`` submits a Slurm job array
  through submitit; ``submitit-local`` is submitit's local executor, the same
  code path without a cluster.
  ``--no-wait`` (slurm) submits the array and exits: each run's job id is kept
  in its ``sweep_job.txt``, and a relaunch (or ``--dry-run``) shows which runs
  finished. A duplicate submission cannot hurt a run: a second process on the
  same output directory is refused by the run's lock, and one that starts after
  the run finished only re-evaluates its last checkpoint. A job interrupted by
  its time limit or by preemption requeues itself and its run resumes.
- A failed run is reported with its log and the others go on; the exit code
  is 1 when any run failed.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

from dael_plugin.about import ENGINES
from dael_plugin.engine.atomic import remove_stale_temps, write_json, write_text
from dael_plugin.errors import DAELConfigError

# Each run is ``python -m dael_plugin.tools.train``: the installed package, or this checkout
# (put on the runs' PYTHONPATH), never a script path relative to a checkout.
TRAIN = ("-m", "dael_plugin.tools.train")
# N processes for one run on the local launcher: torchrun on a free port (--standalone).
TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node")
DIST_ENV = "DAEL_SWEEP_DISTRIBUTED"  # set in a submitit job of N tasks: export torch.distributed's env
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOG = "sweep_log.txt"  # a run's stdout and stderr, in its directory
JOB = "sweep_job.txt"  # the Slurm job id a run was last submitted as
IDENTITY = "sweep_run.json"  # everything that changes the run's result: a relaunch must match it
EXIT_BUSY = 75  # train.py: the output directory is held by another live run


@dataclass(frozen=True)
class Run:
    trainer: str
    target: str
    sources: Tuple[str, ...]
    seed: int
    grid: Tuple[Tuple[str, str], ...]
    config_file: str
    output_dir: str
    argv: Tuple[str, ...] = field(compare=False)
    identity: Tuple[Tuple[str, str], ...] = field(compare=False, default=())

    @property
    def name(self) -> str:
        setting = ",".join(f"{_short(k)}={v}" for k, v in self.grid)
        return f"{self.trainer}{'[' + setting + ']' if setting else ''} -> {self.target} seed {self.seed}"

    def recorded_identity(self) -> Optional[dict]:
        """The settings this folder's run was launched with (``sweep_run.json``), or None."""
        try:
            with open(os.path.join(self.output_dir, IDENTITY)) as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return None

    def changes(self) -> List[str]:
        """How this run's settings differ from those its folder was launched with ([] if none)."""
        had = self.recorded_identity()
        if had is None:
            if os.path.isfile(os.path.join(self.output_dir, "results.json")):
                return ["the folder holds a record of a run whose settings were not written down"]
            return []
        now = dict(self.identity)
        return [f"{k}: {had.get(k, '<absent>')} -> {now.get(k, '<absent>')}"
                for k in sorted(set(had) | set(now)) if had.get(k) != now.get(k)]

    def done(self) -> bool:
        """Finished, with exactly these settings: a record, and the identity it was launched with."""
        return os.path.isfile(os.path.join(self.output_dir, "results.json")) and not self.changes()

    def claim(self) -> None:
        """Write down the settings the folder is launched with (before the run starts)."""
        if self.recorded_identity() is None:
            write_json(os.path.join(self.output_dir, IDENTITY), dict(self.identity))

    def log_path(self) -> str:
        return os.path.join(self.output_dir, LOG)


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", text).strip("-")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", name).lower()


def read_dataset(path: str) -> Tuple[str, str, List[str]]:
    """``(DATASET.NAME, setting da|dg, its domains)`` from a dataset config file."""
    import yaml

    from dael_plugin.data.folders import SPECS

    try:
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
        name = doc["DATASET"]["NAME"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        raise DAELConfigError(f"--dataset-config-file {path}: not a dataset config with DATASET.NAME") from None
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    setting = "dg" if "dg" in parts else "da" if "da" in parts else None
    domains: Optional[List[str]] = None
    spec = SPECS.get(name)
    if spec is not None:
        domains = list(spec.domains) if spec.domains else None
        setting = setting or ("da" if spec.unlabeled_target else "dg")
    if domains is None:
        try:
            from dassl.data.datasets import DATASET_REGISTRY

            domains = list(getattr(DATASET_REGISTRY.get(name), "domains", []) or []) or None
        except Exception:  # Dassl absent, or no such dataset there
            domains = None
    return name, setting or "da", domains or []


def method_config(trainer: str, setting: str, dataset_cfg: str) -> str:
    """A trainer's method config, found in the dataset config's own tree: for
    ``<tree>/datasets/<da|dg>/<name>.yaml`` it is ``<tree>/trainers/<da|dg>/<trainer>/<name>.yaml``
    (the layout of this project's ``configs/``, and of Dassl's)."""
    base = os.path.splitext(os.path.basename(dataset_cfg))[0]
    here = os.path.dirname(os.path.abspath(dataset_cfg))
    while os.path.basename(here) != "datasets":
        parent = os.path.dirname(here)
        if parent == here:
            raise DAELConfigError(
                f"cannot find the method config of {trainer}: the dataset config {dataset_cfg} is not under a "
                "'datasets/' folder with a 'trainers/' folder beside it; pass --config TRAINER=FILE")
        here = parent
    path = os.path.join(os.path.dirname(here), "trainers", setting, _snake(trainer), f"{base}.yaml")
    if not os.path.isfile(path):
        raise DAELConfigError(f"no method config for {trainer} at {path}; pass --config TRAINER=FILE")
    return path


def plan(args: argparse.Namespace) -> List[Run]:
    """Every run of the sweep, in a fixed order."""
    dataset, setting, domains = read_dataset(args.dataset_config_file)
    targets = list(args.targets or domains)
    if not targets:
        raise DAELConfigError(f"the domains of {dataset} are not known here; pass --targets (and --sources)")
    unknown = [t for t in targets if domains and t not in domains]
    if unknown:
        raise DAELConfigError(f"--targets {unknown} are not domains of {dataset} ({domains})")
    overrides = dict(c.split("=", 1) for c in args.config)
    engine = _resolved_engine(args.engine)
    dataset_sha = _sha256(args.dataset_config_file)
    runs = []
    for trainer in args.trainers:
        # A grid key of another trainer's node (TRAINER.DAEL.* for SourceOnly) is not
        # this trainer's: its runs do not multiply by it.
        grid = [(g[0], g[1:]) for g in args.grid
                if not (g[0].startswith("TRAINER.") and g[0].split(".")[1].upper() != trainer.upper())]
        cfg_file = overrides.get(trainer) or method_config(trainer, setting, args.dataset_config_file)
        for target, combo, seed in itertools.product(targets, itertools.product(*[v for _, v in grid]), args.seeds):
            sources = tuple(args.sources or [d for d in domains if d != target])
            if not sources:
                raise DAELConfigError(f"no source domains for target {target}; pass --sources")
            setting_kv = tuple(zip([k for k, _ in grid], combo))
            parts = [args.output_dir, dataset, trainer]
            if setting_kv:
                parts.append(_slug(",".join(f"{_short(k)}={v}" for k, v in setting_kv)))
            out = os.path.join(*parts, _slug(target), f"seed{seed}")
            per_run = int(getattr(args, "gpus_per_run", 1) or 1)
            launch = (*TORCHRUN, str(per_run)) if per_run > 1 and args.launcher == "local" else ()
            argv = [sys.executable, *launch, *TRAIN, "--engine", args.engine, "--trainer", trainer, "--root", args.root,
                    "--dataset-config-file", args.dataset_config_file, "--config-file", cfg_file,
                    "--source-domains", *sources, "--target-domains", target, "--output-dir", out,
                    "--seed", str(seed), *args.opts]
            for k, v in setting_kv:
                argv += [k, str(v)]
            identity = {"trainer": trainer, "target": target, "sources": " ".join(sources), "seed": str(seed),
                        "engine": engine, "grid": " ".join(f"{k}={v}" for k, v in setting_kv),
                        "options": " ".join(f"{k}={v}" for k, v in zip(args.opts[::2], args.opts[1::2])),
                        "method config": f"{cfg_file} (sha256 {_sha256(cfg_file)[:12]})",
                        "dataset config": f"{args.dataset_config_file} (sha256 {dataset_sha[:12]})"}
            if per_run > 1:  # a run resumes only on as many processes as it started with
                identity["processes"] = str(per_run)
            runs.append(Run(trainer, target, sources, seed, setting_kv, cfg_file, out, tuple(argv),
                            tuple(sorted(identity.items()))))
    return runs


def _sha256(path: str) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _resolved_engine(engine: str) -> str:
    if engine != "auto":
        return engine
    from dael_plugin.about import HAS_DASSL

    return "dassl" if HAS_DASSL else "builtin"


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
    return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, env=full_env,
                            preexec_fn=_die_with_parent(os.getpid()))


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
        return (f"[{n_done}/{total}] running elsewhere {run.name}: another live process holds {run.output_dir} "
                "(another sweep on this folder, or a run left from a sweep that was killed); not started here")
    return f"[{n_done}/{total}] FAILED {run.name}: exit {code}; log {run.log_path()}"


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
            raise DAELConfigError(f"--launcher slurm needs a Slurm cluster: {exc} "
                                  f"(use --launcher local or submitit-local here)") from None
        per_run = args.gpus_per_run
        # One task per process and one GPU per task (submitit's distributed recipe); each
        # task exports torch.distributed's environment (RunJob).
        gpus = max(args.gpus, per_run) if (args.gpus or per_run > 1) else 0
        ex.update_parameters(timeout_min=args.time, slurm_partition=args.partition, gpus_per_node=gpus,
                             tasks_per_node=per_run, cpus_per_task=args.cpus, slurm_array_parallelism=args.workers,
                             name="dael_sweep")
    else:
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(timeout_min=args.time, visible_gpus=tuple(range(args.gpus)) if args.gpus else (),
                             tasks_per_node=args.gpus_per_run)
    for run in runs:
        run.claim()
    if args.launcher == "slurm":  # one job array; Slurm keeps --workers of them running
        dist_env = {DIST_ENV: "1"} if args.gpus_per_run > 1 else {}
        jobs = ex.map_array(RunJob(), [list(r.argv) for r in runs], [r.output_dir for r in runs],
                            [dist_env] * len(runs))
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


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each default that says something (not None, [], False, nor a required flag's)."""

    def _get_help_string(self, action):
        if action.required or action.default is None or action.default is False or action.default == [] \
                or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=_DefaultsHelp)
    p.add_argument("--root", required=True, help="DATASET.ROOT of every run")
    p.add_argument("--dataset-config-file", required=True, help="the dataset config of every run")
    p.add_argument("--trainers", nargs="+", required=True, help="trainer names, e.g. DAEL SourceOnly")
    p.add_argument("--seeds", type=int, nargs="+", default=[1], help="one run per seed")
    p.add_argument("--targets", nargs="+", help="default: every domain, each against the rest")
    p.add_argument("--sources", nargs="+", help="default: every domain but the target")
    p.add_argument("--output-dir", required=True, help="the sweep's folder: one subfolder per run")
    p.add_argument("--grid", nargs="+", action="append", default=[], metavar="KEY V",
                   help="a config key and its values (repeatable): one run per combination")
    p.add_argument("--config", action="append", default=[], metavar="TRAINER=FILE",
                   help="the method config of a trainer (default: <tree>/trainers/<da|dg>/<trainer>/<dataset>.yaml, beside the "
                        "dataset config's <tree>/datasets/)")
    p.add_argument("--engine", default="auto", choices=ENGINES, help="as train.py's --engine")
    p.add_argument("--launcher", default="local", choices=("local", "submitit-local", "slurm"),
                   help="where the runs go: this machine, submitit's local executor, or Slurm")
    p.add_argument("--workers", type=int, default=None,
                   help="runs at a time (default 1; slurm: the array's parallelism, default every run)")
    p.add_argument("--partition", default=None, help="slurm partition")
    p.add_argument("--time", type=int, default=24 * 60, help="minutes per job (submitit launchers)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs per job (submitit launchers)")
    p.add_argument("--cpus", type=int, default=4, help="CPUs per job (slurm; per task with --gpus-per-run)")
    p.add_argument("--gpus-per-run", type=int, default=1,
                   help="processes (GPUs) per run: torchrun --nproc_per_node N on the local launcher; "
                        "N tasks of one GPU each per job on the submitit launchers")
    p.add_argument("--no-wait", action="store_true",
                   help="slurm: submit the job array and exit; relaunch the sweep or run collect.py later")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("opts", nargs="*", help="KEY VALUE options for every run, after every flag")
    return p


_NUMBER = re.compile(r"^-+\d*\.?\d+(e-?\d+)?$")
_KEY = re.compile(r"^[A-Z][A-Z0-9_]*(\.[A-Z0-9_]+)+$")


def split_opts(argv: List[str]) -> Tuple[List[str], List[str]]:
    """Flags, and the trailing ``KEY VALUE`` opts: they start at ``--`` or at the first
    dotted upper-case key that does not follow ``--grid``."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    for i, tok in enumerate(argv):
        if _KEY.match(tok) and (i == 0 or argv[i - 1] != "--grid"):
            return argv[:i], argv[i:]
    return argv, []


def main(argv: Optional[List[str]] = None) -> int:
    from tqdm import tqdm

    p = build_parser()
    flags, opts = split_opts(list(sys.argv[1:] if argv is None else argv))
    args = p.parse_args(flags)
    args.opts = list(args.opts) + opts
    try:
        bad = [g for g in args.grid if len(g) < 2]
        if bad:
            raise DAELConfigError(f"--grid {bad[0][0]} has no values; use --grid KEY V1 [V2 ...]")
        flags_late = [o for o in args.opts if o.startswith("--") and not _NUMBER.match(o)]
        if flags_late:
            raise DAELConfigError(f"{flags_late[0]} comes after the KEY VALUE options {args.opts[0]} ...; "
                                  f"put every flag before them (or the options after --)")
        if len(args.opts) % 2:
            raise DAELConfigError(f"the trailing options {args.opts} are not KEY VALUE pairs")
        if any("=" not in c for c in args.config):
            raise DAELConfigError("--config takes TRAINER=FILE")
        if args.gpus_per_run < 1:
            raise DAELConfigError(f"--gpus-per-run {args.gpus_per_run}: give at least 1")
        if args.workers is not None and args.workers < 1:
            raise DAELConfigError(f"--workers {args.workers}: give at least 1")
        if args.workers is None:
            args.workers = 256 if args.launcher == "slurm" else 1  # 256: submitit's own default
        if args.no_wait and args.launcher != "slurm":
            raise DAELConfigError("--no-wait is for --launcher slurm (local launchers run the sweep here)")
        args.root = os.path.abspath(args.root)
        args.output_dir = os.path.abspath(args.output_dir)
        args.dataset_config_file = os.path.abspath(args.dataset_config_file)
        runs = plan(args)
        changed = [(r, r.changes()) for r in runs if r.changes()]
        if changed:
            run, what = changed[0]
            more = f" (and {len(changed) - 1} more run(s))" if len(changed) > 1 else ""
            raise DAELConfigError(f"{run.output_dir} was launched with other settings than {run.name} has now: "
                                  f"{'; '.join(what)}{more}; its result stays as it is: pass another --output-dir "
                                  "for these settings")
    except DAELConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for folder in {os.path.dirname(os.path.dirname(r.output_dir)) for r in runs}:
        remove_stale_temps(folder, recursive=True)
    todo = [r for r in runs if not r.done()]
    print(f"sweep: {len(runs)} runs ({len(runs) - len(todo)} done, {len(todo)} to run) in {args.output_dir}")
    if args.dry_run:
        for r in runs:
            state = "done" if r.done() else ("resume" if os.path.isfile(os.path.join(r.output_dir, "checkpoint.pth.tar"))
                                              else "new")
            job = os.path.join(r.output_dir, JOB)
            submitted = ""
            if state != "done" and os.path.isfile(job):
                with open(job) as f:
                    submitted = f" (submitted as Slurm job {f.read().strip()})"
            print(f"  [{state:>6}] {r.name}: {r.output_dir}{submitted}")
        return 0
    if not todo:
        return 0
    bar = tqdm(total=len(todo), desc="sweep", unit="run", disable=not sys.stderr.isatty())
    # SIGTERM to the sweep (scancel, a shell's kill) stops it as Ctrl-C does; its runs get SIGTERM
    # from the kernel when it exits (PR_SET_PDEATHSIG), whatever stopped it.
    previous = signal.signal(signal.SIGTERM, _sweep_terminated)
    try:
        if args.launcher == "local":
            tally = launch_local(todo, args.workers, bar, args.gpus_per_run)
        else:
            tally = launch_submitit(todo, args, bar)
    except DAELConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sweep: stopped; its runs stop with it and resume when the sweep is relaunched", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        bar.close()
    if args.no_wait:
        print(f"sweep: {len(todo)} runs submitted; relaunch this command (add --dry-run to only look) "
              f"or run collect.py when they are done")
        return 0
    done, busy, failed = tally["done"], tally["busy"], tally["failed"]
    print(f"sweep: {done} of {len(todo)} runs finished" + (f", {busy} running elsewhere" if busy else "")
          + (f", {failed} failed" if failed else ""))
    return 1 if failed else 0


def _sweep_terminated(signum, _frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
