"""A run's config, assembled as Dassl assembles it, and checked before anything is written.

Defaults -> ``add_dael_config`` -> dataset config file -> method config file -> command-line flags
-> trailing ``KEY VALUE`` opts -> ``clean_cfg`` for the trainer actually run. Config files are read
as data (never imported); an unknown key is one line with the likely spelling or the engine that
has it; the trainer, dataset and domain names are checked before the output folder is made."""

from __future__ import annotations

import argparse
import difflib
import re
from typing import List, Optional

from yacs.config import CfgNode as CN

from dael_plugin.backbones.timm_backbone import check_timm_backbone
from dael_plugin.config import TRAINER_NODES, add_dael_config, check_run_values
from dael_plugin.config.defaults import check_supported_values
from dael_plugin.config.execution import PLAIN_RUN, execution_from_cfg, resolve_execution
from dael_plugin.config.keys import check_other_node, full_keys, hparams_from_cfg
from dael_plugin.config.table import EXECUTION_KEYS
from dael_plugin.engine.seed import draw_seed
from dael_plugin.errors import DAELConfigError
from dael_plugin.tools import pixel_stats
from dael_plugin.tools.train_cli import check_list_flags


def merge_file(cfg: CN, path: str, engine: str, auto: Optional[dict] = None) -> dict:
    """Merge a config file as data: YAML read as data (:mod:`dael_plugin.config.strict_yaml`), never
    imported (yacs's ``merge_from_file`` would import a ``.py`` file and run it). ``auto``: where
    ``INPUT.PIXEL_MEAN`` / ``PIXEL_STD`` set to ``auto`` are noted (:mod:`dael_plugin.tools.pixel_stats`)."""
    from dael_plugin.config.strict_yaml import load_config_file

    if path.endswith(".py"):
        raise DAELConfigError(
            f"config file {path} is a Python file; config files are YAML, read as data and "
            "never run: write its KEY: value pairs to a .yaml file"
        )
    loaded = load_config_file(path)  # no aliases, no duplicate keys, a small regular file
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise DAELConfigError(
            f"config file {path} holds a {type(loaded).__name__}, not a mapping of KEY: value; "
            "see configs/ for examples"
        )
    loaded = pixel_stats.take_from_file(loaded, {} if auto is None else auto)
    _coerce_numbers(cfg, loaded)
    try:
        cfg.merge_from_other_cfg(CN(loaded))  # yacs decodes the values as merge_from_file does
    except KeyError as exc:
        raise DAELConfigError(key_error(exc, engine, f"config file {path}", cfg)) from None
    except (ValueError, AssertionError, TypeError) as exc:
        raise DAELConfigError(f"config file {path}: {value_error(exc)}") from None
    return loaded


# yacs's words for a value of another type than the key's default
_MISMATCH = re.compile(
    r"Type mismatch \(<class '([\w.]+)'> vs\. <class '([\w.]+)'>\) with values \((.*) vs\. (.*)\) for config key: (\S+)",
    re.DOTALL,  # a group's value is the group's keys, a line each
)


_KINDS = {
    "int": "a whole number",
    "float": "a number",
    "str": "a string",
    "bool": "True or False",
    "tuple": "a list",
    "list": "a list",
    "yacs.config.CfgNode": "a group of keys",
}


def value_error(exc: Exception) -> str:
    """yacs's refusal of a value, in one line: its type mismatch as what the key takes."""
    m = _MISMATCH.match(str(exc))
    if m:
        takes, given, default, value, key = (_KINDS.get(g, g) for g in m.groups())
        if takes == _KINDS["yacs.config.CfgNode"]:  # OPTIM: 5
            first = default.split(":", 1)[0].strip()
            return f"{key}={value} is {given}; {key} is {takes} ({key}.{first}, ...): set one of them"
        if given == _KINDS["yacs.config.CfgNode"]:  # LR: {a: 1}
            value = "{" + ", ".join(v.strip() for v in value.splitlines()) + "}"
        return f"{key}={value} is {given}; the key takes {takes}, as {default}"
    said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return said[:300] + (" ..." if len(said) > 300 else "")


def _coerce_numbers(cfg: CN, loaded: dict, prefix: str = "") -> None:
    """A file's numbers as the command line reads them (:func:`coerce_opts`): an integer for a
    float key is that float (``LR: 1``), and a real value for a key of :data:`REAL_KEYS` is taken."""
    for key, value in loaded.items():
        current = cfg.get(key) if isinstance(cfg, CN) else None
        if isinstance(value, dict):
            _coerce_numbers(current, value, f"{prefix}{key}.")
        elif f"{prefix}{key}" in REAL_KEYS and type(current) is int and type(value) is float:
            cfg[key] = float(current)
        elif type(current) is float and type(value) is int:
            loaded[key] = float(value)


