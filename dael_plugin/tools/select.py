"""Model selection over a sweep's per-epoch records (``epochs.jsonl``, engine/selection.py), as
DomainBed's ``model_selection.py`` does it for its protocols.

    python scripts/collect.py DIR --select PROTOCOL [--per-setting]
    python scripts/collect.py DIR --validators

For each table (dataset, DA/DG), each trainer and each target, and for each seed on its own, the
protocol chooses the grid setting (the sweep's settings of that trainer) *and* the epoch; the cell
is the target test accuracy of that choice, over seeds. ``--per-setting`` keeps one row per
setting and chooses the epoch alone. Each protocol reads only what its docstring says; the
``oracle`` alone reads target labels, and its table says it is an upper bound.

Long because the protocols, the grid choice per seed and the validator ranking read the same records
and must agree on them (one loader of epochs.jsonl, one row key); the command line and the table
printing are in collect.py.
"""

from __future__ import annotations

import math
import os
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from dael_plugin.core.validators import NAMES
from dael_plugin.engine.results_reader import (
    REPORTED,
    Record,
    Walk,
    domains_read,
    mixed_sources,
    read_records,
    row_labels,
)
from dael_plugin.engine.selection import EPOCHS, EXPERT_SIGNALS, EpochsFile, classifiers, protocol_score
from dael_plugin.tools.unfinished import Placer, without_record


# -- the protocols: each names what it may read ----------------------------------------------------
@dataclass(frozen=True)
class Protocol:
    name: str
    reads: str  # what the protocol reads, for the table's header and the docs
    last_epoch_only: bool = False  # DomainBed's oracle reads the final checkpoint only
    upper_bound: bool = False

    def score(self, record: dict) -> Optional[float]:
        key = "source_val" if self.name == "last" else self.name
        return protocol_score(record, key)


PROTOCOLS: Dict[str, Protocol] = {
    "last": Protocol(
        "last",
        "the last epoch; among grid settings, the best last-epoch source-validation accuracy",
        last_epoch_only=True,
    ),
    "source_val": Protocol(
        "source_val", "source-validation accuracy (DomainBed's training-domain validation), every epoch"
    ),
    "oracle": Protocol(
        "oracle",
        "target accuracy on a labelled part of the target's train split (never the test split), last epoch "
        "(DomainBed's test-domain oracle): an upper bound, not a result",
        last_epoch_only=True,
        upper_bound=True,
    ),
    **{v: Protocol(v, f"the unsupervised validator {v!r} (no target label), every epoch") for v in NAMES},
    "val": Protocol(
        "val",
        "accuracy on the dataset's own val split of other images than the sources' and the target's (WILDS's "
        "out-of-distribution val: its model selection), every epoch",
    ),
    "leave_one_domain_out": Protocol(
        "leave_one_domain_out",
        "DG: the mean target-test accuracy of the runs that left each source domain out, at each epoch",
    ),
}


class SelectError(ValueError):
    """A selection that cannot be made as asked (one line)."""


@dataclass
class Run:
    record: Record
    epochs: List[dict]

    @property
    def seed(self):
        return self.record.data.get("seed")


@dataclass
class Choice:
    setting: str
    epoch: int
    test: float


@dataclass
class CellChoice:
    values: List[float] = field(default_factory=list)
    choices: Dict[object, Choice] = field(default_factory=dict)
    missing: List[str] = field(default_factory=list)  # runs a protocol needs and the sweep lacks
    recorded: bool = False  # some run of the cell has epoch records (but none the protocol can score)
    left_out: List[str] = field(default_factory=list)  # seeds whose records are damaged or absent, and why

    def text(self, usual_n: int = 0) -> str:
        if not self.values:
            if self.left_out and not self.missing:
                return f"{len(self.left_out)} left out"
            if self.missing:
                return "missing runs"
            return "no score in the records" if self.recorded else "no records"
        mean = statistics.fmean(self.values)
        left = f", {len(self.left_out)} left out" if self.left_out else ""
        if len(self.values) == 1:
            return f"{mean:.2f} (n=1{left})"
        std = statistics.stdev(self.values)
        n = f" (n={len(self.values)}{left})" if (usual_n and len(self.values) != usual_n) or left else ""
        return f"{mean:.2f} ± {std:.2f} [{std / math.sqrt(len(self.values)):.2f}]{n}"


