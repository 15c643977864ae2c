"""The category-shift benchmark's table (tools/category_shift.py): the pseudo-label columns read
from a run's log, the accuracy on the digits one source alone holds, and the choices that source
validation and the oracle make among the runs' epoch records (tools/select.py's protocols)."""

from __future__ import annotations

import os
import re
import statistics
from typing import Dict, List, Sequence


def last_pseudo_labels(rec: Dict):
    """(share of target images kept, accuracy of the kept pseudo-labels) in the last epoch, from the
    run's log (None without L_u)."""
    found = None
    with open(os.path.join(rec["output_dir"], "log.txt"), encoding="utf-8", errors="replace") as f:
        for line in f:
            # the built-in engine's epoch line, or the Dassl engine's running means (to its last print)
            # (other meters, loss_other, may stand between mask_u and pl_acc_u)
            m = re.search(r"batches \d+ .*mask_u ([\d.]+)% (?:\S+ \S+ )*?pl_acc_u ([\d.]+%|-)", line) or re.search(
                r"mask_u [\d.]+% \(([\d.]+)%\) (?:\S+ \S+ \S+ )*?pl_acc_u [\d.-]+%? \(([\d.]+%|-)\)", line
            )
            if m:  # pl_acc_u "-": no pseudo-label was kept
                found = (float(m.group(1)), float(m.group(2)[:-1]) if m.group(2) != "-" else float("nan"))
    return found


def sd(values: List[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def single_source_accuracy(rec: Dict, single: Sequence[str]) -> float:
    per = rec.get("per_class_accuracy") or {}
    vals = [per[d] for d in single if d in per]
    return statistics.fmean(vals) if len(vals) == len(single) else float("nan")


def runs_of(rec: Dict):
    """The selection's view of one finished run (tools/select.py): its record and its epoch records,
    or None where they are damaged or absent (named by the caller)."""
    from dael_plugin.engine.results_reader import Record
    from dael_plugin.engine.selection import EpochsFile
    from dael_plugin.tools.select import Run

    epochs, problems = EpochsFile(rec["output_dir"]).read_checked()
    if problems or not epochs:
        return None
    return Run(Record(os.path.join(rec["output_dir"], "results.json"), rec), epochs)


def chosen_text(recs: List[Dict], protocol: str) -> str:
    """Each seed's epoch chosen by ``protocol`` within its own run; the target test accuracy there."""
    from dael_plugin.tools.select import PROTOCOLS, choose

    vals = []
    for rec in recs:
        run = runs_of(rec)
        c = choose(PROTOCOLS[protocol], {"run": run}) if run is not None else None
        if c is None:
            return f"{'— (no records)':>15}"
        vals.append(c.test)
    return f"{statistics.fmean(vals):6.2f} ± {sd(vals):5.2f}"


def rule_choice(grid: Dict[str, List[Dict]], seeds: Sequence[int], protocol: str = "source_val") -> str:
    """The DAEL rows with L_u treated as one grid of settings: for each seed, ``protocol`` chooses the
    row (and, ``source_val``, the epoch), as ``collect.py --select`` does over a sweep. ``source_val``
    (DomainBed's training-domain validation) reads no target label; the ``oracle`` (the last epoch of
    the row best on a labelled part of the target's train split) is an upper bound, not a result.
    Within one row the oracle's choice is the last epoch: it is printed as a choice among rows only."""
    from dael_plugin.tools.select import PROTOCOLS, choose

    picks, vals = [], []
    for i, seed in enumerate(seeds):
        runs = {slug: runs_of(recs[i]) for slug, recs in grid.items()}
        if not runs or any(r is None for r in runs.values()):
            return f"{protocol}'s choice among the DAEL rows with L_u: — (a run has no epoch records)"
        c = choose(PROTOCOLS[protocol], runs)
        picks.append(f"seed {seed}: {c.setting} epoch {c.epoch} ({c.test:.2f})")
        vals.append(c.test)
    bound = " (an upper bound, reads target labels)" if PROTOCOLS[protocol].upper_bound else ""
    return (
        f"{protocol}'s choice{bound} among the {len(grid)} DAEL rows with L_u, per seed: "
        + "; ".join(picks)
        + f"\n  target test accuracy of those choices: {statistics.fmean(vals):.2f} ± {sd(vals):.2f}"
    )
