"""Dassl's folder layouts, read without Dassl.

Every dataset here is ``<root>/<dataset_dir>/<domain>/<split>/<class>/<image>``
(Dassl's DigitsDG and OfficeHomeDG layout; the embedded set; or a user's own
data with ``dataset_dir`` empty). A ``DatasetSpec`` says which splits make
train_x, train_u, val and test.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from dael_plugin.data import (
    dassl_formats,  # noqa: F401 (registers Dassl's formats)
    embedded,
    ssl_formats,  # noqa: F401 (registers Dassl's semi-supervised datasets)
    wilds_formats,  # (registers Dassl's WILDS datasets)
)
from dael_plugin.data.items import Item
from dael_plugin.data.registry import DATASETS, register_dataset
from dael_plugin.errors import DAELConfigError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


@dataclass(frozen=True)
class DatasetSpec:
    dataset_dir: str
    domains: Optional[Tuple[str, ...]]  # None: discovered from the folders
    train: Tuple[str, ...] = ("train",)
    val: Tuple[str, ...] = ()  # of the source domains; () for none
    test: Tuple[str, ...] = ("test",)  # of the target domains
    unlabeled_target: bool = True  # DA: target's train split is train_u
    prepare: Optional[Callable[[str], str]] = None  # e.g. generate the embedded set
    seeded: Tuple[str, ...] = ()  # no domain is a subsample drawn from the seed
    options: Tuple[str, ...] = ()  # no DATASET key beyond the domains
    official_split = None  # the run names its domains (a WILDS dataset names its split's parts)

    def load(self, name, root, sources, targets, seed=0, category_shift=False, options=None) -> Dict[str, object]:
        """The splits and class names (data/registry.py's entry protocol)."""
        return _load_folders(self, name, root, sources, targets, category_shift)


_FOLDER_SETS: Dict[str, DatasetSpec] = {
    "EmbeddedDigits": DatasetSpec(embedded.DATASET_DIR, embedded.DOMAINS, prepare=embedded.ensure_embedded),
    "EmbeddedDigitsDG": DatasetSpec(
        embedded.DATASET_DIR,
        embedded.DOMAINS,
        val=("test",),
        unlabeled_target=False,
        prepare=embedded.ensure_embedded,
    ),
    "DigitsDG": DatasetSpec(
        "digits_dg", ("mnist", "mnist_m", "svhn", "syn"), val=("val",), test=("train", "val"), unlabeled_target=False
    ),
    "OfficeHomeDG": DatasetSpec(
        "office_home_dg",
        ("art", "clipart", "product", "real_world"),
        val=("val",),
        test=("train", "val"),
        unlabeled_target=False,
    ),
    "DomainFolders": DatasetSpec("", None, val=("val",)),
    "DomainFoldersDG": DatasetSpec("", None, val=("val",), unlabeled_target=False),
}
for _name, _spec in _FOLDER_SETS.items():  # into the one registry of datasets, beside Dassl's formats
    register_dataset(_name, _spec)


def _listdirs(path: str) -> List[str]:
    return sorted(d for d in os.listdir(path) if not d.startswith(".") and os.path.isdir(os.path.join(path, d)))


def dataset_dir(name: str, root: str) -> str:
    spec = DATASETS[name]
    root = os.path.abspath(os.path.expanduser(root or "."))
    if spec.prepare is not None:
        spec.prepare(root)
    path = os.path.join(root, spec.dataset_dir)
    if not os.path.isdir(path):
        raise DAELConfigError(
            f"dataset folder {path} not found; set --root to the folder that contains "
            f"{spec.dataset_dir or '<domain>/<split>/<class>/'} (no downloads here)"
        )
    return path


def known_dataset(name: str) -> Tuple[Optional[Tuple[str, ...]], bool]:
    """``(domains or None, unlabeled_target)`` of a dataset the built-in engine reads; KeyError if none."""
    return DATASETS[name].domains, DATASETS[name].unlabeled_target


def builtin_datasets() -> List[str]:
    return sorted(DATASETS)


def available_domains(name: str, root: str) -> Tuple[str, ...]:
    spec = DATASETS[name]
    if spec.domains is not None:
        return spec.domains
    return tuple(_listdirs(dataset_dir(name, root)))


def check_domains(name: str, root: str, sources: Sequence[str], targets: Sequence[str]) -> None:
    _check_domain_names(name, available_domains(name, root), sources, targets)


def check_dataset_names(name: str, sources: Sequence[str], targets: Sequence[str]) -> None:
    """What can be checked before any folder is made or read: the built-in engine reads this
    dataset, and (where its domains are fixed) the run's domains are among them."""
    try:
        domains = known_dataset(name)[0]
    except KeyError:
        close = difflib.get_close_matches(str(name), builtin_datasets(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DAELConfigError(
            f"dataset {name!r} is not one the built-in engine reads{hint}; it reads {builtin_datasets()} "
            "(every dataset of Dassl 0.6.3; see README, 'Which datasets run where'); a dataset of your own in "
            "Dassl's registry needs --engine dassl, or register_dataset (docs/internals.md)"
        ) from None
    if domains is not None:  # (a WILDS split's metadata domains are named by its reader)
        named = () if wilds_formats.names_metadata_sources(name, sources) else sources
        _check_domain_names(name, domains, named, targets)


def check_dataset_files(
    name: str,
    root: str,
    sources: Sequence[str],
    targets: Sequence[str],
    category_shift: bool = False,
    options: Optional[dict] = None,
) -> None:
    """Missing or partial data in Dassl's formats, said before a run makes its output folder
    (file lists are read, no image; the trainer reads them again)."""
    if not isinstance(DATASETS[name], DatasetSpec):  # Dassl's formats: their split files and folders
        load_splits(name, root, sources, targets, category_shift=category_shift, options=options)


def dataset_options(ds) -> Dict[str, object]:
    """The keys of a config's ``DATASET`` node that its dataset's reader reads beyond the name, root
    and domains (CIFAR-10-C's ``CIFAR_C_TYPE`` and ``CIFAR_C_LEVEL``); none for an unknown name."""
    entry = DATASETS.get(str(ds["NAME"]))  # (a CfgNode, or the dict of a saved config)
    return {k: ds.get(k) for k in entry.options} if entry is not None else {}


def official_split(name: str):
    """``(sources, targets)`` of a dataset that brings its own split (WILDS: its train split, of many
    metadata domains -> its out-of-distribution test split; a semi-supervised set: its labeled
    images -> its unlabeled ones, tested on its test split), else None."""
    entry = DATASETS.get(str(name))
    return entry.official_split if entry is not None else None


def sources_val(name: str, val):
    """The dataset's val split where it is of the source domains (a source validation split), else
    None: a WILDS val is of other domains than its train split's (its out-of-distribution val); a
    semi-supervised set's is held out of its labeled and unlabeled images alike."""
    return None if official_split(name) is not None else val


def own_val(name: str, val):
    """The dataset's val split where it is not of the sources (:func:`sources_val` gives it None):
    WILDS's out-of-distribution val, a semi-supervised set's held-out images; else None."""
    return val if official_split(name) is not None else None


def check_unread_keys(ds) -> None:
    """A key some reader reads (an entry's ``options``) set off its default for a dataset whose
    reader does not read it (``NUM_SHOTS`` on PACS): Dassl ignores it and trains on what it would
    have read without it; one line instead."""
    from dael_plugin.config.defaults import get_builtin_cfg  # (the defaults, Dassl's for its keys)

    entry = DATASETS.get(str(ds.NAME))
    if entry is None:
        return
    defaults = get_builtin_cfg().DATASET
    for key in sorted({k for e in DATASETS.values() for k in e.options} - set(entry.options)):
        if key in ds and key in defaults and ds[key] != defaults[key]:
            readers = [name for name, e in DATASETS.items() if key in e.options]
            raise DAELConfigError(
                f"DATASET.{key} {ds[key]!r}: {ds.NAME}'s reader does not read it (nor does Dassl's), so the run "
                f"would be the same without it; only {', '.join(readers)} read it: leave it at {defaults[key]!r}"
            )


def apply_official_split(ds) -> None:
    """A dataset that brings its own split (WILDS) names its parts as the run's domains: left out
    (Dassl's dataset configs set none), they become the split's; any others are refused, in one
    line, since the reader (Dassl's too) reads the official split whatever they say. ``ds``: the
    config's ``DATASET`` node, not frozen."""
    split = official_split(ds.NAME)
    if split is None:
        return
    sources, targets = tuple(ds.SOURCE_DOMAINS), tuple(ds.TARGET_DOMAINS)
    metadata = wilds_formats.names_metadata_sources(ds.NAME, sources) and targets in ((), split[1])
    if not sources and not targets:
        ds.SOURCE_DOMAINS, ds.TARGET_DOMAINS = list(split[0]), list(split[1])
    elif metadata and len(set(sources)) == len(sources):  # its train split's metadata domains (its reader checks them)
        ds.TARGET_DOMAINS = list(split[1])
    elif (sources, targets) != split:
        also = " (or, as sources, every metadata domain of its train split, once each)" if metadata else ""
        raise DAELConfigError(
            f"{ds.NAME} brings its own split, source {list(split[0])}{also} -> target {list(split[1])} (its reader "
            f"reads that, Dassl's too), not {list(sources)} -> {list(targets)}; leave --source-domains and "
            "--target-domains out"
        )


def _check_domain_names(name: str, domains: Sequence[str], sources: Sequence[str], targets: Sequence[str]) -> None:
    for d in list(sources) + list(targets):
        if d not in domains:
            close = difflib.get_close_matches(str(d), list(domains), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise DAELConfigError(f"dataset {name} has no domain {d!r}{hint}; its domains are {list(domains)}")
    if not targets:
        raise DAELConfigError(f"no target domain given; pass --target-domains one of {list(domains)}")


def read_items(
    path: str, domains: Sequence[str], splits: Sequence[str], classnames: Sequence[str], category_shift: bool = False
) -> List[Item]:
    """Items of the given domains and splits, labels by position in ``classnames``.

    The layout is checked as it is read: every domain and split must hold the
    same class folders, and no class folder may be empty. A class missing
    from one domain, or an empty folder, would otherwise silently change the
    label space or the per-domain class balance. With ``category_shift``
    (``DATASET.CATEGORY_SHIFT``) a domain may hold a subset of ``classnames``,
    the union: each item keeps its label in the union.
    """
    label_of = {c: i for i, c in enumerate(classnames)}
    items: List[Item] = []
    for d, domain in enumerate(domains):
        for split in splits:
            split_dir = os.path.join(path, domain, split)
            if not os.path.isdir(split_dir):
                raise DAELConfigError(f"missing folder {split_dir}: expected <domain>/{split}/<class>/<image>")
            present = _listdirs(split_dir)
            missing = sorted(set(classnames) - set(present))
            if missing and not category_shift:
                raise DAELConfigError(
                    f"classes differ between domains: {split_dir} has no folder for class(es) {missing[:10]}"
                    f"{' ...' if len(missing) > 10 else ''}; every domain and split needs the same class folders, "
                    "or set DATASET.CATEGORY_SHIFT True to read the union of the classes (docs/category_shift.md)"
                )
            for cname in present:
                cdir = os.path.join(split_dir, cname)
                files = [f for f in sorted(os.listdir(cdir)) if f.lower().endswith(IMAGE_EXTENSIONS)]
                if not files:
                    raise DAELConfigError(
                        f"class folder {cdir} holds no images ({', '.join(IMAGE_EXTENSIONS)}); "
                        "add images or remove the folder from every domain"
                    )
                items.extend(Item(os.path.join(cdir, f), label_of[cname], d, cname) for f in files)
    return items


def load_splits(
    name: str,
    root: str,
    sources: Sequence[str],
    targets: Sequence[str],
    seed: int = 0,
    category_shift: bool = False,
    options: Optional[dict] = None,
) -> Dict[str, object]:
    """Read train_x, train_u, val and test lists for a DA or DG run (``seed``: Digit-5's subsample;
    ``category_shift``: domains may hold different classes, read as their union; ``options``: the
    ``DATASET`` keys the reader reads, :func:`dataset_options`)."""
    check_dataset_names(name, sources, targets)
    root = os.path.abspath(os.path.expanduser(root or "."))
    out = DATASETS[name].load(name, root, sources, targets, seed, category_shift, options)
    if not out["train_x"]:  # (a folder layout says it first, naming its folder)
        raise DAELConfigError(f"no training images found for {name} source domains {list(sources)}")
    return out


def _load_folders(
    spec: DatasetSpec, name: str, root: str, sources: Sequence[str], targets: Sequence[str], category_shift: bool
) -> Dict[str, object]:
    """A folder layout's splits: ``<root>/<dataset_dir>/<domain>/<split>/<class>/<image>``."""
    path = dataset_dir(name, root)
    check_domains(name, root, sources, targets)
    classnames = sorted(
        {
            c
            for dom in list(sources) + list(targets)
            for s in spec.train + spec.test
            if os.path.isdir(os.path.join(path, dom, s))
            for c in _listdirs(os.path.join(path, dom, s))
        }
    )
    val_splits = tuple(s for s in spec.val if all(os.path.isdir(os.path.join(path, d, s)) for d in sources))
    test_splits = spec.test
    if spec.dataset_dir == "" and not all(os.path.isdir(os.path.join(path, d, "test")) for d in targets):
        test_splits = ("train",)  # a user's folder with no test split: evaluate on all target images
    out = {
        "classnames": classnames,
        "train_x": read_items(path, sources, spec.train, classnames, category_shift),
        "train_u": read_items(path, targets, spec.train, classnames, category_shift) if spec.unlabeled_target else None,
        "val": read_items(path, sources, val_splits, classnames, category_shift) if val_splits else None,
        "test": read_items(path, targets, test_splits, classnames, category_shift),
    }
    if not out["train_x"]:
        raise DAELConfigError(f"no training images found under {path} for source domains {list(sources)}")
    if category_shift:
        from dael_plugin.data.classes import check_union, classes_by_domain

        check_union(classes_by_domain(out["train_x"], len(sources), len(classnames)), sources, classnames)
    return out