def key_error(exc: Exception, engine: str, where: str, cfg: Optional[CN] = None) -> str:
    msg = str(exc.args[0]) if exc.args else str(exc)
    key = msg.split(":", 1)[-1].strip() if "Non-existent" in msg else msg
    close = difflib.get_close_matches(key, full_keys(cfg), n=1, cutoff=0.8) if cfg is not None else []
    if engine == "builtin":
        from dael_plugin.config.dassl_keys import DASSL_KEYS

        if key in DASSL_KEYS:  # one of Dassl's keys, which this engine lacks: the fix is the engine
            return (
                f"{where} sets {key}, one of Dassl's keys, which the built-in engine does not support; "
                "remove it, or install Dassl and use --engine dassl"
            )
    if close:  # a typo: the fix is the spelling, whatever the engine
        return f"{where} sets {key}, which is not a config key; did you mean {close[0]}?"
    return f"{where} sets {key}, which is not a config key (keys are upper case, e.g. OPTIM.LR)"


def reset_cfg(cfg: CN, args: argparse.Namespace) -> None:
    if args.root:
        cfg.DATASET.ROOT = args.root
    if args.output_dir:
        cfg.OUTPUT_DIR = args.output_dir
    if args.resume:
        cfg.RESUME = args.resume
    if args.seed is not None:
        cfg.SEED = args.seed
    if args.source_domains:
        cfg.DATASET.SOURCE_DOMAINS = args.source_domains
    if args.target_domains:
        cfg.DATASET.TARGET_DOMAINS = args.target_domains
    if args.transforms:
        cfg.INPUT.TRANSFORMS = args.transforms
    if args.trainer:
        cfg.TRAINER.NAME = args.trainer
    if args.backbone:
        cfg.MODEL.BACKBONE.NAME = args.backbone
    if args.head:
        if "HEAD" not in cfg.MODEL:
            raise DAELConfigError("--head is not supported by the built-in engine; use --engine dassl")
        cfg.MODEL.HEAD.NAME = args.head


# Real-valued keys whose default is an integer (Dassl's 0), so that yacs refused any other value
REAL_KEYS = ("OPTIM.SGD_DAMPNING",)


def coerce_opts(cfg: CN, opts: List[str]) -> List[str]:
    """What yacs would refuse as a type mismatch, read as meant (nothing yacs accepts changes):
    ``TRAINER.DAEL.WEIGHT_U 0`` is 0.0 for a float key, ``OPTIM.SGD_DAMPNING 0.5`` a real value for
    a real-valued key whose default is the integer 0, and a list key given bare words,
    ``TRAINER.DAEL.CLASS_MASKS all`` or ``SELECTION.KEEP_BEST im,oracle``, is that list."""
    out = list(opts)
    for i in range(0, len(out) - 1, 2):
        node, parts = cfg, str(out[i]).split(".")
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, CN) else None
        current = node.get(parts[-1]) if isinstance(node, CN) else None
        value = str(out[i + 1])
        if out[i] in REAL_KEYS and type(current) is int and not re.fullmatch(r"[-+]?\d+", value):
            node[parts[-1]] = float(current)  # this run's value is real: yacs then takes it
            current = node[parts[-1]]
        if isinstance(current, float) and not isinstance(current, bool) and re.fullmatch(r"[-+]?\d+", value):
            out[i + 1] = str(float(value))
        elif isinstance(current, (list, tuple)) and re.fullmatch(r"[A-Za-z_][\w.\-]*(,[A-Za-z_][\w.\-]*)*", value):
            out[i + 1] = repr(value.split(","))
    return out


