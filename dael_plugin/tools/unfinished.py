"""Where a sweep's run without a record belongs in a table: a failed run (``failed.json``), an
unfinished one (its ``sweep_log.txt`` alone) or one whose record cannot be read. ``collect``
counts it in a cell; ``--select`` leaves its seed out of the choice, which would otherwise be
made among fewer settings than the sweep's.

Its row is the one its sweep launch's finished runs are in (other targets or seeds), read from
the ``sweep_run.json`` the sweep wrote in each folder; never the first row of its folder label,
where it would count against another setting's cell.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Set, Tuple

from dael_plugin.engine.atomic import read_json_dict
from dael_plugin.engine.results_reader import IDENTITY

UNPLACED = "[runs without a record of their setting]"


def place(path: str, root: str) -> Optional[Tuple[str, str, str, str]]:
    """(dataset, row label, target, seed folder) of a run folder in the sweep layout
    ``<dataset>/<trainer>[/<setting>]/<target>/seed<N>``; None elsewhere."""
    rel = os.path.relpath(path, root).split(os.sep)
    if len(rel) >= 4 and rel[-1].startswith("seed"):
        return rel[0], "/".join(rel[1:-2]), rel[-2], rel[-1]
    return None


def _launch(run_dir: str, drop: Sequence[str]) -> Optional[str]:
    """What a sweep launched the folder with (its ``sweep_run.json``) less the keys ``drop``."""
    try:
        had = read_json_dict(os.path.join(run_dir, IDENTITY))
    except ValueError:
        return None
    return json.dumps({k: v for k, v in had.items() if k not in drop}, sort_keys=True) if had else None


class Placer:
    """The table and row of finished runs by their launch, less its target and seed (and
    ``ignore``: the grid setting, where the rows are trainers), with and without its sources (a
    setting split by the domains its runs read)."""

    def __init__(self, cells: Dict[str, Tuple[tuple, str]], ignore: Tuple[str, ...] = ()) -> None:
        """``cells``: each finished run's folder -> (its table, its row)."""
        base = ("target", "seed", *ignore)
        self.drops = (base, (*base, "sources"))
        self.launched: Dict[str, Set[Tuple[tuple, str]]] = defaultdict(set)
        for run_dir, cell in cells.items():
            for drop in self.drops:
                launch = _launch(run_dir, drop)
                if launch is not None:
                    self.launched[launch].add(cell)

    def place(self, path: str, label: str, table: tuple, labelled: List[str]) -> Tuple[tuple, str]:
        """The table and row of the run without a record at ``path``: its launch's finished runs'
        (of its ``label``); else, for a run launched by hand, ``table`` (the trainer's class says it)
        and its one row of the label there (``labelled``). One that can be placed in none of several
        rows, or whose setting has no finished run, is in a row of its own."""
        for drop in self.drops:
            launch = _launch(path, drop)
            found = {(t, r) for t, r in self.launched.get(launch, ()) if r == label or r.startswith(label + " [")}
            if len(found) == 1:
                return found.pop()
        if _launch(path, ()) is None and len(labelled) <= 1:
            return table, labelled[0] if labelled else label
        return table, f"{label} {UNPLACED}"
