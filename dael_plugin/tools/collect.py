"""Tables from a sweep's ``results.json`` records (DomainBed's ``collect_results``, for Dassl runs).

    python scripts/collect.py DIR [--latex] [--paper] [--metric mean_class_accuracy|macro_f1|wilds:FIGURE]
    python scripts/collect.py DIR --select PROTOCOL [--per-setting]    (model selection, docs/selection.md)
    python scripts/collect.py DIR --validators                         (the validators ranked)

One table per dataset and setting (DA/DG): a row per trainer and override
setting, a column per target domain plus the average, each cell the mean ±
std over seeds (``n=`` where a cell's seed count differs from the table's
usual count). A cell never mixes settings: records of one row whose merged
configs differ (other epochs, rates, engines, sources...) become rows of
their own, named by the keys that differ, and two records of one seed in a
cell are an error naming both, never an average. A run without a record is
marked (``failed`` with a ``failed.json``, ``corrupt`` for a record that
cannot be read, with a warning naming it, else ``missing``), never dropped,
in the row of the finished runs its ``sweep_run.json`` was launched with (a
row of its own where none finished).
The tables are printed and written to ``DIR/results.md`` and
``DIR/results.csv``; ``--latex`` also prints LaTeX. ``--paper`` adds the
published numbers of the DAEL paper (``dael_plugin/tools/paper_results.json``,
each with its table cited). ``--metric mean_class_accuracy``: each class's
accuracy averaged over the test classes (VisDA-2017's figure), into
``DIR/results_mean_class_accuracy.*``; ``--metric macro_f1``: each class's F1 so averaged
(iWildCam-WILDS's figure), into ``DIR/results_macro_f1.*``; ``--metric wilds:acc_worst_region``: a
figure of WILDS's own evaluation (FMoW's worst region), in percent, into
``DIR/results_wilds_acc_worst_region.*``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import sys
from collections import Counter, defaultdict
from typing import Dict, List, Optional, Tuple

from dael_plugin.data.fingerprint import one_digest
from dael_plugin.engine.atomic import write_text
from dael_plugin.engine.results_reader import (
    WILDS_PREFIX,
    Record,
    check_metric,
    metric_heading,
    metric_value,
    no_value,
    read_records,
    row_labels,
    setting_of,
)
from dael_plugin.tools.unfinished import Placer, without_record

PAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paper_results.json")


class CollectError(ValueError):
    """Records that cannot share a table cell (one line naming them)."""


class Cell:
    def __init__(
        self, values: List[float], missing: int = 0, failed: int = 0, paper: Optional[Tuple] = None, corrupt: int = 0
    ):
        self.values, self.missing, self.failed, self.paper, self.corrupt = values, missing, failed, paper, corrupt

    @property
    def mean(self) -> Optional[float]:
        if self.paper is not None:
            return self.paper[0]
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> Optional[float]:
        if self.paper is not None:
            return self.paper[1]
        return (statistics.stdev(self.values) if len(self.values) > 1 else 0.0) if self.values else None

    @property
    def state(self) -> str:
        if self.paper is not None or self.values:
            return "paper" if self.paper is not None else "done"
        return "corrupt" if self.corrupt else ("failed" if self.failed else "missing")

    def text(self, usual_n: int) -> str:
        if self.paper is not None:
            return f"{self.mean:.2f}" + (f" ± {self.std:.2f}" if self.std is not None else "")
        if not self.values:
            return self.state
        out = f"{self.mean:.2f} ± {self.std:.2f}"
        if len(self.values) != usual_n:
            out += f" (n={len(self.values)})"
        not_done = self.failed + self.missing + self.corrupt
        if not_done:
            out += f" [{not_done} not done]"
        return out


_setting = setting_of  # DA or DG (engine/results_reader.py)


def read_runs(root: str, warn=print, metric: str = "accuracy"):
    """``{(dataset, setting): {row: {target: slot}}}`` from the records under ``root``, each value
    the record's ``metric``. A cell holds one setting: records of one row label with different
    settings become rows of their own, named by the keys that differ; two records of one seed in
    a cell are an error."""
    walk = read_records(root)
    for problem in walk.problems:
        warn(problem.warning())
    rows = row_labels(walk.records, root)
    data_seen: Dict[tuple, Record] = {}  # (table, target, seed) -> the first record with a fingerprint
    tables: Dict[Tuple[str, str], Dict[str, Dict[str, dict]]] = defaultdict(
        lambda: defaultdict(
            lambda: defaultdict(lambda: {"values": [], "failed": 0, "missing": 0, "corrupt": 0, "seeds": {}})
        )
    )
    for rec in walk.records:
        table, row = (rec.data.get("dataset"), _setting(rec.data)), rows[id(rec)]
        slot = tables[table][row][rec.target]
        seed = rec.data.get("seed")
        if seed in slot["seeds"]:
            raise CollectError(
                f"two records for {row} -> {rec.target} seed {seed}: "
                f"{slot['seeds'][seed]} and {rec.path}; keep one (move the other out of {root})"
            )
        slot["seeds"][seed] = rec.path
        value = metric_value(rec.data, metric)
        if value is None:  # (a null accuracy is the reader's problem, named above)
            raise CollectError(no_value(rec, metric))
        slot["values"].append(value)
        _same_data(slot, data_seen, table, rec, row)
    unrecorded = without_record(walk)  # (the finished runs' launch files are read only where there are some)
    placer = (
        Placer({r.dir: ((r.data.get("dataset"), _setting(r.data)), rows[id(r)]) for r in walk.records})
        if unrecorded
        else None
    )
    for path, kind in unrecorded:
        where = placer.place(path, root, tables, trainer_rows=False)
        if where is not None:
            table, row, target, _ = where
            tables[table][row][target][kind] += 1
    return tables


def _same_data(slot: dict, seen: Dict[tuple, Record], table: tuple, rec: Record, row: str) -> None:
    """Runs read the same images, or they share no cell and no table column: within a cell (other
    seeds) the fingerprints agree but for the domains a seed subsamples (Digit-5); runs of one
    seed and target (other rows, the same column) agree on every split and domain both read.
    Records without a fingerprint (older versions) are not compared."""
    fp = rec.data.get("data")
    if not isinstance(fp, dict):
        return
    fix = "every run of a table must read one copy of the data; rerun one of them on the other's"

    def say(other: Record, what: str) -> CollectError:
        return CollectError(
            f"{rec.path} and {other.path} read different images ({what}; data fingerprints "
            f"{one_digest(rec.data['data'])} and {one_digest(other.data['data'])}); {fix}"
        )

    first = slot.setdefault("data_first", rec)
    if first is not rec and one_digest(first.data["data"], seed_free=True) != one_digest(fp, seed_free=True):
        raise say(first, f"one cell, {row} -> {rec.target}")
    key = (table, rec.target, rec.data.get("seed"))
    other = seen.setdefault(key, rec)
    if other is not rec and one_digest(_shared(other.data["data"], fp)) != one_digest(_shared(fp, other.data["data"])):
        raise say(other, f"one column, {rec.target} seed {rec.data.get('seed')}")


def _shared(fp: dict, other: dict) -> dict:
    """``fp``'s entries of the splits and domains ``other`` holds too: runs of other rows in one
    column may read other sources (another row, results_reader.domains_read), each domain they
    both read the same images."""
    return {s: {d: v for d, v in doms.items() if d in other.get(s, {})} for s, doms in fp.items()}


def _metric_arg(metric: str) -> str:
    try:
        return check_metric(metric)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build(root: str, paper: bool, warn=print, metric: str = "accuracy"):
    raw = read_runs(root, warn, metric)
    with open(PAPER) as f:
        published = json.load(f) if paper else {"tables": []}
    out = []
    for key in sorted(raw):
        rows = raw[key]
        targets = sorted({t for r in rows.values() for t in r})
        cells = {
            row: {
                t: Cell(**{k: v for k, v in rows[row][t].items() if k not in ("seeds", "data_first")})
                if t in rows[row]
                else Cell([], missing=1)
                for t in targets
            }
            for row in sorted(rows)
        }
        counts = Counter(len(c.values) for r in cells.values() for c in r.values() if c.values)
        usual = counts.most_common(1)[0][0] if counts else 0
        cite = None
        if paper and not any(t["dataset"] == key[0] and t["setting"] == key[1] for t in published["tables"]):
            warn(
                f"--paper: the paper has no table for {key[0]} ({key[1]}); no paper rows there "
                f"(it has {sorted({t['dataset'] for t in published['tables']})})"
            )
        for tab in published["tables"]:
            if tab["dataset"] == key[0] and tab["setting"] == key[1]:
                cite = tab["cite"]
                for name, vals in tab["rows"].items():
                    cells[f"{name} (paper)"] = {
                        t: Cell([], paper=tuple(vals[t])) if t in vals else Cell([], missing=1) for t in targets
                    }
        out.append((key, targets, cells, usual, cite))
    return out


def _avg(row: Dict[str, Cell]) -> Optional[float]:
    means = [c.mean for c in row.values()]
    return None if any(m is None for m in means) or not means else statistics.fmean(means)


def render(tables, latex: bool = False, metric: str = "accuracy") -> Tuple[str, List[List[str]], str]:
    md, rows_csv, tex = [], [["dataset", "setting", "row", "target", "mean", "std", "n", "state"]], []
    for (dataset, setting), targets, cells, usual, cite in tables:
        seeds = (
            f"n={usual} seeds per cell, another n marked in its cell"
            if usual > 1
            else "n=1 seed per cell, so ± 0.00 is no estimate of the spread"
        )
        md.append(
            f"### {dataset} ({setting}), target test {metric_heading(metric)} (%), mean ± std over seeds ({seeds})"
            + (f"; paper rows: {cite}" if cite else "")
        )
        md.append("")
        md.append("| | " + " | ".join(targets) + " | Avg |")
        md.append("|---" * (len(targets) + 2) + "|")
        for name, row in cells.items():
            avg = _avg(row)
            md.append(
                f"| {name} | "
                + " | ".join(row[t].text(usual) for t in targets)
                + f" | {'—' if avg is None else f'{avg:.2f}'} |"
            )
            for t in targets:
                c = row[t]
                mean, std = ("" if v is None else f"{v:.4f}" for v in (c.mean, c.std))
                rows_csv.append([dataset, setting, name, t, mean, std, str(len(c.values)), c.state])
        md.append("")
        if latex:
            tex.append("\\begin{tabular}{l|" + "c" * len(targets) + "|c}\n\\toprule")
            tex.append(" & ".join(["Method"] + targets + ["Avg"]) + " \\\\\n\\midrule")
            for name, row in cells.items():
                avg = _avg(row)
                vals = [row[t].text(usual).replace("±", "$\\pm$") for t in targets]
                tex.append(" & ".join([name] + vals + ["--" if avg is None else f"{avg:.2f}"]) + " \\\\")
            tex.append("\\bottomrule\n\\end{tabular}\n")
    return "\n".join(md), rows_csv, "\n".join(tex)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="a sweep's --output-dir (or any folder holding results.json files)")
    p.add_argument("--latex", action="store_true", help="also print LaTeX tables")
    p.add_argument("--paper", action="store_true", help="add the paper's published numbers as rows")
    p.add_argument(
        "--select",
        metavar="PROTOCOL",
        help="choose each trainer's grid setting and epoch per seed from the runs' epochs.jsonl: last, source_val, "
        "oracle, leave_one_domain_out, or a validator (entropy, im, bnm, snd, classami, dev, devn, agreement, "
        "mask_rate); see docs/selection.md",
    )
    p.add_argument("--per-setting", action="store_true", help="with --select: a row per setting, the epoch chosen")
    p.add_argument(
        "--metric",
        type=_metric_arg,
        default="accuracy",
        help="what a cell holds: the target test accuracy; mean_class_accuracy, each class's accuracy averaged "
        "over the test classes (Dassl's perclass_accuracy, VisDA-2017's figure); macro_f1, each class's F1 so "
        "averaged (Dassl's macro_f1, WILDS's F1-macro, iWildCam's figure); wilds:<figure>, a figure of WILDS's "
        "own evaluation of a WILDS dataset (wilds:acc_worst_region, FMoW's), in percent",
    )
    p.add_argument("--validators", action="store_true", help="rank the validators against target test accuracy (DA)")
    args = p.parse_args(argv)
    args.dir = os.path.expanduser(args.dir)  # a quoted '~/x' means the home folder
    if not os.path.isdir(args.dir):
        print(f"error: {args.dir} is not a folder; pass a sweep's --output-dir", file=sys.stderr)
        return 2
    if args.select and args.validators:  # one would be silently ignored
        print(
            f"error: --validators ranks every validator over every checkpoint, --select {args.select} chooses "
            "models: pass one of the two",
            file=sys.stderr,
        )
        return 2
    if args.paper and args.metric != "accuracy":  # the published rows would sit under another metric
        print(f"error: --paper: the paper's numbers are accuracies; leave out --metric {args.metric}", file=sys.stderr)
        return 2
    if args.validators and args.metric != "accuracy":
        print("error: --validators ranks against the target test accuracy; leave out --metric", file=sys.stderr)
        return 2
    if args.metric.startswith(WILDS_PREFIX) and (args.select or args.validators):
        print(
            f"error: --metric {args.metric}: WILDS's figures are of the run's final test (results.json), not of each "
            "epoch's record, which --select and --validators read; collect without them",
            file=sys.stderr,
        )
        return 2
    if args.per_setting and not args.select:
        print("error: --per-setting goes with --select PROTOCOL", file=sys.stderr)
        return 2
    if args.select or args.validators:
        return _select_main(args)
    try:
        tables = build(args.dir, args.paper, warn=lambda line: print(line, file=sys.stderr), metric=args.metric)
    except CollectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not tables:
        print(f"error: no results.json under {args.dir}", file=sys.stderr)
        return 2
    md, rows, tex = render(tables, args.latex, args.metric)
    print(md)
    if args.latex:
        print(tex)
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    stem = "results" if args.metric == "accuracy" else f"results_{args.metric.replace(':', '_')}"
    write_text(os.path.join(args.dir, f"{stem}.md"), md + "\n")
    write_text(os.path.join(args.dir, f"{stem}.csv"), buf.getvalue())
    print(f"wrote {os.path.join(args.dir, stem + '.md')} and {stem}.csv")
    return 0


def _select_main(args) -> int:
    from dael_plugin.tools import select as sel

    warn = lambda line: print(line, file=sys.stderr)  # noqa: E731
    try:
        # The runs of a table read one copy of the data, as plain collect checks (a cell or a ranking
        # over runs of other images would be a number of no one data set): the same one-line refusal.
        read_runs(args.dir, warn=lambda line: None)  # its warnings come once, from the selection's walk
        if args.validators:
            ranked = sel.rank_validators(args.dir, warn)
            if not ranked:
                print(f"error: no DA run under {args.dir} has epoch records (SELECTION.EVAL_FREQ)", file=sys.stderr)
                return 2
            md, name = sel.render_ranking(ranked), "validators.md"
        else:
            tables = sel.select(args.dir, args.select, args.per_setting, warn, args.metric)
            if not tables:
                print(f"error: no results.json under {args.dir}", file=sys.stderr)
                return 2
            md = sel.render_selected(tables, args.select, args.metric)
            metric = "" if args.metric == "accuracy" else f"_{args.metric}"
            name = f"select_{args.select}{'_per_setting' if args.per_setting else ''}{metric}.md"
    except (sel.SelectError, CollectError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(md)
    write_text(os.path.join(args.dir, name), md + "\n")
    print(f"wrote {os.path.join(args.dir, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
