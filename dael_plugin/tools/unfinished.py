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
from typing import Dict, List, Optional, Set, Tuple

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


def _launched(run_dir: str) -> Optional[dict]:
    """What a sweep launched the folder with (its ``sweep_run.json``), read once; None without one."""
    try:
        return read_json_dict(os.path.join(run_dir, IDENTITY))
    except ValueError:
        return None


def without_record(walk) -> List[Tuple[str, str]]:
    """(folder, kind) of each run of a walk (engine/results_reader.read_records) without a record:
    ``failed`` (its failed.json), ``missing`` (not finished), ``corrupt`` (a record that cannot be read)."""
    return (
        [(p, "failed") for p in walk.failed]
        + [(p, "missing") for p in walk.pending]
        + [(os.path.dirname(p.path), "corrupt") for p in walk.problems]
    )


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
            for launch in self._keys(_launched(run_dir)):
                self.launched[launch].add(cell)

    def _keys(self, launched: Optional[dict]) -> List[str]:
        if not launched:
            return []
        return [json.dumps({k: v for k, v in launched.items() if k not in drop}, sort_keys=True) for drop in self.drops]

    def place(self, path: str, root: str, tables: dict, trainer_rows: bool) -> Optional[Tuple[tuple, str, str, str]]:
        """(table, row, target, seed folder) of the run without a record at ``path`` (None outside
        the sweep layout): the table and row of its launch's finished runs (of its label, or of its
        trainer where ``trainer_rows``); else, for a run launched by hand, the table its trainer's
        class says and its label's one row in ``tables``. One that can be placed in none of several
        rows, or whose setting has no finished run, is in a row of its own."""
        from dael_plugin.methods import method_setting

        where = place(path, root)
        if where is None:
            return None
        dataset, label, target, seed = where
        name = label.split("/")[0] if trainer_rows else label
        launched = _launched(path)
        for launch in self._keys(launched):
            found = {(t, r) for t, r in self.launched.get(launch, ()) if r == name or r.startswith(name + " [")}
            if len(found) == 1:
                table, row = found.pop()
                return table, row, target, seed
        table = (dataset, method_setting(label.split("/")[0]))  # no record to say it: the trainer's class does
        labelled = [r for r in tables.get(table, {}) if r == name or r.startswith(name + " [")]
        if not launched and len(labelled) <= 1:
            return table, labelled[0] if labelled else name, target, seed
        return table, f"{name} {UNPLACED}", target, seed
