"""Which classes each source domain holds (``DATASET.CATEGORY_SHIFT``): the table that
``--check-data`` and the run's log print, the union check, and the ``(K, C)`` mask the core's
category-shift DAEL reads (core/category_shift.py)."""

from __future__ import annotations

from typing import List, Sequence

from dael_plugin.errors import DAELConfigError


def classes_by_domain(items: Sequence, num_domains: int, num_classes: int) -> List[List[bool]]:
    """``[domain][class]``: whether any of ``items`` (``.domain``, ``.label``) has that pair."""
    held = [[False] * num_classes for _ in range(num_domains)]
    for it in items:
        held[int(it.domain)][int(it.label)] = True
    return held


def check_union(held: List[List[bool]], sources: Sequence[str], classnames: Sequence[str]) -> None:
    """Every class of the label space is held by some source: a class only the target holds
    could never be learned, and Dassl would size its classifier from the sources' labels."""
    orphans = [c for j, c in enumerate(classnames) if not any(row[j] for row in held)]
    if orphans:
        raise DAELConfigError(
            f"class(es) {orphans[:10]} are in no source domain ({', '.join(sources)}): no expert can learn them; "
            "remove them from the target or add a source domain that holds them"
        )


def describe(held: List[List[bool]], sources: Sequence[str], classnames: Sequence[str]) -> List[str]:
    """One line per source domain: how many classes it holds and which it lacks."""
    lines = []
    for name, row in zip(sources, held):
        lacks = [c for c, h in zip(classnames, row) if not h]
        lines.append(
            f"{name}: {sum(row)} of {len(classnames)} classes" + (f", lacks {', '.join(lacks)}" if lacks else "")
        )
    return lines