def setup_cfg(args: argparse.Namespace, engine: str, said: Optional[List[str]] = None) -> CN:
    """The run's config from the files and flags, checked and frozen. ``said``: where the line of
    ``SEED -1``'s draw goes, for the caller to print once the run's names are checked too (a
    refused run says its refusal alone); None: printed here."""
    if engine == "dassl":
        from dassl.config import clean_cfg, get_cfg_default

        cfg = get_cfg_default()
    else:
        from dael_plugin.config.defaults import get_builtin_cfg

        cfg = get_builtin_cfg()
        clean_cfg = builtin_clean_cfg
    add_dael_config(cfg)
    auto: dict = {}  # INPUT.PIXEL_MEAN / PIXEL_STD: auto, as the last file or option to set them says
    if args.dataset_config_file:
        merge_file(cfg, args.dataset_config_file, engine, auto)
    method = merge_file(cfg, args.config_file, engine, auto) if args.config_file else {}
    reset_cfg(cfg, args)
    check_method_file_fits(method, args.config_file, str(cfg.TRAINER.NAME))
    check_list_flags(args)
    opts = list(args.opts or [])
    if opts and opts[0] == "--":
        opts = opts[1:]
    flags = [o for o in opts[::2] if o.startswith("--")]
    if flags:
        raise DAELConfigError(
            f"flag {flags[0]} comes after the trailing KEY VALUE options, where it would be read as a config "
            "key; put every --flag before the first KEY VALUE pair"
        )
    if len(opts) % 2:
        raise DAELConfigError(f"trailing options must be KEY VALUE pairs, got {opts}")
    try:
        cfg.merge_from_list(coerce_opts(cfg, pixel_stats.take_from_opts(opts, auto)))
    except (KeyError, AssertionError) as exc:  # yacs asserts on unknown keys here
        raise DAELConfigError(key_error(exc, engine, "the command line", cfg)) from None
    except ValueError as exc:
        raise DAELConfigError(f"the command line: {value_error(exc)}") from None
    from dael_plugin.data.folders import apply_official_split, check_unread_keys

    apply_official_split(cfg.DATASET)
    check_unread_keys(cfg.DATASET)
    if not cfg.TRAINER.NAME:
        raise DAELConfigError("no trainer given; pass --trainer DAEL (or DAELDG, SourceOnly, M3SDA, MME, ...)")
    if not str(cfg.DATASET.ROOT).strip():
        raise DAELConfigError(
            "no dataset root given; pass --root DIR (the folder that holds the dataset; the embedded set "
            "is generated there on first use). Nothing is written into the current directory"
        )
    check_run_values(cfg)
    seed_line = draw_seed(cfg, args.model_dir if args.eval_only else None)
    fresh = get_cfg_default() if engine == "dassl" else get_builtin_cfg()
    check_other_node(cfg, add_dael_config(fresh))
    if str(cfg.TRAINER.NAME).upper() in TRAINER_NODES:
        hparams_from_cfg(cfg)  # DAEL's values (weights, switches) before the output folder is made
    if engine == "builtin":
        advice = "change it, or run one of Dassl's own trainers with --engine dassl"
        check_supported_values(cfg, "on the built-in engine", advice)
        from dael_plugin.engine.trainer import check_optim_values

        check_optim_values(cfg.OPTIM)
    check_timm_backbone(cfg.MODEL.BACKBONE.NAME)  # before either engine reads any data
    check_weights_reachable(cfg, engine)
    pixel_stats.resolve(cfg, auto)  # the numbers, in the config that is recorded
    from dael_plugin.transforms.host import check_transform_values

    check_transform_values(cfg)
    clean_cfg(cfg, cfg.TRAINER.NAME)
    resolve_run_execution(cfg, engine)
    cfg.freeze()
    if seed_line and said is not None:
        said.append(seed_line)
    elif seed_line:
        print(seed_line)
    return cfg


def check_weights_reachable(cfg: CN, engine: str) -> None:
    """Pretrained weights (timm's, or Dassl's own backbone's on the Dassl engine) neither on this
    machine nor reachable: one line before the output folder is made or any data read."""
    from dael_plugin.backbones import TIMM_PREFIX, timm_name_of
    from dael_plugin.backbones.record import check_dassl_pretrained_reachable
    from dael_plugin.backbones.timm_backbone import check_pretrained_reachable

    b = cfg.MODEL.BACKBONE
    name = str(b.NAME)
    if not bool(b.get("PRETRAINED", False)) or str(b.get("WEIGHTS", "") or ""):
        return
    if engine == "dassl" and not name.startswith(TIMM_PREFIX):
        check_dassl_pretrained_reachable(name)  # Dassl's own backbone, with Dassl's own weights
        return
    timm_name = timm_name_of(name)
    if not timm_name:
        return
    check_pretrained_reachable(timm_name)


