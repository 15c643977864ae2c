"""Tables from a sweep's ``results.json`` records (DomainBed's ``collect_results``, for Dassl runs).

    python scripts/collect.py DIR [--latex] [--paper]

One table per dataset and setting (DA/DG): a row per trainer and override
setting, a column per target domain plus the average, each cell the mean ±
std over seeds (``n=`` where a cell's seed count differs from the table's
usual count). A run without a record is marked (``failed`` with a
``failed.json``, else ``missing``), never dropped. The tables are printed and
written to ``DIR/results.md`` and ``DIR/results.csv``; ``--latex`` also
prints LaTeX. ``--paper`` adds the published numbers of the DAEL paper
(``dael_plugin/data/paper_results.json``, each with its table cited).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
from collections import Counter, defaultdict
from typing import Dict, List, Optional, Tuple

PAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "paper_results.json")
DG_TRAINERS = ("DAELDG", "Vanilla")


class Cell:
    def __init__(self, values: List[float], missing: int = 0, failed: int = 0, paper: Optional[Tuple] = None):
        self.values, self.missing, self.failed, self.paper = values, missing, failed, paper

    @property
    def mean(self) -> Optional[float]:
        if self.paper is not None:
            return self.paper[0]
        return statistics.fmean(self.values) if self.values else None

    def text(self, usual_n: int) -> str:
        if self.paper is not None:
            mean, std = self.paper
            return f"{mean:.2f}" + (f" ± {std:.2f}" if std is not None else "")
        if not self.values:
            return "failed" if self.failed else "missing"
        std = statistics.stdev(self.values) if len(self.values) > 1 else 0.0
        out = f"{self.mean:.2f} ± {std:.2f}"
        if len(self.values) != usual_n:
            out += f" (n={len(self.values)})"
        if self.failed or self.missing:
            out += f" [{self.failed + self.missing} not done]"
        return out


def _setting(rec: dict) -> str:
    return "DG" if rec.get("trainer") in DG_TRAINERS else rec.get("setting", "DA")


def _row_label(rec_dir: str, root: str, rec: dict) -> str:
    """``trainer[/override]`` from the sweep layout ``<dataset>/<trainer>[/<setting>]/<target>/seed<N>``."""
    rel = os.path.relpath(rec_dir, root).split(os.sep)
    if len(rel) >= 4 and rel[-1].startswith("seed") and rel[1] == rec.get("trainer"):
        return "/".join(rel[1:-2])
    return str(rec.get("trainer"))


def read_runs(root: str):
    """``{(dataset, setting): {row: {target: Cell}}}`` and the seed count seen per table."""
    tables: Dict[Tuple[str, str], Dict[str, Dict[str, list]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(
        lambda: {"values": [], "failed": 0, "missing": 0})))
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rec_path = os.path.join(dirpath, "results.json")
        if "results.json" in filenames:
            with open(rec_path) as f:
                rec = json.load(f)
            if rec.get("failed") or rec.get("accuracy") is None:
                continue
            key = (rec["dataset"], _setting(rec))
            target = ",".join(rec["target_domains"])
            tables[key][_row_label(dirpath, root, rec)][target]["values"].append(float(rec["accuracy"]))
        elif os.path.basename(dirpath).startswith("seed") and ("sweep_log.txt" in filenames or "failed.json" in filenames):
            # A sweep run without a record: find its table from the layout.
            rel = os.path.relpath(dirpath, root).split(os.sep)
            if len(rel) >= 4:
                dataset, trainer, target = rel[0], rel[1], rel[-2]
                key = (dataset, "DG" if trainer in DG_TRAINERS else "DA")
                slot = tables[key]["/".join(rel[1:-2])][target]
                slot["failed" if "failed.json" in filenames else "missing"] += 1
    return tables


def build(root: str, paper: bool):
    raw = read_runs(root)
    published = json.load(open(PAPER)) if paper else {"tables": []}
    out = []
    for key in sorted(raw):
        rows = raw[key]
        targets = sorted({t for r in rows.values() for t in r})
        cells = {row: {t: Cell(**rows[row][t]) if t in rows[row] else Cell([], missing=1) for t in targets}
                 for row in sorted(rows)}
        counts = Counter(len(c.values) for r in cells.values() for c in r.values() if c.values)
        usual = counts.most_common(1)[0][0] if counts else 0
        cite = None
        for tab in published["tables"]:
            if tab["dataset"] == key[0] and tab["setting"] == key[1]:
                cite = tab["cite"]
                for name, vals in tab["rows"].items():
                    cells[f"{name} (paper)"] = {t: Cell([], paper=tuple(vals[t])) if t in vals else Cell([], missing=1)
                                                for t in targets}
        out.append((key, targets, cells, usual, cite))
    return out


def _avg(row: Dict[str, Cell]) -> Optional[float]:
    means = [c.mean for c in row.values()]
    return None if any(m is None for m in means) or not means else statistics.fmean(means)


def render(tables, latex: bool = False) -> Tuple[str, List[List[str]], str]:
    md, rows_csv, tex = [], [["dataset", "setting", "row", "target", "mean", "std", "n", "state"]], []
    for (dataset, setting), targets, cells, usual, cite in tables:
        md.append(f"### {dataset} ({setting}), target test accuracy (%), mean ± std over seeds"
                  + (f"; paper rows: {cite}" if cite else ""))
        md.append("")
        md.append("| | " + " | ".join(targets) + " | Avg |")
        md.append("|---" * (len(targets) + 2) + "|")
        for name, row in cells.items():
            avg = _avg(row)
            md.append(f"| {name} | " + " | ".join(row[t].text(usual) for t in targets)
                      + f" | {'—' if avg is None else f'{avg:.2f}'} |")
            for t in targets:
                c = row[t]
                std = (c.paper[1] if c.paper else (statistics.stdev(c.values) if len(c.values) > 1 else 0.0)
                       if c.values or c.paper else None)
                state = "paper" if c.paper else ("done" if c.values else ("failed" if c.failed else "missing"))
                rows_csv.append([dataset, setting, name, t, "" if c.mean is None else f"{c.mean:.4f}",
                                 "" if std is None else f"{std:.4f}", str(len(c.values)), state])
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
    args = p.parse_args(argv)
    if not os.path.isdir(args.dir):
        print(f"error: {args.dir} is not a folder; pass a sweep's --output-dir", file=sys.stderr)
        return 2
    tables = build(args.dir, args.paper)
    if not tables:
        print(f"error: no results.json under {args.dir}", file=sys.stderr)
        return 2
    md, rows, tex = render(tables, args.latex)
    print(md)
    if args.latex:
        print(tex)
    with open(os.path.join(args.dir, "results.md"), "w") as f:
        f.write(md + "\n")
    with open(os.path.join(args.dir, "results.csv"), "w", newline="") as f:
        csv.writer(f).writerows(rows)
    print(f"wrote {os.path.join(args.dir, 'results.md')} and results.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