def _table_key(rec: Record) -> Tuple[str, str]:
    from dael_plugin.engine.results_reader import setting_of as _setting

    return str(rec.data.get("dataset")), _setting(rec.data)


def read_sweep(
    root: str, warn: Callable[[str], None] = print, domains: bool = True, walk: Optional[Walk] = None
) -> List[Tuple[Record, Optional[List[dict]], str]]:
    """Every finished run under ``root`` with its epoch records: ``[]`` when it has none, ``None``
    when they are damaged (each problem named through ``warn``: a line that is no record, an epoch
    out of order or past the run's epochs, an accuracy out of range, a FIFO). A damaged run is no
    run to choose from: choosing among its other epochs would be a choice the protocol did not make.
    ``domains=False``: a setting's runs on other domains share its label (results_reader.row_labels)."""
    walk = read_records(root) if walk is None else walk
    for problem in walk.problems:
        warn(problem.warning())
    labels = row_labels(walk.records, root, domains)  # the settings to choose between are the table's rows
    out = []
    for rec in walk.records:
        epochs, problems = EpochsFile(rec.dir).read_checked()
        total = rec.data.get("epochs")
        if epochs and isinstance(total, int) and epochs[-1]["epoch"] > total:
            problems.append(f"{os.path.join(rec.dir, EPOCHS)}: epoch {epochs[-1]['epoch']} is past the run's {total}")
        for problem in problems:
            warn(f"warning: {problem}; the run is left out of --select and --validators")
        out.append((rec, None if problems else epochs, labels[id(rec)]))
    return out


def _left_out(protocol: Protocol, runs: Dict[str, "Run"]) -> List[str]:
    """Why one seed's runs (one per grid setting) cannot be chosen from: damaged records, or a run
    without records where the protocol reads them (``last`` with one setting reads results.json)."""
    why = [f"{run.record.dir}: damaged epoch records (named above)" for run in runs.values() if run.epochs is None]
    if why or (protocol.name == "last" and len(runs) == 1):
        return why
    return [f"{run.record.dir}: no epoch records ({EPOCHS} absent)" for run in runs.values() if not run.epochs]


def _candidates(protocol: Protocol, runs: Dict[str, Run], key: str) -> List[Tuple[float, int, str, dict]]:
    """(score, -epoch, setting, record) over the settings' epochs that the protocol may read."""
    out = []
    for setting, run in sorted(runs.items()):
        epochs = run.epochs[-1:] if protocol.last_epoch_only else run.epochs
        for r in epochs:
            s = protocol.score(r)
            if s is not None and r.get(key) is not None:
                out.append((s, -int(r["epoch"]), setting, r))
    return out


def choose(protocol: Protocol, runs: Dict[str, Run], metric: str = "accuracy") -> Optional[Choice]:
    """The protocol's choice among ``runs`` (one per grid setting, one seed): the highest score;
    ties go to the earliest epoch, then the first setting by name. The cell reports ``metric``."""
    key, field = REPORTED[metric]
    if protocol.name == "last" and len(runs) == 1:  # one setting: its last epoch, records or not
        ((setting, run),) = runs.items()
        if run.epochs and run.epochs[-1].get(key) is not None:
            return Choice(setting, int(run.epochs[-1]["epoch"]), float(run.epochs[-1][key]))
        if run.record.data.get(field) is None:
            raise SelectError(f"{run.record.path} records no {field} (written before the plugin recorded it); rerun it")
        return Choice(setting, int(run.record.data.get("epochs") or 0), float(run.record.data[field]))
    cands = _candidates(protocol, runs, key)
    if not cands:
        return None
    best = min(cands, key=lambda c: (-c[0], -c[1], c[2]))  # best score, earliest epoch, first setting
    return Choice(best[2], -best[1], float(best[3][key]))


