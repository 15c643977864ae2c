"""yacs configuration for the plugin, in Dassl's conventions.

``add_dael_config(cfg)`` is the one function that adds keys. Call it after
building the default config and before merging any YAML file, the way
detectron2 projects call ``add_<name>_config``.
"""

from __future__ import annotations

import os
from typing import List, Optional

from yacs.config import CfgNode as CN

from dael_plugin.config.execution import execution_from_cfg
from dael_plugin.config.ranges import check_baseline_values
from dael_plugin.config.table import (
    DATASET_KEYS,
    EXECUTION_DEFAULTS,
    KEYS,
    METHOD_KEYS,
    SELECTION_KEYS,
    TOP_KEYS,
    TRAINER_NODES,
)
from dael_plugin.core.hparams import DAELHparams
from dael_plugin.errors import DAELConfigError

# DATALOADER.TRAIN_X.SAMPLER's names, one meaning each on both engines (data/sampling.py):
# Dassl's two domain samplers, the plugin's own CyclingDomainSampler, and Dassl's RandomSampler.
DASSL_DOMAIN_SAMPLERS = ("RandomDomainSampler", "SeqDomainSampler")
DOMAIN_SAMPLERS = DASSL_DOMAIN_SAMPLERS + ("CyclingDomainSampler",)
SOURCE_SAMPLERS = ("RandomSampler",) + DOMAIN_SAMPLERS


# The TRAINER.<NAME> node of each method registered with keys of its own (``methods.register``'s
# ``config``: a method from outside the package declares its keys and defaults in its own file);
# add_dael_config puts them into every config either engine builds, before any file is merged.
METHOD_NODES: dict = {}


def add_method_node(name: str, defaults) -> None:
    """Declare ``TRAINER.<NAME>`` with these keys and defaults (a dict or a ``CfgNode``)."""
    key = str(name).upper()
    if key in TRAINER_NODES:
        raise DAELConfigError(f"TRAINER.{key} is DAEL's node; give the method another name")
    try:
        node = defaults.clone() if isinstance(defaults, CN) else CN(dict(defaults))
    except (TypeError, ValueError, AssertionError, AttributeError) as exc:
        raise DAELConfigError(
            f"TRAINER.{key}'s defaults {defaults!r} are not a config node: give a dict of yacs values "
            f"(str, int, float, bool, list, tuple) ({type(exc).__name__}: {exc})"
        ) from None
    METHOD_NODES[key] = node


def _dael_node_keys(node: CN) -> None:
    for key in KEYS:  # every key and default from the one table (config/table.py)
        if key.dassl and key.name in node:
            continue  # Dassl's own keys keep Dassl's value
        node[key.name] = key.default


def full_keys(node: CN, prefix: str = "") -> List[str]:
    """Every key of ``node`` by its full dotted name (``OPTIM.LR``)."""
    keys = []
    for k, v in node.items():
        keys += full_keys(v, f"{prefix}{k}.") if isinstance(v, CN) else [prefix + k]
    return keys


def key_value(cfg: CN, key: str):
    """The value of the dotted ``key`` in ``cfg``."""
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def add_dael_config(cfg: CN) -> CN:
    """Extend ``cfg.TRAINER.DAEL`` / ``cfg.TRAINER.DAELDG`` with the keys of ``config/table.py``
    (and add the local-weights key of timm backbones). Safe to call more than once."""
    for name in TRAINER_NODES:
        if name not in cfg.TRAINER:
            cfg.TRAINER[name] = CN()
        _dael_node_keys(cfg.TRAINER[name])
    # A timm model's local weights file; with PRETRAINED True and no file,
    # timm's own cache is used. Lives under MODEL so baselines can use it too.
    if "WEIGHTS" not in cfg.MODEL.BACKBONE:
        cfg.MODEL.BACKBONE.WEIGHTS = ""
    for name, node in METHOD_NODES.items():
        if name not in cfg.TRAINER:
            cfg.TRAINER[name] = node.clone()
    for key in TOP_KEYS:
        if key.name not in cfg:
            cfg[key.name] = key.default
    for key in DATASET_KEYS:
        if key.name not in cfg.DATASET:
            cfg.DATASET[key.name] = key.default
    if "EXECUTION" not in cfg:
        cfg.EXECUTION = CN()
    for name, default in EXECUTION_DEFAULTS.items():
        if name not in cfg.EXECUTION:
            cfg.EXECUTION[name] = default
    if "SELECTION" not in cfg:
        cfg.SELECTION = CN()
    for key in SELECTION_KEYS:
        if key.name not in cfg.SELECTION:
            cfg.SELECTION[key.name] = key.default
    return cfg


