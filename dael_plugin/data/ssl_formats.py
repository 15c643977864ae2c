"""Dassl's semi-supervised datasets (CIFAR10, CIFAR100, SVHN, STL10), read without Dassl.

Dassl's readers (``dassl/data/datasets/ssl/``) split one dataset into labeled images (train_x),
unlabeled ones (train_u) and a test set; they name no domains. Here the run's domains name the
two parts, source ``labeled`` -> target ``unlabeled`` (filled in when a config leaves them out,
as Dassl's configs do), every item is domain 0, and the test set is the target's test split: so
Dassl's semi-supervised trainers (FixMatch, MeanTeacher, MixMatch, EntMin) and SourceOnly train
on them as on a DA dataset, on both engines.

The items are Dassl's, from the same files (``DATASETS.md``'s layouts):

- **CIFAR10, CIFAR100, SVHN**: ``<name>/{train,test}/<class>/<image>``; labels by the sorted class
  folders. Of each class's training images in the folder's listing order, the first
  ``floor(n * DATASET.VAL_PERCENT)`` are val; the rest are shuffled with Python's RNG (seeded by
  ``SEED``, one class after another, as Dassl's ``random.shuffle`` after ``set_random_seed``), and
  the first ``DATASET.NUM_LABELED / classes`` are labeled, the others unlabeled.
- **STL10**: ``stl10/{train,test,unlabeled}/<index>_<label>.<ext>`` (``none`` for no label, read as
  -1) and ``stl10/stl10_binary/fold_indices.txt``: the labeled images are fold
  ``DATASET.STL10_FOLD`` (0 to 4) of the sorted training listing.

``DATASET.ALL_AS_UNLABELED`` adds the labeled images to the unlabeled ones, as Dassl's does.
Dassl leaves the class names empty; here they are the class folders (CIFAR, SVHN) and STL-10's
ten names.

Where Dassl trains on something else than it was asked without a word, a reader raises one line:

- a class with fewer training images than its share of ``NUM_LABELED`` (Dassl labels fewer);
- a class folder missing from ``test/`` (Dassl numbers the test folders on their own);
- STL10's fold: Dassl parses ``fold_indices.txt`` as ``np.uint8``, so every index above 255 wraps
  (4999 reads as 135): fold 0 of the real file gives 1,000 labeled images drawn from the first 256.
  ``DATASET.STL10_FOLD_AS_WRITTEN True`` (the plugin's key, off by default) reads the indices as the
  file writes them, STL-10's own protocol; a fold whose indices all fit in a byte reads the same
  either way.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from dael_plugin.data.dassl_formats import _class_folders, _listdir, _need_dir, _where, dataset_folder
from dael_plugin.data.items import Item
from dael_plugin.data.registry import register_dataset
from dael_plugin.errors import DAELConfigError

SSL_SPLIT = (("labeled",), ("unlabeled",))  # the run's domains: the labeled images -> the unlabeled ones
CIFAR_KEYS = ("NUM_LABELED", "VAL_PERCENT", "ALL_AS_UNLABELED")
STL10_KEYS = ("STL10_FOLD", "STL10_FOLD_AS_WRITTEN", "ALL_AS_UNLABELED")
STL10_CLASSES = "airplane bird car cat deer dog horse monkey ship truck".split()  # STL-10's class_names.txt
UNLABELED = -1  # STL-10's "none": Dassl's label of an unlabeled image


@dataclass(frozen=True)
class SslFormat:
    """A semi-supervised dataset (data/registry.py's entry protocol)."""

    dataset_dir: str
    read: Callable[..., Dict[str, object]]  # (folder, seed, options) -> splits and class names
    layout: str
    anchor: str  # DATASETS.md's section
    options: Tuple[str, ...]
    seeded: Tuple[str, ...] = ()  # the parts drawn from SEED (CIFAR's and SVHN's labeled subsample)
    domains: Tuple[str, ...] = SSL_SPLIT[0] + SSL_SPLIT[1]
    unlabeled_target: bool = True
    official_split: Optional[Tuple[Tuple[str, ...], Tuple[str, ...]]] = SSL_SPLIT

    def load(self, name, root, sources, targets, seed=0, category_shift=False, options=None) -> Dict[str, object]:
        """The splits and class names, as Dassl's reader of ``name`` gives them."""
        if category_shift:
            raise DAELConfigError(f"{name} has one labeled domain: DATASET.CATEGORY_SHIFT has no domains to differ")
        out = self.read(dataset_folder(name, root, self), seed, dict(options or {}), self.anchor)
        if options and options.get("ALL_AS_UNLABELED"):
            out["train_u"] = out["train_u"] + out["train_x"]
        return out


def _number(options: dict, key: str, kind: type, low: float, high: Optional[float], what: str):
    value = options.get(key)
    ok = isinstance(value, kind) and not isinstance(value, bool) or (kind is float and type(value) is int)
    if not ok or value < low or (high is not None and value >= high):
        raise DAELConfigError(f"DATASET.{key} {value!r}: {what}")
    return value


def _cifar(folder: str, seed: int, options: dict, anchor: str) -> Dict[str, object]:
    """Dassl's ``CIFAR10._read_data_train`` and ``_read_data_test`` (CIFAR100 and SVHN are its subclasses)."""
    num_labeled = _number(
        options, "NUM_LABELED", int, 1, None, "the number of labeled training images, over all classes, is 1 or "
        "more (Dassl's configs: CIFAR10 4000, CIFAR100 10000, SVHN 1000)",
    )  # fmt: skip
    val_percent = _number(options, "VAL_PERCENT", float, 0.0, 1.0, "the share of each class held out as val, 0 to <1")
    train_dir, test_dir = os.path.join(folder, "train"), os.path.join(folder, "test")
    classes = _class_folders([train_dir, test_dir], anchor)  # one label space (Dassl numbers each folder's own)
    rng = random.Random(seed)  # Dassl shuffles with Python's global RNG, seeded by set_random_seed(SEED)
    per_class = num_labeled / len(classes)
    train_x: List[Item] = []
    train_u: List[Item] = []
    val: List[Item] = []
    for label, cname in enumerate(classes):
        cdir = os.path.join(train_dir, cname)
        names = _listdir(cdir)
        num_val = math.floor(len(names) * val_percent)
        train, held = names[num_val:], names[:num_val]
        if len(train) < per_class:  # Dassl would label fewer without a word
            raise DAELConfigError(
                f"{cdir} holds {len(train):,} training images (after {num_val:,} for val); DATASET.NUM_LABELED "
                f"{num_labeled:,} labels {per_class:g} of each of the {len(classes)} classes: lower it, or complete "
                f"the folder as {_where(anchor)} says"
            )
        rng.shuffle(train)  # after the val split, as Dassl's
        for i, f in enumerate(train):
            (train_x if i + 1 <= per_class else train_u).append(Item(os.path.join(cdir, f), label, 0, cname))
        val += [Item(os.path.join(cdir, f), label, 0, cname) for f in held]
    test = [
        Item(os.path.join(test_dir, cname, f), label, 0, cname)
        for label, cname in enumerate(classes)
        for f in _listdir(os.path.join(test_dir, cname))
    ]
    return {"train_x": train_x, "train_u": train_u, "val": val or None, "test": test, "classnames": list(classes)}


def _stl_items(folder: str, names: List[str], anchor: str) -> List[Item]:
    items = []
    for f in names:
        parts = os.path.splitext(f)[0].split("_")
        if len(parts) < 2 or not (parts[1].isdigit() or parts[1] == "none"):
            raise DAELConfigError(
                f"{os.path.join(folder, f)}: STL-10's images are named <index>_<label>.<ext> (<label> 'none' when "
                f"unlabeled), as {_where(anchor)} writes them; move other files out of {folder}"
            )
        label = UNLABELED if parts[1] == "none" else int(parts[1])
        items.append(Item(os.path.join(folder, f), label, 0, ""))
    return items


def _fold(folder: str, fold: int, as_written: bool, count: int, anchor: str) -> List[int]:
    """Fold ``fold`` of ``stl10_binary/fold_indices.txt``: Dassl's reading (``np.uint8``, indices
    wrap past 255) where it equals the file's, else one line, or the file's with ``as_written``."""
    path = os.path.join(folder, "stl10_binary", "fold_indices.txt")
    if not os.path.isfile(path):
        _need_dir(os.path.dirname(path), "folder", anchor)
        raise DAELConfigError(f"missing {path}: STL-10's binary release holds it, see {_where(anchor)}")
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    if fold >= len(lines) or not all(t.isdigit() for t in lines[fold].split()):
        raise DAELConfigError(f"{path}: line {fold + 1} is not a fold's indices; take the file from {_where(anchor)}")
    written = [int(t) for t in lines[fold].split()]
    if not as_written and max(written, default=0) > 255:
        past = next(i for i in written if i > 255)
        raise DAELConfigError(
            f"{path}: Dassl's STL10 reader parses fold {fold} as np.uint8, which wraps every index past 255 ({past} "
            f"reads as {past % 256}): it would train on {len({i % 256 for i in written}):,} distinct images among "
            f"the first 256 for the {len(set(written)):,} the fold lists; set DATASET.STL10_FOLD_AS_WRITTEN True "
            "to read the fold as written (STL-10's protocol)"
        )
    if max(written, default=0) >= count:
        raise DAELConfigError(f"{path}: fold {fold} names image {max(written)}, and train/ holds {count:,}")
    return written


def _stl10(folder: str, seed: int, options: dict, anchor: str) -> Dict[str, object]:
    """Dassl's ``STL10``: fold ``STL10_FOLD`` of the sorted training images, the unlabeled and test
    folders in their listing order, labels from the file names."""
    fold = _number(options, "STL10_FOLD", int, 0, 5, "STL-10's labeled folds are 0 to 4 (Dassl's config: 0)")
    dirs = {s: os.path.join(folder, s) for s in ("train", "test", "unlabeled")}
    for d in dirs.values():
        _need_dir(d, "image folder", anchor)
    train = sorted(_listdir(dirs["train"]))
    picked = _fold(folder, fold, bool(options.get("STL10_FOLD_AS_WRITTEN")), len(train), anchor)
    train_x = _stl_items(dirs["train"], [train[i] for i in picked], anchor)
    train_u = _stl_items(dirs["unlabeled"], _listdir(dirs["unlabeled"]), anchor)
    test = _stl_items(dirs["test"], _listdir(dirs["test"]), anchor)
    n = max((i.label for i in train_x), default=-1) + 1  # Dassl's number of classes: over train_x
    names = [STL10_CLASSES[k] if k < len(STL10_CLASSES) else str(k) for k in range(n)]
    named = [[i._replace(classname=names[i.label] if 0 <= i.label < n else "") for i in s] for s in (train_x, test)]
    return {"train_x": named[0], "train_u": train_u, "val": None, "test": named[1], "classnames": names}


_SSL_LAYOUT = "{train,test}/<class>/<image>"
_FORMATS = {
    "CIFAR10": SslFormat("cifar10", _cifar, _SSL_LAYOUT, "cifar10100-and-svhn", CIFAR_KEYS, SSL_SPLIT[0] + SSL_SPLIT[1]),
    "CIFAR100": SslFormat("cifar100", _cifar, _SSL_LAYOUT, "cifar10100-and-svhn", CIFAR_KEYS, SSL_SPLIT[0] + SSL_SPLIT[1]),
    "SVHN": SslFormat("svhn", _cifar, _SSL_LAYOUT, "cifar10100-and-svhn", CIFAR_KEYS, SSL_SPLIT[0] + SSL_SPLIT[1]),
    "STL10": SslFormat(
        "stl10", _stl10, "{train,test,unlabeled}/<index>_<label>.<ext> + stl10_binary/fold_indices.txt", "stl10",
        STL10_KEYS,
    ),
}  # fmt: skip
for _name, _fmt in _FORMATS.items():  # into the one registry of datasets
    register_dataset(_name, _fmt)
