"""A sweep's plan: every run (trainer x target x seed x grid setting), its command, its folder
and the settings it is launched with (its identity). Nothing here starts a process
(:mod:`dael_plugin.tools.launchers` does; :mod:`dael_plugin.tools.sweep` is the CLI)."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from dael_plugin.engine.atomic import read_json_dict, write_json
from dael_plugin.engine.results_reader import IDENTITY, LOG
from dael_plugin.errors import DAELConfigError
from dael_plugin.tools.plugins import absolute, is_file, load_plugins

# Each run is ``python -m dael_plugin.tools.train``: the installed package, or this checkout
# (put on the runs' PYTHONPATH), never a script path relative to a checkout.
TRAIN = ("-m", "dael_plugin.tools.train")
# N processes for one run on the local launcher: torchrun on a free port (--standalone).
TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node")
DIST_ENV = "DAEL_SWEEP_DISTRIBUTED"  # set in a submitit job of N tasks: export torch.distributed's env
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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

    def changes(self) -> List[str]:
        """How this run's settings differ from those its folder was launched with ([] if none)."""
        diff = settings_changes(os.path.join(self.output_dir, IDENTITY), dict(self.identity))
        if diff is None:
            if os.path.isfile(os.path.join(self.output_dir, "results.json")):
                return ["the folder holds a record of a run whose settings were not written down"]
            return []
        return diff

    def done(self) -> bool:
        """Finished, with exactly these settings: a record, and the identity it was launched with."""
        return os.path.isfile(os.path.join(self.output_dir, "results.json")) and not self.changes()

    def claim(self) -> None:
        """Write down the settings the folder is launched with (before the run starts)."""
        if not os.path.lexists(os.path.join(self.output_dir, IDENTITY)):
            write_json(os.path.join(self.output_dir, IDENTITY), dict(self.identity))

    def log_path(self) -> str:
        return os.path.join(self.output_dir, LOG)


def settings_changes(path: str, now: dict) -> Optional[List[str]]:
    """How ``now`` differs from the settings a run folder's file ``path`` records (``sweep_run.json``,
    the category-shift benchmark's ``category_shift_run.json``): None when there is no such file,
    [] when they are the same. A file that cannot be read as settings (a FIFO, which would block a
    plain ``open``; an edited or truncated file) is one difference, naming it."""
    try:
        had = read_json_dict(path)
    except ValueError as exc:
        return [f"its {os.path.basename(path)} {exc}"]
    if had is None:
        return None
    return [
        f"{k}: {had.get(k, '<absent>')} -> {now.get(k, '<absent>')}"
        for k in sorted(set(had) | set(now))
        if had.get(k) != now.get(k)
    ]


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", text).strip("-")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", name).lower()