def trainer_node(cfg: CN) -> CN:
    """The ``TRAINER.<NAME>`` node of the trainer being run (DAEL or DAELDG)."""
    name = str(cfg.TRAINER.NAME).upper()
    if name not in TRAINER_NODES or name not in cfg.TRAINER:
        raise DAELConfigError(
            f"TRAINER.NAME={cfg.TRAINER.NAME!r} has no TRAINER.{name} node; "
            "use --trainer DAEL (domain adaptation) or --trainer DAELDG (generalisation)"
        )
    return cfg.TRAINER[name]


def hparams_from_cfg(cfg: CN) -> DAELHparams:
    """Translate the yacs node into the core's plain hyper-parameters."""
    node = trainer_node(cfg)
    prefix = f"TRAINER.{str(cfg.TRAINER.NAME).upper()}."
    try:
        return DAELHparams(**{key.field: key.read(node) for key in METHOD_KEYS})
    except ValueError as exc:
        raise DAELConfigError(f"{prefix}{exc}") from None


def check_run_values(cfg: CN) -> None:
    """Values every trainer needs to be sane, checked before any data is read."""
    # Upper limits far beyond any real run: past them a value is a typo, and would overflow a C int,
    # fill memory building a batch, or make NumPy refuse the seed, with a traceback.
    checks = [
        ("OPTIM.MAX_EPOCH", cfg.OPTIM.MAX_EPOCH, 1, 10**6, "the number of training epochs"),
        ("DATALOADER.TRAIN_X.BATCH_SIZE", cfg.DATALOADER.TRAIN_X.BATCH_SIZE, 1, 2**16, "the source batch size"),
        ("DATALOADER.TRAIN_U.BATCH_SIZE", cfg.DATALOADER.TRAIN_U.BATCH_SIZE, 1, 2**16, "the target batch size"),
        ("DATALOADER.TEST.BATCH_SIZE", cfg.DATALOADER.TEST.BATCH_SIZE, 1, 2**16, "the test batch size"),
        ("DATALOADER.NUM_WORKERS", cfg.DATALOADER.NUM_WORKERS, 0, 1024, "the number of loader processes"),
        ("TRAIN.PRINT_FREQ", cfg.TRAIN.PRINT_FREQ, 1, 2**31 - 1, "the logging interval in batches"),
        ("SEED", cfg.SEED, -1, 2**32 - 1, "the seed (-1: a random one)"),
        # a negative one crops, and random_crop's first image stops in a traceback
        ("INPUT.CROP_PADDING", cfg.INPUT.CROP_PADDING, 0, 2**15, "random_crop's padding in pixels"),
    ]
    for key, value, low, high, what in checks:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise DAELConfigError(f"{key}={value!r} is invalid: {what} must be an integer from {low} to {high}")
    if not float(cfg.OPTIM.LR) > 0:
        raise DAELConfigError(f"OPTIM.LR={cfg.OPTIM.LR!r} is invalid: the learning rate must be > 0")
    from dael_plugin.transforms.registry import INTERPOLATION  # Dassl's INTERPOLATION_MODES, name for name

    # Dassl raises a KeyError for another interpolation, and evaluates on test for another split.
    for key, value, allowed in (
        ("INPUT.INTERPOLATION", cfg.INPUT.INTERPOLATION, tuple(INTERPOLATION)),
        ("TEST.SPLIT", cfg.TEST.SPLIT, ("val", "test")),
    ):
        if value not in allowed:
            raise DAELConfigError(f"{key}={value!r} is invalid; use one of {list(allowed)}")
    check_baseline_values(cfg)
    check_input_size(cfg)
    check_selection(cfg)


