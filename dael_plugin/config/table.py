"""The one table of the keys the plugin reads under ``TRAINER.DAEL`` / ``TRAINER.DAELDG``.

Each key is written here once, with its default, its choices, its kind and the value a
checkpoint written before the key existed ran with. ``add_dael_config``, the core's
``DAELHparams``, the ``Execution`` options and the resume comparison of old checkpoints
are all read from it:

- ``method``: the paper's hyper-parameters and the design switches of Sec. 4.3 (they
  become ``DAELHparams``; the defaults are the core's, the paper's choices);
- ``execution``: how the step runs (README, "Speed"); none changes the method. They live in
  the top-level ``EXECUTION`` node, for every trainer (``engine/strategy.py``);
  ``TRAINER.DAEL.*`` / ``TRAINER.DAELDG.*`` keep their older spellings of the same keys;
- ``views``: the views' magnitudes.

``dassl`` marks the three keys Dassl itself defines (``dassl/config/defaults.py``): they
keep Dassl's value when the node already holds one.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Dict, Tuple

from dael_plugin.core.chunk_norm import IMPLS
from dael_plugin.core.hparams import CHOICES, CLASS_MASK_PARTS, DAELHparams
from dael_plugin.transforms.registry import TV_RANDAUGMENT_M, TV_RANDAUGMENT_N

_PAPER = DAELHparams()
# Names of the trainer nodes this plugin reads; Dassl already defines both.
TRAINER_NODES = ("DAEL", "DAELDG")
IN_EVERY_CHECKPOINT = object()  # a key every checkpoint has had


@dataclass(frozen=True)
class Key:
    name: str
    default: object
    kind: str  # "method" | "execution" | "views" | "selection"
    choices: Tuple = ()
    legacy: object = IN_EVERY_CHECKPOINT  # what a checkpoint written before the key existed ran with
    dassl: bool = False
    doc: str = ""
    # An execution key whose EXECUTION value is None by default: each trainer's own choice
    # (``execution_defaults``: on for DAEL, off for Dassl's baselines, which run as Dassl's do).
    # ``default`` is DAEL's, the value of its TRAINER.DAEL spelling.
    own: bool = False

    def read(self, node) -> object:
        """This key's value in ``node``, cast to its default's type; absent, its default (Dassl's
        own tools/train.py never calls add_dael_config: a drop-in runs on Dassl's three keys)."""
        value = node.get(self.name, self.default)
        if isinstance(self.default, bool):
            return bool(value)
        if isinstance(self.default, float):
            return float(value)
        if isinstance(self.default, int):
            return int(value)
        if isinstance(self.default, tuple):
            return tuple(value) if isinstance(value, (list, tuple)) else (value,)
        return str(value).lower() if self.kind == "execution" else str(value)

    @property
    def field(self) -> str:
        """The attribute of ``DAELHparams`` / ``Execution`` this key fills."""
        return self.name.lower()


def _method(name: str, doc: str, dassl: bool = False) -> Key:
    field = name.lower()
    return Key(name, getattr(_PAPER, field), "method", CHOICES.get(field, ()), dassl=dassl, doc=doc)


KEYS: Tuple[Key, ...] = (
    _method("WEIGHT_U", "lambda_u in Eq. 4 (Appendix A: 0.5)", dassl=True),
    _method("CONF_THRE", "epsilon in Eq. 3: pseudo-labels kept at this probability or above", dassl=True),
    Key("STRONG_TRANSFORMS", (), "views", dassl=True, doc="A(.) in Sec. 3; the weak a(.) is INPUT.TRANSFORMS"),
    _method("CR_TARGET", "target of L_cr: the expert's weak-view prediction or the label (Table 3c)"),
    _method("CR_MODE", "L_cr against the other experts' mean or each alone (Table 3a)"),
    _method("CLASSIFIER", "K domain experts or one shared classifier (Table 3b)"),
    _method(
        "PSEUDO_LABEL",
        "pseudo-label from the most confident expert or the ensemble (Table 3d); category shift: 'agree' (every "
        "expert that knows the class is confident of it), 'corroborate' (and, with CLASS_MASKS 'other', every expert "
        "that lacks it says 'not mine')",
    ),
    _method("CR_LOSS", "squared error or KL divergence (footnote to Eq. 2)"),
    _method("VIEWS", "(target view, prediction view) of L_cr and L_u (Sec. 4.3, augmentation)"),
    Key(
        "CLASS_MASKS",
        (),
        "method",
        ("all",) + CLASS_MASK_PARTS,
        legacy=(),
        doc="category shift (DATASET.CATEGORY_SHIFT), the parts of core/category_shift.py that are on: 'experts' "
        "(each expert over its domain's classes), 'ensemble' (per-class mean of the experts that know the class), "
        "'cr' (L_cr on shared classes), 'pseudo_label' (each expert's pseudo-label among its classes), 'other' (each "
        "expert learns 'not mine' on the classes it lacks; instead of 'experts'); ['all']: the first four; "
        "(): the paper's DAEL on the union",
    ),
    Key(
        "WEIGHT_OTHER",
        _PAPER.weight_other,
        "method",
        legacy=1.0,
        doc="category shift: the weight of CLASS_MASKS part 'other''s loss (L_ce's is 1); 1.0 unless 'other' is on",
    ),
    Key(
        "U_BALANCE",
        _PAPER.u_balance,
        "method",
        legacy=False,
        doc="L_u with each kept pseudo-class weighted alike (the mean of per-class means, times the share kept); "
        "False: Eq. 3",
    ),
    _method("LOSSES", "which terms of Eq. 4 are on (Fig. 4)"),
    Key(
        "FUSE_CHUNKS",
        True,
        "execution",  # in every checkpoint this comparison reads
        doc="one backbone call over every chunk, each normalised with its own batch-norm statistics",
    ),
    Key("CHUNK_BN", "auto", "execution", tuple(IMPLS), legacy="auto", doc="the per-chunk batch norm's form"),
    Key(
        "PREC",
        "fp32",
        "execution",
        ("fp32", "bf16", "fp16"),
        legacy="fp32",
        doc="autocast precision; fp16 adds a GradScaler",
    ),
    Key(
        "CHANNELS_LAST", True, "execution", legacy=False, own=True, doc="the backbone in channels_last where it runs so"
    ),
    Key(
        "COMPILE",
        "none",
        "execution",
        ("none", "default", "reduce-overhead"),
        legacy="none",
        doc="torch.compile of the forward and losses as one graph",
    ),
    Key("FUSED_OPTIM", True, "execution", legacy=False, own=True, doc="PyTorch's fused SGD/Adam/AdamW kernels"),
    Key(
        "AUG_ON_DEVICE",
        False,
        "execution",
        legacy=False,
        doc="loaders decode only; the views are made on the training device in batch",
    ),
    Key(
        "TV_RANDAUGMENT_N",
        TV_RANDAUGMENT_N,
        "views",
        doc="torchvision RandAugment's number of operations (tv_randaugment)",
    ),
    Key("TV_RANDAUGMENT_M", TV_RANDAUGMENT_M, "views", doc="torchvision RandAugment's magnitude (tv_randaugment)"),
)
BY_NAME: Dict[str, Key] = {k.name: k for k in KEYS}
METHOD_KEYS = tuple(k for k in KEYS if k.kind == "method")
EXECUTION_KEYS = tuple(k for k in KEYS if k.kind == "execution")
DEFAULTS: Dict[str, object] = {k.name: k.default for k in KEYS}
# The EXECUTION node's defaults: the execution keys', None where each trainer has its own (``own``).
EXECUTION_DEFAULTS: Dict[str, object] = {k.name: None if k.own else k.default for k in EXECUTION_KEYS}
# The execution keys only DAEL's step reads (its per-domain chunks, its views on the device): a
# trainer without that step refuses a value other than the default in one line.
DAEL_STEP_KEYS = ("FUSE_CHUNKS", "CHUNK_BN", "AUG_ON_DEVICE")

# Top-level keys the plugin adds (not under a trainer node).
TOP_KEYS: Tuple[Key, ...] = (
    Key(
        "USE_TF32",
        True,
        "execution",
        legacy=True,
        doc="on CUDA, TF32 for fp32 matmuls and convolutions (before the key: torch's own CUDA defaults)",
    ),
)

# Keys the plugin adds to the DATASET node.
DATASET_KEYS: Tuple[Key, ...] = (
    Key(
        "CATEGORY_SHIFT",
        False,
        "data",
        legacy=False,
        doc="read domains that hold different classes: the label space is the union, each source's own "
        "classes are recorded (TRAINER.DAEL.CLASS_MASKS uses them); False: such data is refused; every format, "
        "on the Dassl engine through the plugin's readers",
    ),
    Key(
        "STL10_FOLD_AS_WRITTEN",
        False,
        "data",
        legacy=False,
        doc="STL10: read fold_indices.txt's indices as written (STL-10's protocol); False: Dassl's reading, which "
        "parses them as uint8 and wraps those past 255, refused where it differs (data/ssl_formats.py)",
    ),
)

# The SELECTION node (per-epoch records for model selection, engine/selection.py), for every trainer.
SELECTION_KEYS: Tuple[Key, ...] = (
    Key(
        "EVAL_FREQ",
        -1,
        "selection",
        legacy=0,
        doc="write OUTPUT_DIR/epochs.jsonl every N epochs (and at the last); 0: no records, no held-out source split; "
        "-1 (auto): every epoch on a set of at most 30,000 source training images, else none",
    ),
    Key(
        "HOLDOUT_FRACTION",
        -1.0,
        "selection",
        legacy=0.2,
        doc="with records, the share of each source domain's train split held out for validation (DomainBed's "
        "holdout_fraction) where the dataset has no val split of its sources; never trained on; -1 (auto): 0.2 "
        "when EVAL_FREQ is set to 1 or more, 0 (the paper's training set) under EVAL_FREQ auto",
    ),
    Key("TARGET_CAP", 1000, "selection", legacy=1000, doc="target train images the validators and the oracle read"),
    Key(
        "VALIDATORS",
        ("entropy", "im", "bnm", "snd", "classami", "dev", "devn", "agreement", "mask_rate"),
        "selection",
        legacy=("entropy", "im", "bnm", "snd", "classami", "dev", "devn", "agreement", "mask_rate"),
        doc="the unsupervised validators each DA record holds (core/validators.py)",
    ),
    Key(
        "KEEP_BEST",
        ("all",),
        "selection",
        legacy=("all",),
        doc="protocols whose current choice is kept as model-best-<protocol>.pth.tar ('all', or names; () for none)",
    ),
)

assert {k.field for k in METHOD_KEYS} == {f.name for f in fields(DAELHparams)}, "a method key without a field"
