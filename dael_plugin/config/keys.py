"""yacs configuration for the plugin, in Dassl's conventions.

``add_dael_config(cfg)`` is the one function that adds keys. Call it after
building the default config and before merging any YAML file, the way
detectron2 projects call ``add_<name>_config``.
"""
from __future__ import annotations

from dataclasses import dataclass

from yacs.config import CfgNode as CN

from dael_plugin.core.hparams import DAELHparams
from dael_plugin.errors import DAELConfigError

# Names of the trainer nodes this plugin reads; Dassl already defines both.
TRAINER_NODES = ("DAEL", "DAELDG")

_DEFAULTS = DAELHparams()


def _dael_node_keys(node: CN) -> None:
    # Dassl's own keys (dassl/config/defaults.py); kept if already present.
    if "WEIGHT_U" not in node:
        node.WEIGHT_U = 0.5  # lambda_u in Eq. 4 (Appendix A: 0.5)
    if "CONF_THRE" not in node:
        node.CONF_THRE = 0.95  # epsilon in Eq. 3
    if "STRONG_TRANSFORMS" not in node:
        node.STRONG_TRANSFORMS = ()  # A(.) in Sec. 3; weak a(.) is INPUT.TRANSFORMS
    # Design choices of Sec. 4.3 (defaults: the paper's choice).
    node.CR_TARGET = _DEFAULTS.cr_target  # "expert" | "label"            (Table 3c)
    node.CR_MODE = _DEFAULTS.cr_mode  # "collaborative" | "individual"    (Table 3a)
    node.CLASSIFIER = _DEFAULTS.classifier  # "experts" | "single"        (Table 3b)
    node.PSEUDO_LABEL = _DEFAULTS.pseudo_label  # "expert" | "ensemble"   (Table 3d)
    node.CR_LOSS = _DEFAULTS.cr_loss  # "mse" | "kl"                       (Eq. 2 footnote)
    node.VIEWS = _DEFAULTS.views  # "weak_strong" | "strong_weak" | "strong_strong"
    node.LOSSES = _DEFAULTS.losses  # "ce_cr_u" | "ce_cr" | "ce"          (Fig. 4)
    # Execution, not method (README "Speed" says what each changes numerically).
    # One backbone call over all chunks with per-chunk batch-norm statistics
    # (the reference's semantics); CHUNK_BN picks its implementation.
    node.FUSE_CHUNKS = True
    node.CHUNK_BN = "auto"  # "auto" | "split" | "grouped"
    node.PREC = "fp32"  # "fp32" | "bf16" | "fp16" (autocast; fp16 adds a GradScaler)
    node.CHANNELS_LAST = True  # where the backbone runs in it (else one log line)
    node.COMPILE = "none"  # "none" | "default" | "reduce-overhead" (torch.compile)
    node.FUSED_OPTIM = True  # PyTorch's fused SGD/Adam/AdamW kernels
    node.AUG_ON_DEVICE = False  # loaders decode only; views made on the device in batch
    # Extra magnitude knobs for torchvision's augmentations in STRONG_TRANSFORMS.
    node.TV_RANDAUGMENT_N = 2
    node.TV_RANDAUGMENT_M = 9


def add_dael_config(cfg: CN) -> CN:
    """Extend ``cfg.TRAINER.DAEL`` / ``cfg.TRAINER.DAELDG`` (and add the
    local-weights key of timm backbones). Safe to call more than once."""
    for name in TRAINER_NODES:
        if name not in cfg.TRAINER:
            cfg.TRAINER[name] = CN()
        _dael_node_keys(cfg.TRAINER[name])
    # A timm model's local weights file; with PRETRAINED True and no file,
    # timm's own cache is used. Lives under MODEL so baselines can use it too.
    if "WEIGHTS" not in cfg.MODEL.BACKBONE:
        cfg.MODEL.BACKBONE.WEIGHTS = ""
    # On CUDA, TF32 for fp32 matmuls and convolutions (Ampere and later): about 3 significant
    # digits in their inputs, fp32 accumulation. False keeps full fp32 (README "Speed").
    if "USE_TF32" not in cfg:
        cfg.USE_TF32 = True
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
    # ``get`` with the paper's defaults: Dassl's own tools/train.py never calls
    # add_dael_config, so a drop-in must run on Dassl's three keys alone.
    d = _DEFAULTS
    try:
        return DAELHparams(
            weight_u=float(node.get("WEIGHT_U", d.weight_u)),
            conf_thre=float(node.get("CONF_THRE", d.conf_thre)),
            cr_target=str(node.get("CR_TARGET", d.cr_target)),
            cr_mode=str(node.get("CR_MODE", d.cr_mode)),
            classifier=str(node.get("CLASSIFIER", d.classifier)),
            pseudo_label=str(node.get("PSEUDO_LABEL", d.pseudo_label)),
            cr_loss=str(node.get("CR_LOSS", d.cr_loss)),
            views=str(node.get("VIEWS", d.views)),
            losses=str(node.get("LOSSES", d.losses)),
        )
    except ValueError as exc:
        raise DAELConfigError(f"{prefix}{exc}") from None


