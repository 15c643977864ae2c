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
- Launchers (:mod:`dael_plugin.tools.launchers`; the plan is :mod:`dael_plugin.tools.sweep_plan`):
  ``local`` runs N workers here, each pinned to one GPU (``--gpus-per-run N``: to a group of N,
  under torchrun) through ``CUDA_VISIBLE_DEVICES`` when GPUs exist; ``slurm`` submits a Slurm job array
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
import os
import re
import signal
import sys
from typing import List, Optional, Tuple

from dael_plugin.about import ENGINES
from dael_plugin.engine.atomic import remove_stale_temps
from dael_plugin.engine.results_reader import IDENTITY, JOB, LOG  # noqa: F401  (the names callers use)
from dael_plugin.errors import DAELConfigError
from dael_plugin.tools.launchers import RunJob, launch_local, launch_submitit, run_one  # noqa: F401
from dael_plugin.tools.sweep_plan import (  # noqa: F401  (the names callers use)
    DIST_ENV,
    TORCHRUN,
    TRAIN,
    Run,
    method_config,
    plan,
    preflight,
    read_dataset,
)


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each default that says something (not None, [], False, nor a required flag's)."""

    def _get_help_string(self, action):
        if (
            action.required
            or action.default is None
            or action.default is False
            or action.default == []
            or "default" in (action.help or "")
        ):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=_DefaultsHelp)
    p.add_argument("--root", required=True, help="DATASET.ROOT of every run")
    p.add_argument("--dataset-config-file", required=True, help="the dataset config of every run")
    p.add_argument("--trainers", nargs="+", required=True, help="trainer names, e.g. DAEL SourceOnly")
    p.add_argument("--seeds", type=int, nargs="+", default=[1], help="one run per seed")
    p.add_argument("--targets", nargs="+", help="default: every domain, each against the rest")
    p.add_argument("--sources", nargs="+", help="default: every domain but the target")
    p.add_argument("--output-dir", required=True, help="the sweep's folder: one subfolder per run")
    p.add_argument(
        "--grid",
        nargs="+",
        action="append",
        default=[],
        metavar="KEY V",
        help="a config key and its values (repeatable): one run per combination",
    )
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="TRAINER=FILE",
        help="the method config of a trainer (default: <tree>/trainers/<da|dg>/<trainer>/<dataset>.yaml, beside the "
        "dataset config's <tree>/datasets/)",
    )
    p.add_argument(
        "--init-weights-from",
        default=None,
        metavar="SWEEP_DIR",
        help="ADDA and AdaBN: MODEL.INIT_WEIGHTS of each run from the finished SourceOnly run of the same "
        "target, sources and seed in this sweep folder (a missing one is refused before any run)",
    )
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="as train.py's --plugin: a module (or .py file) that registers trainers of your own; every run "
        "imports it (repeatable)",
    )
    p.add_argument("--engine", default="auto", choices=ENGINES, help="as train.py's --engine")
    p.add_argument(
        "--launcher",
        default="local",
        choices=("local", "submitit-local", "slurm"),
        help="where the runs go: this machine, submitit's local executor, or Slurm",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="runs at a time (default 1; slurm: the array's parallelism, default every run)",
    )
    p.add_argument("--partition", default=None, help="slurm partition")
    p.add_argument("--time", type=int, default=24 * 60, help="minutes per job (submitit launchers)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs per job (submitit launchers)")
    p.add_argument("--cpus", type=int, default=4, help="CPUs per job (slurm; per task with --gpus-per-run)")
    p.add_argument(
        "--gpus-per-run",
        type=int,
        default=1,
        help="processes (GPUs) per run: torchrun --nproc_per_node N on the local launcher; "
        "N tasks of one GPU each per job on the submitit launchers",
    )
    p.add_argument(
        "--no-wait",
        action="store_true",
        help="slurm: submit the job array and exit; relaunch the sweep or run collect.py later",
    )
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
        return argv[:i], argv[i + 1 :]
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
        for flag, values in [
            ("--seeds", args.seeds),
            ("--trainers", args.trainers),
            ("--targets", args.targets or []),
        ] + [(f"--grid {g[0]}", g[1:]) for g in args.grid]:
            twice = sorted({str(v) for v in values if list(values).count(v) > 1})
            if twice:
                raise DAELConfigError(
                    f"{flag} names {', '.join(twice)} twice: two runs would share one folder; give each value once"
                )
        flags_late = [o for o in args.opts if o.startswith("--") and not _NUMBER.match(o)]
        if flags_late:
            raise DAELConfigError(
                f"{flags_late[0]} comes after the KEY VALUE options {args.opts[0]} ...; "
                f"put every flag before them (or the options after --)"
            )
        if len(args.opts) % 2:
            raise DAELConfigError(f"the trailing options {args.opts} are not KEY VALUE pairs")
        if any("=" not in c for c in args.config):
            raise DAELConfigError("--config takes TRAINER=FILE")
        missing = [c for c in args.config if not os.path.isfile(os.path.expanduser(c.split("=", 1)[1]))]
        if missing:
            raise DAELConfigError(f"--config {missing[0]}: no such file")
        out_of_range = [s for s in args.seeds if not 0 <= s <= 2**32 - 1]
        if out_of_range:  # -1 would draw each run's seed: a row's seeds would be unknown
            raise DAELConfigError(f"--seeds {out_of_range[0]}: a seed is a whole number from 0 to 4294967295")
        if args.gpus_per_run < 1:
            raise DAELConfigError(f"--gpus-per-run {args.gpus_per_run}: give at least 1")
        if args.workers is not None and args.workers < 1:
            raise DAELConfigError(f"--workers {args.workers}: give at least 1")
        if args.workers is None:
            args.workers = 256 if args.launcher == "slurm" else 1  # 256: submitit's own default
        if args.no_wait and args.launcher != "slurm":
            raise DAELConfigError("--no-wait is for --launcher slurm (local launchers run the sweep here)")
        # A quoted '~/x' reaches us unexpanded: it means the home folder, never a folder named '~'.
        args.root = os.path.abspath(os.path.expanduser(args.root))
        args.output_dir = os.path.abspath(os.path.expanduser(args.output_dir))
        args.dataset_config_file = os.path.abspath(os.path.expanduser(args.dataset_config_file))
        runs = plan(args)
        changed = [(r, r.changes()) for r in runs if r.changes()]
        if changed:
            run, what = changed[0]
            more = f" (and {len(changed) - 1} more run(s))" if len(changed) > 1 else ""
            raise DAELConfigError(
                f"{run.output_dir} was launched with other settings than {run.name} has now: "
                f"{'; '.join(what)}{more}; its result stays as it is: pass another --output-dir "
                "for these settings"
            )
        # the runs still to run (a finished sweep's status needs no torch); a compute node may hold
        # data that the sweep's host lacks
        preflight([r for r in runs if not r.done()], data=args.launcher != "slurm")
    except DAELConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for folder in {os.path.dirname(os.path.dirname(r.output_dir)) for r in runs}:
        remove_stale_temps(folder, recursive=True)
    todo = [r for r in runs if not r.done()]
    print(f"sweep: {len(runs)} runs ({len(runs) - len(todo)} done, {len(todo)} to run) in {args.output_dir}")
    if args.dry_run:
        for r in runs:
            state = (
                "done"
                if r.done()
                else ("resume" if os.path.isfile(os.path.join(r.output_dir, "checkpoint.pth.tar")) else "new")
            )
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
        print(
            f"sweep: {len(todo)} runs submitted; relaunch this command (add --dry-run to only look) "
            f"or run collect.py when they are done"
        )
        return 0
    done, busy, failed = tally["done"], tally["busy"], tally["failed"]
    print(
        f"sweep: {done} of {len(todo)} runs finished"
        + (f", {busy} running elsewhere" if busy else "")
        + (f", {failed} failed" if failed else "")
    )
    return 1 if failed else 0


def _sweep_terminated(signum, _frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