def _lodo_choice(
    runs: Dict[str, Run], all_runs: List[Tuple[Record, List[dict], str]], seed, missing: List[str], key: str
) -> Optional[Choice]:
    """Leave one domain out (DomainBed's ``LeaveOneOutSelectionMethod``): for a setting with sources
    S, the score at epoch e is the mean over j in S of the epoch-e target-test accuracy of the
    same setting's run on sources S - {j} and target j (a training domain, held out); the cell is
    the full run's epoch-e test accuracy."""
    cands = []
    for setting, run in sorted(runs.items()):
        sources = list(run.record.data.get("source_domains") or [])
        helpers, lacking = [], False
        for j in sources:
            want = sorted(s for s in sources if s != j)
            found = [
                ep
                for rec, ep, label in all_runs
                if label == setting
                and rec.data.get("seed") == seed
                and rec.data.get("target_domains") == [j]
                and sorted(rec.data.get("source_domains") or []) == want
            ]
            if not found or not found[0]:  # every run it lacks is named, not the first alone
                missing.append(f"{setting}: sources {' '.join(want)} -> target {j}, seed {seed}")
                lacking = True
                continue
            helpers.append({int(r["epoch"]): r.get("target_test_accuracy") for r in found[0]})
        if lacking:
            continue
        for r in run.epochs:
            e = int(r["epoch"])
            vals = [h.get(e) for h in helpers]
            if any(v is None for v in vals) or r.get(key) is None:
                continue
            cands.append((statistics.fmean(vals), -e, setting, r))
    if not cands:
        return None
    best = min(cands, key=lambda c: (-c[0], -c[1], c[2]))  # best score, earliest epoch, first setting
    return Choice(best[2], -best[1], float(best[3][key]))