@dataclass(frozen=True)
class Execution:
    """How the step runs (``TRAINER.<NAME>.*`` execution keys), read with their defaults."""

    fuse_chunks: bool = True
    chunk_bn: str = "auto"
    prec: str = "fp32"
    channels_last: bool = True
    compile: str = "none"
    fused_optim: bool = True
    aug_on_device: bool = False


def execution_from_cfg(cfg: CN) -> Execution:
    from dael_plugin.core.chunk_norm import IMPLS
    from dael_plugin.engine.execution import check_execution

    node = trainer_node(cfg)
    d = Execution()
    e = Execution(
        fuse_chunks=bool(node.get("FUSE_CHUNKS", d.fuse_chunks)),
        chunk_bn=str(node.get("CHUNK_BN", d.chunk_bn)),
        prec=str(node.get("PREC", d.prec)).lower(),
        channels_last=bool(node.get("CHANNELS_LAST", d.channels_last)),
        compile=str(node.get("COMPILE", d.compile)).lower(),
        fused_optim=bool(node.get("FUSED_OPTIM", d.fused_optim)),
        aug_on_device=bool(node.get("AUG_ON_DEVICE", d.aug_on_device)),
    )
    prefix = f"TRAINER.{str(cfg.TRAINER.NAME).upper()}"
    check_execution(e.prec, e.compile, prefix, e.fuse_chunks)
    if e.chunk_bn not in IMPLS:
        raise DAELConfigError(f"{prefix}.CHUNK_BN={e.chunk_bn!r} is invalid; use one of {list(IMPLS)}")
    return e


def uses_target_data(cfg: CN) -> bool:
    """The DA/DG mode is explicit: ``DAELDG`` never uses target data (Dassl's
    DAELDG is a ``TrainerX``); ``DAEL`` uses it when the dataset has it."""
    return str(cfg.TRAINER.NAME).upper() != "DAELDG"


def check_run_values(cfg: CN) -> None:
    """Values every trainer needs to be sane, checked before any data is read."""
    checks = [
        ("OPTIM.MAX_EPOCH", cfg.OPTIM.MAX_EPOCH, 1, "the number of training epochs"),
        ("DATALOADER.TRAIN_X.BATCH_SIZE", cfg.DATALOADER.TRAIN_X.BATCH_SIZE, 1, "the source batch size"),
        ("DATALOADER.TRAIN_U.BATCH_SIZE", cfg.DATALOADER.TRAIN_U.BATCH_SIZE, 1, "the target batch size"),
        ("DATALOADER.TEST.BATCH_SIZE", cfg.DATALOADER.TEST.BATCH_SIZE, 1, "the test batch size"),
        ("DATALOADER.NUM_WORKERS", cfg.DATALOADER.NUM_WORKERS, 0, "the number of loader processes"),
        ("TRAIN.PRINT_FREQ", cfg.TRAIN.PRINT_FREQ, 1, "the logging interval in batches"),
    ]
    for key, value, low, what in checks:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise DAELConfigError(f"{key}={value!r} is invalid: {what} must be an integer >= {low}")
    if not float(cfg.OPTIM.LR) > 0:
        raise DAELConfigError(f"OPTIM.LR={cfg.OPTIM.LR!r} is invalid: the learning rate must be > 0")


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
        raise DAELConfigError(
            f"DAEL needs at least 2 source domains (one expert each), got {sources}; "
            "pass more with --source-domains A B [C ...]"
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
    sampler = cfg.DATALOADER.TRAIN_X.SAMPLER
    if sampler not in ("RandomDomainSampler", "SeqDomainSampler"):
        raise DAELConfigError(
            f"DATALOADER.TRAIN_X.SAMPLER={sampler!r} is not domain-balanced; DAEL needs "
            "equal per-domain chunks: set DATALOADER.TRAIN_X.SAMPLER RandomDomainSampler"
        )
    n_domain = cfg.DATALOADER.TRAIN_X.N_DOMAIN
    if n_domain <= 0:
        n_domain = len(sources)
    if n_domain > len(sources):
        raise DAELConfigError(
            f"DATALOADER.TRAIN_X.N_DOMAIN={n_domain} exceeds the {len(sources)} source domains"
        )
    batch = cfg.DATALOADER.TRAIN_X.BATCH_SIZE
    if batch % n_domain != 0:
        raise DAELConfigError(
            f"DATALOADER.TRAIN_X.BATCH_SIZE={batch} is not divisible by the {n_domain} "
            f"domains per batch; use a multiple of {n_domain}, e.g. {n_domain * max(1, batch // n_domain)}"
        )