def resolve_run_execution(cfg: CN, engine: str) -> None:
    """``EXECUTION.*`` as this trainer runs them, written into the config (so into its record and
    checkpoint): the built-in trainers take them all (DAEL's step keys only DAEL); on the Dassl
    engine the plugin's DAEL trainers and its own methods do (dassl_adapter/method_trainer.py), and Dassl's
    own trainers, which run as Dassl wrote them, refuse any in one line."""
    name = str(cfg.TRAINER.NAME)
    if engine == "builtin" or (engine == "dassl" and plugin_method_on_dassl(name)):
        from dael_plugin.methods import trainer_class

        try:
            cls = trainer_class(name)
        except DAELConfigError:
            return  # an unknown trainer is said in its own line, by the checks that follow
        resolve_execution(cfg, cls.execution_defaults, "" if cls.dael_step else name)
        return
    if name.upper() in TRAINER_NODES:
        resolve_execution(cfg)
        return
    plain = execution_from_cfg(cfg)
    said = [
        f"{k.name}={getattr(plain, k.field)!r}"
        for k in EXECUTION_KEYS
        if getattr(plain, k.field) != getattr(PLAIN_RUN, k.field)
    ]
    if said:
        raise DAELConfigError(
            f"EXECUTION.{said[0]}: Dassl's own {name} runs as Dassl wrote it, without the plugin's execution "
            f"options; remove the key, or use --engine builtin, whose {name} takes them"
        )
    resolve_execution(cfg)


def plugin_method_on_dassl(name: str) -> bool:
    """A method of the plugin's registry that Dassl lacks, which runs on Dassl's loop there (none
    without Dassl: a config is read for the Dassl engine there too, by the checks and tests)."""
    from dael_plugin.about import HAS_DASSL

    if not HAS_DASSL:
        return False
    from dael_plugin.dassl_adapter.method_trainer import has_method_trainer

    return has_method_trainer(name)


def check_method_file_fits(method: dict, path: str, trainer: str) -> None:
    """A DAEL method config given to the other DAEL trainer (a DA ``TRAINER.DAEL`` file with
    ``--trainer DAELDG``, or the reverse) would be dropped by ``clean_cfg``: the run would train
    on the defaults without a word."""
    nodes = (
        [k for k in (method.get("TRAINER") or {}) if k in TRAINER_NODES]
        if isinstance(method.get("TRAINER"), dict)
        else []
    )
    if not nodes or trainer.upper() not in TRAINER_NODES or trainer.upper() in nodes:
        return  # (another trainer's own node, e.g. M3SDA's, is that trainer's business)
    setting = "dg" if trainer.upper() == "DAELDG" else "da"
    raise DAELConfigError(
        f"config file {path} configures TRAINER.{nodes[0]}, but --trainer {trainer} reads TRAINER.{trainer.upper()}: "
        f"pass the {trainer} method config (configs/trainers/{setting}/{trainer.lower()}/<dataset>.yaml)"
    )


def builtin_clean_cfg(cfg: CN, trainer: str) -> None:
    for key in list(cfg.TRAINER.keys()):
        if key not in ("NAME", trainer.upper()):
            cfg.TRAINER.pop(key, None)


def settings_digest(cfg: CN) -> str:
    """What makes a run this run: its config without the keys that only say how to run it (the same
    ones a resume may change, engine/checkpoint.py), hashed."""
    import hashlib

    from dael_plugin.engine.checkpoint import comparable_config

    return hashlib.sha256(comparable_config(cfg).encode()).hexdigest()[:16]


def check_names_and_files(cfg: CN, engine: str, data: bool = True) -> None:
    """The trainer, dataset, domain and backbone names, and (``data``) the dataset's file lists."""
    if engine == "dassl":
        from dael_plugin.dassl_adapter.checks import check_run_names

        check_run_names(cfg, data)
        return
    from dael_plugin.data.folders import check_dataset_files, check_dataset_names, dataset_options
    from dael_plugin.methods import trainer_names

    if cfg.TRAINER.NAME not in trainer_names():
        close = difflib.get_close_matches(str(cfg.TRAINER.NAME), trainer_names(), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise DAELConfigError(
            f"trainer {cfg.TRAINER.NAME!r}{hint} is not available on the built-in engine (it has "
            f"{trainer_names()}); a trainer of your own: --plugin MODULE, the module that registers it "
            "(docs/internals.md); one that only Dassl has: install Dassl and use --engine dassl"
        )
    check_dataset_names(cfg.DATASET.NAME, cfg.DATASET.SOURCE_DOMAINS, cfg.DATASET.TARGET_DOMAINS)
    if not data:
        return
    check_dataset_files(
        cfg.DATASET.NAME,
        cfg.DATASET.ROOT,
        cfg.DATASET.SOURCE_DOMAINS,
        cfg.DATASET.TARGET_DOMAINS,
        bool(cfg.DATASET.get("CATEGORY_SHIFT", False)),
        dataset_options(cfg.DATASET),
    )