def select(
    root: str,
    protocol_name: str,
    per_setting: bool = False,
    warn: Callable[[str], None] = print,
    metric: str = "accuracy",
) -> List[Tuple[Tuple[str, str], List[str], Dict[str, Dict[str, CellChoice]]]]:
    """``[(table key, targets, {row: {target: CellChoice}})]`` under ``protocol_name``, each cell
    the chosen epochs' target test ``metric`` (the protocols choose as they do whatever it is)."""
    if protocol_name not in PROTOCOLS:
        raise SelectError(f"unknown protocol {protocol_name!r}; choose from {', '.join(PROTOCOLS)}")
    protocol = PROTOCOLS[protocol_name]
    # leave one domain out reads each setting's runs on fewer sources, under the setting's label
    walk = read_records(root)
    all_runs = read_sweep(root, warn, domains=protocol.name != "leave_one_domain_out", walk=walk)
    # table -> row -> target -> seed -> setting -> Run
    grid: Dict[tuple, Dict[str, Dict[str, Dict[object, Dict[str, Run]]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    )

    # A row that both engines ran is two rows, as plain collect shows it ("DAEL [engine=dassl]"):
    # their runs are not one setting's seeds, nor settings to choose between.
    def row_of(rec: Record, label: str) -> str:
        return label if per_setting else str(rec.data.get("trainer"))

    # Likewise a row's runs on other sources for one target (results_reader.mixed_sources): a row
    # for each set of domains read, never settings to choose between (leave one domain out reads
    # those runs for its score; per setting, the labels tell them apart already).
    engines, records, rows_of = defaultdict(set), defaultdict(list), {}
    lodo = protocol.name == "leave_one_domain_out"
    for rec, _, label in all_runs:
        engines[_table_key(rec), row_of(rec, label)].add(rec.data.get("engine"))
        records[_table_key(rec), row_of(rec, label)].append(rec)
    mixed = {key for key, recs in records.items() if not lodo and not per_setting and mixed_sources(recs)}
    for rec, epochs, label in all_runs:
        table = _table_key(rec)
        if lodo and table[1] != "DG":
            continue
        row = row_of(rec, label)
        if len(engines[table, row]) > 1:
            row = f"{row} [engine={rec.data.get('engine')}]"
        if (table, row_of(rec, label)) in mixed:
            row = f"{row} [domains={list(domains_read(rec) or [])}]"
        slot = grid[table][row][rec.target][rec.data.get("seed")]
        if label in slot:
            raise SelectError(
                f"two records for {label} -> {rec.target} seed {rec.data.get('seed')}: "
                f"{slot[label].record.path} and {rec.path}; keep one"
            )
        slot[label] = Run(rec, epochs)
        rows_of[rec.dir] = (table, row)
    not_done = _not_done(walk, root, rows_of, grid, per_setting)
    if protocol.name == "leave_one_domain_out" and not grid:
        raise SelectError("leave_one_domain_out is a DG protocol, and the sweep holds no DG run")
    out = []
    for table in sorted(grid):
        rows = grid[table]
        targets = sorted({t for r in rows.values() for t in r})
        cells: Dict[str, Dict[str, CellChoice]] = {}
        for row in sorted(rows):
            cells[row] = {}
            for t in targets:
                cell, by_seed, gone = CellChoice(), rows[row].get(t, {}), not_done.get((table, row, t), {})
                for seed, runs in sorted(by_seed.items(), key=lambda kv: str(kv[0])):
                    if seed in gone:
                        continue
                    why = _left_out(protocol, runs)
                    if why:
                        cell.left_out += [f"seed {seed}: {w}" for w in why]
                        continue
                    if protocol.name == "leave_one_domain_out":
                        c = _lodo_choice(runs, all_runs, seed, cell.missing, REPORTED[metric][0])
                    else:
                        c = choose(protocol, runs, metric)
                    if c is not None:
                        cell.values.append(c.test)
                        cell.choices[seed] = c
                    cell.recorded = cell.recorded or any(run.epochs for run in runs.values())
                if not cell.recorded and not cell.values:  # no run of the cell has records: "no records" says it
                    cell.left_out = [w for w in cell.left_out if "damaged" in w]
                cell.left_out += [f"seed {seed}: {w}" for seed, why in sorted(gone.items(), key=str) for w in why]
                cells[row][t] = cell
        out.append((table, targets, cells))
    return out


_NOT_DONE = {"failed": "failed (failed.json)", "missing": "not finished", "corrupt": "its record cannot be read"}


def _not_done(walk: Walk, root: str, rows_of: Dict[str, tuple], grid: dict, per_setting: bool) -> Dict[tuple, Dict]:
    """``{(table, row, target): {seed: [why]}}``: the runs without a record, in the row of their
    launch's finished runs (tools/unfinished.py). Their seed is left out of the cell: its choice
    would be made among fewer settings than the sweep's (or, per setting, there is none)."""
    out: Dict[tuple, Dict] = defaultdict(lambda: defaultdict(list))
    unrecorded = without_record(walk)
    placer = Placer(rows_of, ignore=() if per_setting else ("grid",)) if unrecorded else None
    for path, kind in unrecorded:
        where = placer.place(path, root, grid, trainer_rows=not per_setting)
        if where is None:
            continue
        table, row, target, seed = where
        grid[table][row][target]  # a row of its own where it is placed in none (the cell says why)
        number = int(seed[4:]) if seed[4:].isdigit() else seed[4:]
        out[table, row, target][number].append(
            f"{path}: {_NOT_DONE[kind]}, no record to choose from; rerun it, or move its folder out of {root} to "
            "choose without it"
        )
    return out


def render_selected(tables, protocol_name: str, metric: str = "accuracy") -> str:
    p = PROTOCOLS[protocol_name]
    md = []
    for (dataset, setting), targets, cells in tables:
        head = "UPPER BOUND (reads target labels): " if p.upper_bound else ""
        md.append(
            f"### {head}{dataset} ({setting}), target test {metric.replace('_', ' ')} (%) of the model chosen by "
            f"`{protocol_name}`: mean ± std over seeds [standard error]"
        )
        md.append(f"Reads: {p.reads}.")
        md.append("")
        counts = Counter(len(c.values) for by_t in cells.values() for c in by_t.values() if c.values)
        usual = counts.most_common(1)[0][0] if counts else 0
        md.append(f"Seeds per cell: {usual} (another count is marked n= in its cell).")
        md.append("")
        md.append("| | " + " | ".join(targets) + " | Avg |")
        md.append("|---" * (len(targets) + 2) + "|")
        for row, by_t in cells.items():
            means = [statistics.fmean(c.values) if c.values else None for c in by_t.values()]
            avg = "—" if any(m is None for m in means) else f"{statistics.fmean(means):.2f}"
            md.append(f"| {row} | " + " | ".join(by_t[t].text(usual) for t in targets) + f" | {avg} |")
        md.append("")
        md.append("Choices (seed: setting @ epoch):")
        for row, by_t in cells.items():
            for t in targets:
                c = by_t[t]
                picks = "; ".join(f"{s}: {ch.setting} @ {ch.epoch}" for s, ch in c.choices.items())
                md.append(f"- {row} -> {t}: {picks or '—'}")
                for m in c.missing:
                    md.append(f"  - needs the run {m}")
                for m in c.left_out:
                    md.append(f"  - left out: {m}")
        unscored = any(c.recorded and not c.values for by_t in cells.values() for c in by_t.values())
        if unscored and protocol_name in ("source_val", "dev", "devn"):
            md.append("")
            md.append(
                f"No score in the records: `{protocol_name}` reads a source validation split, and runs with "
                "SELECTION.EVAL_FREQ -1 (auto) train on every source image; rerun them with SELECTION.EVAL_FREQ 1, "
                "which holds out 20% (SELECTION.HOLDOUT_FRACTION)."
            )
        md.append("")
    return "\n".join(md)


# -- ranking the validators (Musgrave et al. 2022) --------------------------------------------------
def _weighted_ranks(x, w):
    """Each value's weighted rank: the total weight of the values below it plus, for its tie group
    of ``n`` values, ``(n + 1) / 2`` times the group's mean weight (WeightedCorr's ``_wrank``; with
    every weight 1 it is the average rank)."""
    import numpy as np
    from scipy.stats import rankdata

    _, group, counts = np.unique(rankdata(x), return_inverse=True, return_counts=True)
    total = np.bincount(group, w)
    return ((np.cumsum(total) - total) + (counts + 1) / 2 * (total / counts))[group]


def weighted_spearman(scores: Sequence[float], accs: Sequence[float], power: float = 2.0) -> float:
    """Musgrave et al.'s weighted Spearman correlation, as their own code computes it
    (KevinMusgrave/powerful-benchmarker, ``validator_tests/utils/weighted_spearman.py``, since its
    2023-04 change "Use np.maximum(t_ranks, v_ranks)"; the paper's tables use ``pow=2``):

    - each checkpoint's weight is ``max(v, t) ** power``, where ``v`` and ``t`` are the dense ranks
      of its score and of its target accuracy, each divided by its maximum: a checkpoint counts
      fully when the validator *or* the accuracy puts it on top, so a validator that scores bad
      checkpoints highest is punished as much as one that misses the good ones;
    - the correlation is a Spearman on *weighted* ranks: the weighted Pearson correlation (those
      weights) of each variable's weighted ranks (:func:`_weighted_ranks`), as the WeightedCorr
      package's ``method="spearman"`` computes it;
    - a score that is NaN or infinite counts as the lowest finite score (the reference's
      ``set_nan_inf_to_min``); the accuracies must be finite.

    ``power=0`` is the plain Spearman correlation. NaN when it is undefined (fewer than 2
    checkpoints, no finite score, or one variable constant)."""
    import numpy as np
    from scipy.stats import rankdata

    s, a = np.asarray(scores, dtype=float), np.asarray(accs, dtype=float)
    finite = np.isfinite(s)
    if len(s) < 2 or not finite.any() or not np.isfinite(a).all():
        return float("nan")
    s = np.where(finite, s, s[finite].min())
    v = rankdata(s, method="dense") / rankdata(s, method="dense").max()
    t = rankdata(a, method="dense") / rankdata(a, method="dense").max()
    w = np.maximum(v, t) ** power
    rs, ra = _weighted_ranks(s, w), _weighted_ranks(a, w)
    ms, ma = np.average(rs, weights=w), np.average(ra, weights=w)
    cov = np.sum(w * (rs - ms) * (ra - ma))
    var = math.sqrt(np.sum(w * (rs - ms) ** 2) * np.sum(w * (ra - ma) ** 2))
    return float(cov / var) if var > 0 else float("nan")


def _ranked_score(record: dict, name: str) -> Optional[float]:
    """The score the ranking reads: the protocol's, but a validator's NaN or infinity kept (the
    reference counts it as the lowest finite score, where a protocol skips it)."""
    score = protocol_score(record, name)
    if score is not None or name == "source_val":
        return score
    if name in EXPERT_SIGNALS and classifiers(record) == 1:
        return None
    raw = (record.get("validators") or {}).get(name)
    return raw if isinstance(raw, float) and not math.isfinite(raw) else None


def rank_validators(root: str, warn: Callable[[str], None] = print):
    """For each DA table and target: every validator's Spearman and weighted Spearman correlation
    with target test accuracy over all evaluated checkpoints (every epoch of every run), and its
    regret: the best test accuracy minus that of the checkpoint it scores highest, mean over seeds."""
    problems: List[str] = []
    walked = read_sweep(root, lambda line: (problems.append(line), warn(line)))
    runs = [
        (*_table_key(rec), rec.target, rec.data.get("seed"), epochs)
        for rec, epochs, _ in walked
        if epochs is not None  # damaged: named by read_sweep
    ]
    ranked = rank_runs(runs)
    if not ranked:  # say why, naming the runs and lines refused (not a setting the user has)
        da = [(rec, epochs) for rec, epochs, _ in walked if _table_key(rec)[1] == "DA"]
        refused = [rec.dir for rec, epochs in da if epochs is None]
        if refused:
            first = next((p for p in problems if "warning: " in p), "")
            raise SelectError(
                f"no DA run under {root} can be ranked: the epoch records of {len(refused)} of its {len(da)} DA "
                f"run(s) were refused ({refused[0]}{' and others' if len(refused) > 1 else ''}; "
                f"{first.removeprefix('warning: ').split('; the run is left out')[0] or 'named above'})"
            )
        if not da:
            raise SelectError(f"no DA run under {root} (validators rank target-free scores of DA runs)")
        if not any(epochs for _, epochs in da):
            raise SelectError(f"no DA run under {root} has epoch records: train with SELECTION.EVAL_FREQ 1 (or N)")
        raise SelectError(
            f"the DA runs under {root} have too few evaluated checkpoints to rank validators (3 per target at least)"
        )
    return ranked


def rank_runs(runs: Sequence[Tuple[str, str, str, object, List[dict]]]):
    """:func:`rank_validators` over ``(dataset, setting, target, seed, epoch records)`` per run."""
    by: Dict[Tuple[str, str, str], List[Tuple[object, dict]]] = defaultdict(list)
    for dataset, setting, target, seed, epochs in runs:
        if setting != "DA":
            continue
        for r in epochs:
            if r.get("target_test_accuracy") is not None:
                by[(dataset, setting, target)].append((seed, r))
    out = []
    for key in sorted(by):
        points = by[key]
        rows = []
        for name in ("source_val",) + NAMES:
            pairs = [(_ranked_score(r, name), r["target_test_accuracy"], seed) for seed, r in points]
            pairs = [p for p in pairs if p[0] is not None]
            if len(pairs) < 3:
                continue
            sc, acc = [p[0] for p in pairs], [p[1] for p in pairs]
            regrets = []
            for seed in sorted({p[2] for p in pairs}, key=str):
                mine = [p for p in pairs if p[2] == seed]
                chosen = max(mine, key=lambda p: p[0] if math.isfinite(p[0]) else -math.inf)[1]
                regrets.append(max(p[1] for p in mine) - chosen)
            rows.append(
                {
                    "validator": name,
                    "spearman": weighted_spearman(sc, acc, 0.0),
                    "weighted_spearman": weighted_spearman(sc, acc, 2.0),
                    "regret": statistics.fmean(regrets),
                    "checkpoints": len(pairs),
                }
            )
        rows.sort(key=lambda r: -r["weighted_spearman"] if not math.isnan(r["weighted_spearman"]) else math.inf)
        out.append((key, rows))
    return out


def render_ranking(ranked) -> str:
    md = []
    for (dataset, setting, target), rows in ranked:
        md.append(
            f"### {dataset} ({setting}) -> {target}: validators against target test accuracy over every "
            "evaluated checkpoint (Musgrave et al.'s weighted Spearman, power 2; regret in accuracy points, "
            "mean over seeds)"
        )
        md.append("")
        md.append("| validator | weighted Spearman | Spearman | regret | checkpoints |")
        md.append("|---|---|---|---|---|")
        undefined = False
        for r in rows:
            ws, sp = (_corr(r[k]) for k in ("weighted_spearman", "spearman"))
            undefined = undefined or "undefined" in (ws, sp)
            md.append(f"| {r['validator']} | {ws} | {sp} | {r['regret']:.2f} | {r['checkpoints']} |")
        if undefined:
            md.append("")
            md.append("undefined: the validator gave every checkpoint the same score (no ranking to correlate).")
        md.append("")
    return "\n".join(md)


def _corr(value: float) -> str:
    return "undefined" if math.isnan(value) else f"{value:.3f}"