def proc_bytes(path: str, field: str) -> Optional[int]:
    """A ``Field:  N kB`` line of a Linux /proc file (``/proc/meminfo``, ``/proc/self/status``), in bytes."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_memory() -> Optional[int]:
    """Bytes of host memory a new allocation may take: Linux's ``MemAvailable``, else the total."""
    avail = proc_bytes("/proc/meminfo", "MemAvailable")
    if avail is not None:
        return avail
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_input_size(cfg: CN, available: Optional[int] = None) -> None:
    """``INPUT.SIZE`` is two integers, and one float32 view of one source batch fits in the host's
    memory. Past that, a loader fills memory image by image until the kernel kills the run without
    a word (``INPUT.SIZE (8192, 8192)`` at batch 96: 77 GB, killed after three minutes here);
    smaller excesses reach torch's allocator, whose error is one line with exit code 4."""
    size = cfg.INPUT.SIZE
    if (
        not isinstance(size, (tuple, list))
        or len(size) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 2**15 for v in size)
    ):
        raise DAELConfigError(f"INPUT.SIZE={size!r} is invalid: (height, width), two integers from 1 to 32768")
    batch = cfg.DATALOADER.TRAIN_X.BATCH_SIZE
    need = batch * 3 * size[0] * size[1] * 4
    available = available_memory() if available is None else available
    if available is not None and need > available:
        raise DAELConfigError(
            f"INPUT.SIZE ({size[0]}, {size[1]}) with DATALOADER.TRAIN_X.BATCH_SIZE={batch} needs at least "
            f"{need / 2**30:.1f} GiB of host memory for one view of one source batch (float32), and this machine "
            f"has {available / 2**30:.1f} GiB available; lower INPUT.SIZE or the batch sizes"
        )
    loaders = loader_bytes(cfg)
    if available is not None and loaders + need > available:
        raise DAELConfigError(
            f"INPUT.SIZE ({size[0]}, {size[1]}) with DATALOADER.NUM_WORKERS={cfg.DATALOADER.NUM_WORKERS}: the "
            f"loader processes hold {loaders / 2**30:.1f} GiB of batches (3 steps each, every view of the source "
            f"and target images) and this machine has {available / 2**30:.1f} GiB available; lower "
            "INPUT.SIZE, the batch sizes or DATALOADER.NUM_WORKERS"
        )


def loader_bytes(cfg: CN) -> int:
    """Bytes of float32 batches the loader processes hold: each keeps 2 steps ready in shared
    memory (PyTorch's ``prefetch_factor``) and builds a third in its own (the samples before they
    are stacked: 2.2 GB resident in a loader at ``INPUT.SIZE (1024, 1024)`` here). A step holds
    every view of the source batch and, for a trainer that reads target data, of the target batch
    (2 views for DAEL and DAELDG)."""
    d = cfg.DATALOADER
    workers = int(d.NUM_WORKERS)
    if workers <= 0:
        return 0
    name = str(cfg.TRAINER.NAME).upper()
    views = 2 if name in ("DAEL", "DAELDG") else 1
    target = name not in ("DAELDG", "SOURCEONLY") and bool(cfg.DATASET.TARGET_DOMAINS)
    u = (d.TRAIN_X.BATCH_SIZE if d.TRAIN_U.SAME_AS_X else d.TRAIN_U.BATCH_SIZE) if target else 0
    size = cfg.INPUT.SIZE
    return workers * 3 * views * (d.TRAIN_X.BATCH_SIZE + u) * 3 * size[0] * size[1] * 4


def check_selection(cfg: CN) -> None:
    """The SELECTION node's values (absent keys read as their defaults: Dassl's own tools/train.py)."""
    sel = cfg.get("SELECTION", CN())
    freq = sel.get("EVAL_FREQ", 0)
    if not isinstance(freq, int) or isinstance(freq, bool) or not -1 <= freq <= 10**6:
        raise DAELConfigError(
            f"SELECTION.EVAL_FREQ={freq!r} is invalid: epochs between records, 0 (none) to 1000000, or -1 (auto)"
        )
    frac = sel.get("HOLDOUT_FRACTION", 0.2)
    if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not (frac == -1 or 0.0 <= float(frac) < 1.0):
        raise DAELConfigError(
            f"SELECTION.HOLDOUT_FRACTION={frac!r} is invalid: a share from 0 to below 1 (0.2: DomainBed's), or -1 (auto)"
        )
    cap = sel.get("TARGET_CAP", 1000)
    if not isinstance(cap, int) or isinstance(cap, bool) or not 0 <= cap <= 10**7:
        raise DAELConfigError(f"SELECTION.TARGET_CAP={cap!r} is invalid: target images to read, 0 (all) to 10000000")
    from dael_plugin.core.validators import NAMES, SCORED_PROTOCOLS

    unknown = [v for v in sel.get("VALIDATORS", ()) if str(v).lower() not in NAMES]
    if unknown:
        raise DAELConfigError(f"SELECTION.VALIDATORS: unknown validator(s) {unknown}; choose from {', '.join(NAMES)}")
    keep = [str(v).lower() for v in sel.get("KEEP_BEST", ("all",))]
    unknown = [v for v in keep if v not in ("all",) + SCORED_PROTOCOLS]
    if unknown:
        raise DAELConfigError(
            f"SELECTION.KEEP_BEST: unknown protocol(s) {unknown}; choose from all, {', '.join(SCORED_PROTOCOLS)}"
        )
    computed = [str(v).lower() for v in sel.get("VALIDATORS", NAMES)]
    uncomputed = [v for v in keep if v in NAMES and v not in computed]
    if uncomputed:  # it would keep nothing, without a word
        raise DAELConfigError(
            f"SELECTION.KEEP_BEST keeps the choice of {uncomputed}, which SELECTION.VALIDATORS {computed} does not "
            "compute: add it to SELECTION.VALIDATORS, or drop it from KEEP_BEST"
        )


