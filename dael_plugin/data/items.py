"""The one item type every dataset reader returns (Dassl's ``Datum`` fields)."""

from __future__ import annotations

from typing import NamedTuple


class Item(NamedTuple):
    impath: str
    label: int
    domain: int  # index into the list of domains it was read with
    classname: str
