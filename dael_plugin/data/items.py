"""The one item type every dataset reader returns (Dassl's ``Datum`` fields)."""

from __future__ import annotations

from typing import NamedTuple, Sequence


class Item(NamedTuple):
    impath: str
    label: int
    domain: int  # index into the list of domains it was read with (a WILDS split: its metadata domain)
    classname: str
    # (a dataset that defines its own split names one domain per part, and its items keep the
    # metadata's domain numbers: data/wilds_formats.py)


def named_domain(domain: int, names: Sequence[str]) -> int:
    """The index in ``names`` (the run's source or target domains) of an item's ``domain``. Where
    one domain is named, every item is of it: a WILDS split's items keep their metadata domains
    (hospitals, cameras), which the samplers read, while the run names the split as one domain."""
    return 0 if len(names) == 1 else int(domain)