def check_other_node(cfg: CN, default: CN) -> None:
    """A key of ``TRAINER.DAEL`` set for a DAELDG run (or the other way round) is read by no one:
    one line naming the key this trainer reads instead. ``default``: the engine's config before any
    file or option."""
    name = str(cfg.TRAINER.NAME).upper()
    if name not in TRAINER_NODES:
        return
    other = "DAELDG" if name == "DAEL" else "DAEL"
    mine, fresh = cfg.TRAINER.get(other, CN()), default.TRAINER.get(other, CN())
    changed = [k for k in mine if k not in fresh or mine[k] != fresh[k]]
    if changed:
        key = changed[0]
        raise DAELConfigError(
            f"TRAINER.{other}.{key} is set, but --trainer {cfg.TRAINER.NAME} reads TRAINER.{name}: "
            f"set TRAINER.{name}.{key} instead (TRAINER.{other} is read by --trainer {other} alone)"
        )


def check_dael_cfg(cfg: CN) -> None:
    """Checks shared by both engines; each raises a one-line ``DAELConfigError``."""
    node = trainer_node(cfg)
    prefix = f"TRAINER.{str(cfg.TRAINER.NAME).upper()}"
    hparams_from_cfg(cfg)
    if execution_from_cfg(cfg).aug_on_device:
        from dael_plugin.transforms.device import check_device_names

        check_device_names(cfg.INPUT.TRANSFORMS, "INPUT.TRANSFORMS")
        check_device_names(node.get("STRONG_TRANSFORMS", ()), f"{prefix}.STRONG_TRANSFORMS")
    sources = list(cfg.DATASET.SOURCE_DOMAINS)
    targets = list(cfg.DATASET.TARGET_DOMAINS)
    if len(sources) < 2:
        wilds = " (WILDS's one source: name its train split's metadata domains, data/wilds_formats.py)"
        raise DAELConfigError(
            f"DAEL needs at least 2 source domains (one expert each), got {sources}; "
            f"pass more with --source-domains A B [C ...]{wilds if sources == ['train'] else ''}"
        )
    if len(set(sources)) != len(sources):
        raise DAELConfigError(f"--source-domains lists a domain twice: {sources}")
    both = sorted(set(sources) & set(targets))
    if both:
        raise DAELConfigError(
            f"target domain(s) {both} also listed among the source domains {sources}; "
            "a domain must be either source or target"
        )
    if len(node.get("STRONG_TRANSFORMS", ())) == 0:
        raise DAELConfigError(
            f"{prefix}.STRONG_TRANSFORMS is empty; DAEL needs a strong view, e.g. "
            f"{prefix}.STRONG_TRANSFORMS \"['randaugment2', 'normalize']\""
        )
    if cfg.DATALOADER.TRAIN_U.SAMPLER != "RandomSampler":
        raise DAELConfigError(
            f"DATALOADER.TRAIN_U.SAMPLER={cfg.DATALOADER.TRAIN_U.SAMPLER!r}: DAEL draws its target batches "
            "shuffled (RandomSampler) on either engine; set it to RandomSampler"
        )
    sampler = cfg.DATALOADER.TRAIN_X.SAMPLER
    if sampler not in DOMAIN_SAMPLERS:
        raise DAELConfigError(
            f"DATALOADER.TRAIN_X.SAMPLER={sampler!r} is not domain-balanced; DAEL needs equal per-domain "
            f"chunks: set DATALOADER.TRAIN_X.SAMPLER to one of {list(DOMAIN_SAMPLERS)} (RandomDomainSampler: Dassl's)"
        )
    n_domain = cfg.DATALOADER.TRAIN_X.N_DOMAIN
    if n_domain <= 0:
        n_domain = len(sources)
    if n_domain > len(sources):
        raise DAELConfigError(f"DATALOADER.TRAIN_X.N_DOMAIN={n_domain} exceeds the {len(sources)} source domains")
    batch = cfg.DATALOADER.TRAIN_X.BATCH_SIZE
    if batch % n_domain != 0:
        raise DAELConfigError(
            f"DATALOADER.TRAIN_X.BATCH_SIZE={batch} is not divisible by the {n_domain} "
            f"domains per batch; use a multiple of {n_domain}, e.g. {n_domain * max(1, batch // n_domain)}"
        )
