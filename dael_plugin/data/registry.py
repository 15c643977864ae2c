"""The one registry of the datasets the plugin reads, on both engines: a name and its entry.

An entry is a folder layout (``data/folders.DatasetSpec``: Dassl's DigitsDG layout, the embedded
set, a user's own folders), a reader of one of Dassl's formats (``data/dassl_formats.Format``), of
a WILDS release (``data/wilds_formats.WildsFormat``) or of a semi-supervised set
(``data/ssl_formats.SslFormat``).
Each has ``dataset_dir``, ``domains`` (None: found in the folders), ``unlabeled_target`` (DA: the
target's train split is ``train_u``), ``seeded`` (the domains drawn from the seed), ``options`` (the
``DATASET`` keys its reader reads), ``official_split`` (None, or the ``(sources, targets)`` naming
a split the dataset brings: data/wilds_formats.py, data/ssl_formats.py) and
``load(name, root, sources, targets, seed, category_shift, options)``, which returns the splits and
class names. Dassl's ``DATASET_REGISTRY`` gets each name Dassl lacks from here, and Dassl's own readers of
the others are wrapped for category shift (``dassl_adapter/datasets.py``).
"""

from __future__ import annotations

from typing import Dict

from dael_plugin.errors import DAELConfigError

DATASETS: Dict[str, object] = {}


def register_dataset(name: str, entry):
    """Make ``entry`` the dataset ``DATASET.NAME name``; a name taken by another entry is refused."""
    if name in DATASETS and DATASETS[name] is not entry:
        raise DAELConfigError(f"a dataset named {name!r} is registered already; give yours another name")
    DATASETS[name] = entry
    return entry
