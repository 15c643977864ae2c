"""Which classes each source domain holds (``DATASET.CATEGORY_SHIFT``): the table that
``--check-data`` and the run's log print, the union check, and the ``(K, C)`` mask the core's
category-shift DAEL reads (core/category_shift.py)."""

from __future__ import annotations

from typing import List, Sequence

from dael_plugin.data.items import named_domain
from dael_plugin.errors import DAELConfigError


def classes_by_domain(items: Sequence, num_domains: int, num_classes: int) -> List[List[bool]]:
    """``[domain][class]``: whether any of ``items`` (``.domain``, ``.label``) has that pair."""
    held = [[False] * num_classes for _ in range(num_domains)]
    for it in items:
        held[named_domain(it.domain, held)][int(it.label)] = True
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


def one_class_warning(held: List[List[bool]], sources: Sequence[str], classnames: Sequence[str]) -> str:
    """A warning line where a source holds a single class ('' otherwise): with its expert masked to
    its own classes (CLASS_MASKS), that expert is sure of its class for every image, so it gives a
    pseudo-label above any threshold to every target image (measured: mask_u 100%, 19% right), and
    the ensemble drifts towards that class."""
    alone = [(name, classnames[row.index(True)]) for name, row in zip(sources, held) if sum(row) == 1]
    if not alone:
        return ""
    name, cls = alone[0]
    return (
        f"Warning: source {name} holds one class ({cls}): its masked expert is certain of it on every image, "
        "so pseudo-labels of that class pass the threshold on most target images (no rule here discounts a "
        "one-class expert; the ensemble drifts to it): consider leaving the domain out of the sources"
    )


def say_class_table(held: List[List[bool]], sources: Sequence[str], classnames: Sequence[str]) -> None:
    """The run's ``Category shift:`` line (:func:`describe`), and :func:`one_class_warning`'s
    where it has one: the same lines from every trainer of both engines."""
    print("Category shift: " + "; ".join(describe(held, sources, classnames)))
    said = one_class_warning(held, sources, classnames)
    if said:
        print(said)