def read_dataset(path: str) -> Tuple[str, str, List[str]]:
    """``(DATASET.NAME, setting da|dg|ssl, its domains)`` from a dataset config file (the setting: the
    folder it is in, where that is one of them, else the dataset's kind)."""
    import yaml

    from dael_plugin.data.folders import known_dataset

    try:
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
        name = doc["DATASET"]["NAME"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        raise DAELConfigError(f"--dataset-config-file {path}: not a dataset config with DATASET.NAME") from None
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    setting = next((s for s in ("dg", "da", "ssl") if s in parts), None)
    domains: Optional[List[str]] = None
    try:
        known, unlabeled_target = known_dataset(name)
        domains = list(known) if known else None
        setting = setting or ("da" if unlabeled_target else "dg")
    except KeyError:  # a dataset only Dassl reads
        pass
    if domains is None:
        try:
            from dassl.data.datasets import DATASET_REGISTRY

            domains = list(getattr(DATASET_REGISTRY.get(name), "domains", []) or []) or None
        except Exception:  # Dassl absent, or no such dataset there
            domains = None
    return name, setting or "da", domains or []


def method_config(trainer: str, setting: str, dataset_cfg: str) -> str:
    """A trainer's method config, found in the dataset config's own tree: for
    ``<tree>/datasets/<da|dg|ssl>/<name>.yaml`` it is ``<tree>/trainers/<da|dg|ssl>/<trainer>/<name>.yaml``
    (the layout of this project's ``configs/``, and of Dassl's)."""
    base = os.path.splitext(os.path.basename(dataset_cfg))[0]
    here = os.path.dirname(os.path.abspath(dataset_cfg))
    while os.path.basename(here) != "datasets":
        parent = os.path.dirname(here)
        if parent == here:
            raise DAELConfigError(
                f"cannot find the method config of {trainer}: the dataset config {dataset_cfg} is not under a "
                "'datasets/' folder with a 'trainers/' folder beside it; pass --config TRAINER=FILE"
            )
        here = parent
    path = os.path.join(os.path.dirname(here), "trainers", setting, _snake(trainer), f"{base}.yaml")
    if not os.path.isfile(path):
        raise DAELConfigError(f"no method config for {trainer} at {path}; pass --config TRAINER=FILE")
    return path


def _check_grid_values(key: str, values: List[str]) -> None:
    """One setting written twice (``0.1 0.10 1e-1``, read as yacs reads a value) would be one
    setting run in several folders, each counted as a row: one line."""
    from yacs.config import CfgNode

    seen: Dict[str, List[str]] = {}
    for v in values:
        seen.setdefault(repr(CfgNode._decode_cfg_value(v)), []).append(v)
    for value, spellings in seen.items():
        if len(spellings) > 1:
            raise DAELConfigError(
                f"--grid {key} lists one value more than once ({' '.join(spellings)} are all {value}); "
                "list each setting once"
            )


def plan(args: argparse.Namespace) -> List[Run]:
    """Every run of the sweep, in a fixed order."""
    from dael_plugin.data.folders import official_split

    dataset, setting, domains = read_dataset(args.dataset_config_file)
    split = official_split(dataset)  # (a WILDS dataset: train -> test, its own split)
    targets = list(args.targets or (split[1] if split else domains))
    if not targets:
        raise DAELConfigError(f"the domains of {dataset} are not known here; pass --targets (and --sources)")
    unknown = [t for t in targets if domains and t not in domains]
    if unknown:
        raise DAELConfigError(f"--targets {unknown} are not domains of {dataset} ({domains})")
    overrides = dict(c.split("=", 1) for c in args.config)
    for key, *values in args.grid:
        _check_grid_values(key, values)
    engine = _resolved_engine(args.engine)
    dataset_sha = _sha256(args.dataset_config_file)
    plugins = absolute(getattr(args, "plugin", None) or [])
    load_plugins(plugins)  # a plugin that cannot be imported stops the sweep, not each of its runs
    runs = []
    for trainer in args.trainers:
        # A grid key of another trainer's node (TRAINER.DAEL.* for SourceOnly) is not
        # this trainer's: its runs do not multiply by it.
        grid = [
            (g[0], g[1:])
            for g in args.grid
            if not (g[0].startswith("TRAINER.") and g[0].split(".")[1].upper() != trainer.upper())
        ]
        cfg_file = overrides.get(trainer) or method_config(trainer, setting, args.dataset_config_file)
        for target, combo, seed in itertools.product(targets, itertools.product(*[v for _, v in grid]), args.seeds):
            sources = tuple(args.sources or (split[0] if split else [d for d in domains if d != target]))
            if not sources:
                raise DAELConfigError(f"no source domains for target {target}; pass --sources")
            setting_kv = tuple(zip([k for k, _ in grid], combo))
            parts = [args.output_dir, dataset, trainer]
            if setting_kv:
                parts.append(_slug(",".join(f"{_short(k)}={v}" for k, v in setting_kv)))
            out = os.path.join(*parts, _slug(target), f"seed{seed}")
            per_run = int(getattr(args, "gpus_per_run", 1) or 1)
            launch = (*TORCHRUN, str(per_run)) if per_run > 1 and args.launcher == "local" else ()
            argv = [
                sys.executable,
                *launch,
                *TRAIN,
                "--engine",
                args.engine,
                "--trainer",
                trainer,
                "--root",
                args.root,
                "--dataset-config-file",
                args.dataset_config_file,
                "--config-file",
                cfg_file,
                "--source-domains",
                *sources,
                "--target-domains",
                target,
                "--output-dir",
                out,
                "--seed",
                str(seed),
                *[a for p in plugins for a in ("--plugin", p)],
                *args.opts,
            ]
            for k, v in setting_kv:
                argv += [k, str(v)]
            init = source_model_for(args, dataset, trainer, target, sources, seed)
            if init:
                argv += ["MODEL.INIT_WEIGHTS", init]
            identity = {
                "trainer": trainer,
                "target": target,
                "sources": " ".join(sources),
                "seed": str(seed),
                "engine": engine,
                "grid": " ".join(f"{k}={v}" for k, v in setting_kv),
                "options": " ".join(f"{k}={v}" for k, v in zip(args.opts[::2], args.opts[1::2])),
                "method config": f"{cfg_file} (sha256 {_sha256(cfg_file)[:12]})",
                "dataset config": f"{args.dataset_config_file} (sha256 {dataset_sha[:12]})",
            }
            if plugins:  # the code of a method of the user's own is part of what the run is
                identity["plugins"] = " ".join(f"{p} (sha256 {_sha256(p)[:12]})" if is_file(p) else p for p in plugins)
            if init:
                identity["init weights"] = f"{init} (sha256 {_sha256(init)[:12]})"
            if per_run > 1:  # a run resumes only on as many processes as it started with
                identity["processes"] = str(per_run)
            runs.append(
                Run(
                    trainer,
                    target,
                    sources,
                    seed,
                    setting_kv,
                    cfg_file,
                    out,
                    tuple(argv),
                    tuple(sorted(identity.items())),
                )
            )
    return runs


# The trainers that adapt a source model (MODEL.INIT_WEIGHTS): --init-weights-from gives them one.
ADAPTS_A_SOURCE_MODEL = ("ADDA", "AdaBN")


def source_model_for(args, dataset: str, trainer: str, target: str, sources, seed: int) -> str:
    """``--init-weights-from``: the last checkpoint of the finished SourceOnly run of this target,
    sources and seed under that sweep folder ("" for a trainer that adapts none, or without the flag).
    One line where it is missing, unfinished, of other sources, or not one run."""
    root = getattr(args, "init_weights_from", None)
    if not root or trainer not in ADAPTS_A_SOURCE_MODEL:
        return ""
    if any(k == "MODEL.INIT_WEIGHTS" for k in args.opts[::2]):
        raise DAELConfigError("--init-weights-from and MODEL.INIT_WEIGHTS both name the source model: give one")
    root = os.path.abspath(os.path.expanduser(root))
    base = os.path.join(root, dataset, "SourceOnly")
    found = []
    for dirpath, _dirs, files in os.walk(base):
        if "results.json" in files and os.path.basename(dirpath) == f"seed{seed}":
            if os.path.basename(os.path.dirname(dirpath)) == _slug(target):
                found.append(dirpath)
    where = f"{base}/.../{_slug(target)}/seed{seed}/results.json"
    if not found:
        raise DAELConfigError(
            f"--init-weights-from {root}: no finished SourceOnly run for target {target} seed {seed} ({where}); "
            "run the SourceOnly sweep into it first"
        )
    if len(found) > 1:
        raise DAELConfigError(
            f"--init-weights-from {root}: {len(found)} SourceOnly runs for target {target} seed {seed} "
            f"({found[0]}, {found[1]}): keep one grid setting of SourceOnly in that folder"
        )
    try:
        rec = read_json_dict(os.path.join(found[0], "results.json")) or {}
    except ValueError as exc:
        raise DAELConfigError(f"--init-weights-from {root}: {exc}") from None
    if sorted(rec.get("source_domains") or ()) != sorted(sources) or not rec.get("finished"):
        raise DAELConfigError(
            f"--init-weights-from {root}: the SourceOnly run {found[0]} is "
            + (
                "unfinished"
                if not rec.get("finished")
                else f"of sources {rec.get('source_domains')}, not {list(sources)}"
            )
        )
    epochs = rec.get("epochs")
    for path in (
        os.path.join(found[0], f"model.pth.tar-{epochs}"),
        os.path.join(found[0], "model", f"model.pth.tar-{epochs}"),
    ):
        if os.path.isfile(path):
            return path
    raise DAELConfigError(f"--init-weights-from {root}: the SourceOnly run {found[0]} has no model.pth.tar-{epochs}")


def _sha256(path: str) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _resolved_engine(engine: str) -> str:
    if engine != "auto":
        return engine
    from dael_plugin.about import HAS_DASSL

    return "dassl" if HAS_DASSL else "builtin"


def preflight(runs: List[Run], data: bool = True) -> None:
    """Each trainer, grid setting and target of the sweep, read as its runs will read it (the
    config, its keys and values, the names and, with ``data``, the dataset's file lists): a
    setting that every one of its runs would refuse at once (a mistyped grid key, a value out of
    range) is one line before any run is launched. Seeds do not change what is checked, so one
    run per setting and target is read, in this process (which then imports torch)."""
    from dael_plugin.tools.train_cli import build_parser
    from dael_plugin.tools.train_config import check_names_and_files, setup_cfg

    parser, seen = build_parser(), set()
    for run in runs:
        if (run.trainer, run.grid, run.target) in seen:
            continue
        seen.add((run.trainer, run.grid, run.target))
        at = next(i for i in range(len(run.argv)) if run.argv[i : i + 2] == TRAIN) + 2
        args = parser.parse_args(list(run.argv[at:]))
        engine = _resolved_engine(args.engine)
        try:
            cfg = setup_cfg(args, engine, said=[])
            check_names_and_files(cfg, engine, data)
            processes = dict(run.identity).get("processes")  # a run of N processes (--gpus-per-run)
            if processes:
                from dael_plugin.tools.train import check_torchrun_trainer

                with _as_under_torchrun(processes):  # what its ranks will see; a method's check reads it
                    check_torchrun_trainer(cfg, engine)
        except DAELConfigError as exc:
            raise DAELConfigError(
                f"{run.name.rsplit(' seed ', 1)[0]} would stop at once (no run was launched): {exc}"
            ) from None


@contextlib.contextmanager
def _as_under_torchrun(processes: str):
    """This process's ``WORLD_SIZE`` as a run of ``processes`` will have it, for the length of a check."""
    before = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = processes
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("WORLD_SIZE", None)
        else:
            os.environ["WORLD_SIZE"] = before
