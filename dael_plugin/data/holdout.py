"""The source validation split: a held-out part of each source domain's train split.

DomainBed's training-domain validation holds out ``holdout_fraction`` of every training domain
(``split_dataset``, 0.2 by default) and never trains on it. Here the draw is stratified by
(domain, class), so every class of every domain keeps its share, and it is a pure function of the
items and the seed: every process of a torchrun job, and every engine, draws the same split, and a
resumed run draws the one it started with.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch


def holdout_split(items: Sequence[Any], fraction: float, seed: int) -> Tuple[List[Any], List[Any]]:
    """``(train, val)``: for every (domain, class) group of ``items`` (anything with ``.domain``
    and ``.label``: the built-in engine's ``Item``, Dassl's ``Datum``), ``round(fraction * n)``
    items held out, at least one item kept for training; both lists keep the items' order. The
    draw depends only on ``seed``, the group and the group's image paths (``.impath``), not on the
    order the items were listed in."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"holdout fraction {fraction} is not in [0, 1)")
    if fraction == 0.0:
        return list(items), []
    groups: Dict[Tuple[int, int], List[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault((int(it.domain), int(it.label)), []).append(i)
    held = set()
    for (domain, label), idx in sorted(groups.items()):
        k = min(int(fraction * len(idx) + 0.5), len(idx) - 1)
        if k <= 0:
            continue
        idx = sorted(idx, key=lambda i: str(getattr(items[i], "impath", i)))  # independent of listing order
        g = torch.Generator().manual_seed((int(seed) * 1_000_003 + domain * 10_007 + label) % (2**63))
        for j in torch.randperm(len(idx), generator=g)[:k].tolist():
            held.add(idx[j])
    train = [it for i, it in enumerate(items) if i not in held]
    val = [it for i, it in enumerate(items) if i in held]
    return train, val
