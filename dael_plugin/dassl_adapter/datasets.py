"""The plugin's folder datasets as Dassl datasets (same files as the built-in engine)."""

from __future__ import annotations

from dassl.data.datasets import DATASET_REGISTRY, DatasetBase, Datum
from yacs.config import CfgNode as CN

from dael_plugin.data import folders


class KeptDatum(Datum):
    """Dassl's ``Datum`` without its ``assert os.path.isfile(impath)``: a FIFO, a link to a device
    or a folder named like an image stopped the whole run with a bare ``AssertionError``. The
    plugin's loader (``data/loaders.ImageList``, a plugin method's on the Dassl engine) replaces
    such an entry with another image of its domain when it is read, with a warning; ``--check-data``
    lists it."""

    def __init__(self, impath: str = "", label: int = 0, domain: int = 0, classname: str = "") -> None:
        self._impath, self._label, self._domain, self._classname = impath, label, domain, classname


def _datums(items):
    return (
        None
        if items is None
        else [KeptDatum(impath=i.impath, label=i.label, domain=i.domain, classname=i.classname) for i in items]
    )


def _read_into(dataset, name: str, cfg: CN, seed: int = 0) -> None:
    """Fill a Dassl ``DatasetBase`` with the plugin's reading of ``name`` (``seed``: Digit-5's subsample)."""
    splits = folders.load_splits(
        name,
        cfg.DATASET.ROOT,
        cfg.DATASET.SOURCE_DOMAINS,
        cfg.DATASET.TARGET_DOMAINS,
        seed,
        category_shift=bool(cfg.DATASET.get("CATEGORY_SHIFT", False)),
        options=folders.dataset_options(cfg.DATASET),
    )
    DatasetBase.__init__(
        dataset,
        train_x=_datums(splits["train_x"]),
        train_u=_datums(splits["train_u"]),
        val=_datums(splits["val"]),
        test=_datums(splits["test"]),
    )


def _make(name: str):
    spec = folders.DATASETS[name]

    def __init__(self, cfg: CN):
        _read_into(self, name, cfg)

    doc = f"{name}: read by dael_plugin.data.folders ({'DA' if spec.unlabeled_target else 'DG'})."
    attrs = {
        "__init__": __init__,
        "__doc__": doc,
        "dataset_dir": spec.dataset_dir,
        "domains": list(spec.domains or []),
        "_dael_plugin_dataset": True,  # read by the plugin alone (Dassl has no reader of its own)
    }
    return type(name, (DatasetBase,), attrs)


# The plugin's DATASET keys that read the files otherwise than Dassl's readers can
PLUGIN_READINGS = ("CATEGORY_SHIFT", "STL10_FOLD_AS_WRITTEN")


def plugin_reading(ds: CN) -> bool:
    """Whether the run reads its files otherwise than Dassl's reader can: under one of
    :data:`PLUGIN_READINGS`, or naming a WILDS train split's metadata domains as its sources (Dassl's
    reader numbers them in the metadata's order, whatever the run names)."""
    named = folders.wilds_formats.names_metadata_sources(ds.NAME, ds.SOURCE_DOMAINS)
    return named or any(bool(ds.get(key, False)) for key in PLUGIN_READINGS)


def _category_shift_aware(name: str, dassl_cls: type) -> type:
    """Dassl's own reader of ``name``, or, under one of :data:`PLUGIN_READINGS`, the plugin's reader
    of the same files (data/folders.py, data/dassl_formats.py, data/ssl_formats.py). Dassl's readers
    of class folders number each domain's folders on their own, so a domain that lacks a class would
    shift its labels; the plugin's number every domain by the union. Dassl's STL10 reader wraps the
    fold's indices past 255; the plugin's reads them as written. Dassl's WILDS readers number the
    metadata domains in their own order; the plugin's in the order the run names them. Without
    these this is Dassl's class, unchanged."""

    def __init__(self, cfg: CN):
        if not plugin_reading(cfg.DATASET):
            dassl_cls.__init__(self, cfg)
        else:
            _read_into(self, name, cfg, max(int(cfg.SEED), 0))  # Digit-5: the plugin's draw, not Dassl's

    doc = f"{dassl_cls.__doc__ or name}\n\nUnder DATASET.{'/'.join(PLUGIN_READINGS)} read by dael_plugin."
    return type(name, (dassl_cls,), {"__init__": __init__, "__doc__": doc, "_dael_dassl_reader": dassl_cls})


def is_plugin_dataset(name: str) -> bool:
    """Whether Dassl reads ``name`` through the plugin alone (the embedded set, DomainFolders, a user's own)."""
    return name in DATASET_REGISTRY.registered_names() and getattr(
        DATASET_REGISTRY.get(name), "_dael_plugin_dataset", False
    )


def register_datasets() -> None:
    """Generated from the one registry (data/registry.py): each name Dassl lacks is added, read by
    the plugin; Dassl's own readers of the others (Digit5, DigitsDG, ...) stay, wrapped so that
    category shift reads the union of the classes."""
    for name in folders.builtin_datasets():
        if name not in DATASET_REGISTRY.registered_names():
            DATASET_REGISTRY.register(_make(name))
            continue
        current = DATASET_REGISTRY.get(name)
        if not hasattr(current, "_dael_dassl_reader") and not getattr(current, "_dael_plugin_dataset", False):
            DATASET_REGISTRY.register(_category_shift_aware(name, current), force=True)  # a class named name
