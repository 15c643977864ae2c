"""Figures from a sweep's runs (matplotlib): the ones its results support.

    python scripts/plots.py SWEEP_DIR --out FIG_DIR

- ``loss_ablation``: target accuracy for ``TRAINER.DAEL.LOSSES`` ce -> ce_cr ->
  ce_cr_u (the paper's Fig. 4), mean and seed spread per target;
- ``weight_u``: target accuracy against lambda_u (``WEIGHT_U``, Fig. 5), mean
  ± std over seeds, one line per target;
- ``experts``: each expert's accuracy against the ensemble's (Fig. 6), from
  ``expert_accuracy`` in the records;
- ``curves``: the pseudo-label mask rate ``mask_u`` and the kept pseudo-labels'
  accuracy ``pl_acc_u`` over training, read from each run's TensorBoard events;
- ``validators``: each unsupervised validator's weighted Spearman correlation with
  target test accuracy over every evaluated checkpoint (runs with ``epochs.jsonl``).

- ``top3``: each expert's and the ensemble's top-3 predictions on a few target
  test images (Fig. 7), from a DAEL run's checkpoint;
- ``tsne``: t-SNE (scikit-learn) of source and target test features,
  SourceOnly against DAEL (Fig. 8), from their checkpoints.

A figure whose runs are not in the sweep is skipped with one line saying what
it needs; so is one whose runs differ in a setting besides the one it varies
(epochs, rates, backbone, engine, data, sources), which it would average as
seeds. A rerun of one seed's run counts once. Each is written as PNG and PDF. The last two read checkpoints of the
built-in engine and of the plugin's DAEL trainer on Dassl (``checkpoint.pth.tar``),
with the dataset under the run's ``DATASET.ROOT``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

from dael_plugin.tools.model_figures import top3, tsne
from dael_plugin.tools.plots_common import DESIGN_KEYS  # noqa: F401  (the keys a figure varies)
from dael_plugin.tools.plots_common import design_value as _key
from dael_plugin.tools.plots_common import others_at_default as _others_default
from dael_plugin.tools.plots_common import records as _records
from dael_plugin.tools.plots_common import save_figure as _save
from dael_plugin.tools.plots_common import seeds_of_one_setting as _seeds

LOSS_ORDER = ("ce", "ce_cr", "ce_cr_u")
LOSS_LABELS = {"ce": "$L_{ce}$", "ce_cr": "$+L_{cr}$", "ce_cr_u": "$+L_u$"}


def _by(recs, key, figure: str) -> Tuple[Dict[str, Dict[str, List[float]]], Optional[str]]:
    """``{value of key: {target: [accuracies over seeds]}}`` for DAEL runs that vary ``key``
    alone (every other design key at the paper's default, every other setting the same), or
    ``{}`` and why not (plots_common.seeds_of_one_setting)."""
    out: Dict[str, Dict[str, List[float]]] = defaultdict(lambda: defaultdict(list))
    runs = [
        r
        for r in recs
        if str(r.get("trainer")).upper() in ("DAEL", "DAELDG") and _others_default(r, key) and _key(r, key) is not None
    ]
    runs, why = _seeds(runs, key, figure)
    for r in runs:
        out[_key(r, key)][",".join(r["target_domains"])].append(float(r["accuracy"]))
    return out, why


def loss_ablation(recs: List[dict], out: str) -> Tuple[Optional[List[str]], Optional[str]]:
    import matplotlib.pyplot as plt

    data, why = _by(recs, "LOSSES", "loss_ablation")
    if why:
        return None, why
    steps = [s for s in LOSS_ORDER if s in data]
    if len(steps) < 2:
        return None, "loss_ablation needs DAEL runs with at least two of TRAINER.DAEL.LOSSES ce, ce_cr, ce_cr_u"
    targets = sorted({t for s in steps for t in data[s]})
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(targets), 3.2))
    width = 0.8 / len(steps)
    for i, s in enumerate(steps):
        means = [statistics.fmean(data[s][t]) if data[s].get(t) else float("nan") for t in targets]
        stds = [statistics.stdev(data[s][t]) if len(data[s].get(t, [])) > 1 else 0.0 for t in targets]
        xs = [j + (i - (len(steps) - 1) / 2) * width for j in range(len(targets))]
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=LOSS_LABELS[s])
    ax.set_xticks(range(len(targets)), targets)
    ax.set_xlabel("target domain")
    ax.set_ylabel("target test accuracy (%)")
    ax.set_title("Loss ablation (Fig. 4): mean ± std over seeds")
    ax.legend()
    return _save(fig, out, "loss_ablation"), None


def weight_u(recs: List[dict], out: str) -> Tuple[Optional[List[str]], Optional[str]]:
    import matplotlib.pyplot as plt

    data, why = _by(recs, "WEIGHT_U", "weight_u")
    if why:
        return None, why
    if len(data) < 2:
        return None, "weight_u needs DAEL runs with at least two values of TRAINER.DAEL.WEIGHT_U"
    values = sorted(data, key=float)
    targets = sorted({t for v in values for t in data[v]})
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    for t in targets:
        xs = [float(v) for v in values if data[v].get(t)]
        means = [statistics.fmean(data[v][t]) for v in values if data[v].get(t)]
        stds = [statistics.stdev(data[v][t]) if len(data[v][t]) > 1 else 0.0 for v in values if data[v].get(t)]
        ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=t)
    ax.set_xlabel(r"$\lambda_u$ (TRAINER.DAEL.WEIGHT_U)")
    ax.set_ylabel("target test accuracy (%)")
    ax.set_title(r"Sensitivity to $\lambda_u$ (Fig. 5): mean ± std over seeds")
    ax.legend(title="target")
    return _save(fig, out, "weight_u"), None


def experts(recs: List[dict], out: str) -> Tuple[Optional[List[str]], Optional[str]]:
    import matplotlib.pyplot as plt

    rows = [
        r
        for r in recs
        if str(r.get("trainer")).upper() == "DAEL"
        and len(r.get("expert_accuracy") or {}) > 1
        and _others_default(r, "")
    ]
    if not rows:
        return None, "experts needs DAEL runs (K experts, every loss term) with expert_accuracy in results.json"
    rows, why = _seeds(rows, "", "experts")
    if why:
        return None, why
    groups: Dict[str, List[dict]] = defaultdict(list)
    for r in rows:
        groups[",".join(r["target_domains"])].append(r)
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 3.4), squeeze=False, layout="constrained")
    for ax, (target, rs) in zip(axes[0], sorted(groups.items())):
        names = list(rs[0]["expert_accuracy"])
        cols = [[r["expert_accuracy"][n] for r in rs] for n in names] + [[r["accuracy"] for r in rs]]
        means = [statistics.fmean(c) for c in cols]
        stds = [statistics.stdev(c) if len(c) > 1 else 0.0 for c in cols]
        ax.bar(range(len(names) + 1), means, yerr=stds, capsize=3, color=["tab:gray"] * len(names) + ["tab:red"])
        # Fig. 6 is about differences of a point or two: the axis spans the bars, not 0-100.
        low, high = min(m - d for m, d in zip(means, stds)), max(m + d for m, d in zip(means, stds))
        pad = max(1.0, 0.15 * (high - low))
        ax.set_ylim(max(0.0, low - 2 * pad), min(100.0, high + pad))
        for x, m in enumerate(means):  # inside the bar's foot, clear of the error bar
            ax.annotate(
                f"{m:.1f}",
                (x, ax.get_ylim()[0]),
                textcoords="offset points",
                xytext=(0, 3),
                ha="center",
                fontsize=7,
                color="white",
            )
        ax.set_xticks(range(len(names) + 1), [f"E[{n}]" for n in names] + ["ensemble"], rotation=30)
        ax.set_ylabel("target test accuracy (%)")
        ax.set_title(f"target {target} ({len(rs)} seed{'s' if len(rs) != 1 else ''})")
    one = all(len(rs) == 1 for rs in groups.values())
    fig.suptitle(
        "Experts against their ensemble (Fig. 6): "
        + ("one seed, so no spread is shown" if one else "mean ± std over seeds")
    )
    return _save(fig, out, "experts"), None


def curves(recs: List[dict], out: str) -> Tuple[Optional[List[str]], Optional[str]]:
    """Mask rate and pseudo-label accuracy over training, for DAEL runs at the paper's
    defaults: per target, the mean over seeds and the seeds' range as a band."""
    import matplotlib.pyplot as plt
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    groups: Dict[str, List[Tuple[dict, dict]]] = defaultdict(list)  # target -> [(mask, pl)] of {step: value}
    runs = [
        r
        for r in recs
        if str(r.get("trainer")).upper() == "DAEL"
        and _others_default(r, "")
        and os.path.isdir(os.path.join(r["_dir"], "tensorboard"))
    ]
    runs, why = _seeds(runs, "", "curves")
    if why:
        return None, why
    for r in runs:
        tb = os.path.join(r["_dir"], "tensorboard")
        acc = EventAccumulator(tb)
        acc.Reload()
        tags = acc.Tags().get("scalars", [])
        if "train/mask_u" in tags:
            mask = {e.step: 100 * e.value for e in acc.Scalars("train/mask_u")}
            pl = {e.step: e.value for e in acc.Scalars("train/pl_acc_u")} if "train/pl_acc_u" in tags else {}
            groups[",".join(r["target_domains"])].append((mask, pl))
    if not groups:
        return None, "curves needs DAEL (DA) runs at the default settings with TensorBoard events holding train/mask_u"
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4), layout="constrained")
    pl_low = 100.0
    drawn = {0: False, 1: False}
    for i, (target, runs) in enumerate(sorted(groups.items())):
        color = f"C{i}"
        label = f"{target} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
        for ax, which in ((a1, 0), (a2, 1)):
            series = [run[which] for run in runs if run[which]]
            if not series:
                continue
            drawn[which] = True
            steps = sorted(set.intersection(*(set(x) for x in series)))
            vals = [[x[t] for x in series] for t in steps]
            # Each target its own colour, line style and marker, so a line on top of another still shows.
            ax.plot(
                steps,
                [statistics.fmean(v) for v in vals],
                color=color,
                label=label,
                alpha=0.85,
                linestyle=("-", "--", "-.", ":")[i % 4],
                marker="osD^v"[i % 5],
                markevery=max(1, len(steps) // 8),
                markersize=4,
            )
            if which == 1:
                pl_low = min([pl_low] + [min(v) for v in vals])
            if len(series) > 1:
                ax.fill_between(
                    steps, [min(v) for v in vals], [max(v) for v in vals], color=color, alpha=0.2, linewidth=0
                )
    a1.set_xlabel("training step")
    a1.set_ylabel("pseudo-labels kept (%)")
    a1.set_title("Mask rate (confidence >= CONF_THRE)")
    a2.set_xlabel("training step")
    a2.set_ylabel("accuracy of kept pseudo-labels (%)")
    a2.set_title("Pseudo-label accuracy")
    # Percentages: nothing above 100. The mask rate rises from 0; the accuracy of the kept
    # pseudo-labels spans a few points near the top, so its axis starts under its lowest value.
    a1.set_ylim(0, 100)
    a2.set_ylim(max(0.0, 10 * (pl_low // 10) - 5), 100)
    a1.legend(title="target: mean, band = seed range", fontsize=8, title_fontsize=8)
    if not drawn[1]:  # no step kept a pseudo-label: say so, rather than an empty axis at -0.04..0.04
        a2.set_xlim(a1.get_xlim())
        a2.text(
            0.5,
            0.5,
            "no pseudo-label was kept in these runs\n(no target prediction reached CONF_THRE);\n"
            "their accuracy needs longer training",
            ha="center",
            va="center",
            transform=a2.transAxes,
            fontsize=9,
        )
    return _save(fig, out, "curves"), None


def validators(recs: List[dict], out: str) -> Tuple[Optional[List[str]], Optional[str]]:
    """Each validator's weighted Spearman correlation with target test accuracy over every evaluated
    checkpoint, per DA target (``collect.py --validators`` gives the numbers and the regrets)."""
    import matplotlib.pyplot as plt

    from dael_plugin.engine.results_reader import setting_of as _setting
    from dael_plugin.engine.selection import EpochsFile
    from dael_plugin.tools.select import rank_runs

    runs = [
        (
            str(r.get("dataset")),
            _setting(r),
            ",".join(r.get("target_domains") or []),
            r.get("seed"),
            EpochsFile(r["_dir"]).read(),
        )
        for r in recs
    ]
    ranked = [(key, rows) for key, rows in rank_runs(runs) if rows]
    if not ranked:
        return None, "validators needs DA runs with epoch records (SELECTION.EVAL_FREQ > 0)"
    names = sorted({row["validator"] for _, rows in ranked for row in rows})
    fig, ax = plt.subplots(figsize=(6.0, 0.35 * len(names) + 1.5))
    height = 0.8 / len(ranked)
    for i, ((_, _, target), rows) in enumerate(ranked):
        by = {row["validator"]: row["weighted_spearman"] for row in rows}
        ax.barh([j + i * height for j in range(len(names))], [by.get(n, 0.0) for n in names], height, label=target)
    ax.set_yticks([j + height * (len(ranked) - 1) / 2 for j in range(len(names))], names)
    ax.axvline(0.0, color="k", lw=0.8)
    ax.set_xlim(-1, 1)
    ax.set_xlabel("weighted Spearman with target test accuracy (Musgrave et al.)")
    ax.set_title("Validators over every evaluated checkpoint")
    ax.legend(title="target", fontsize=8)
    return _save(fig, out, "validators"), None


FIGURES = {
    "loss_ablation": loss_ablation,
    "weight_u": weight_u,
    "experts": experts,
    "curves": curves,
    "validators": validators,
    "top3": top3,
    "tsne": tsne,
}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir")
    p.add_argument("--out", required=True, help="folder for the PNG and PDF files")
    p.add_argument(
        "--run",
        default=None,
        metavar="DIR",
        help="the DAEL run that Fig. 7 and Fig. 8 draw (default: the first at the paper's defaults)",
    )
    p.add_argument("--only", nargs="+", choices=sorted(FIGURES), default=None, help="draw only these figures")
    args = p.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        print("error: scripts/plots.py needs matplotlib: pip install matplotlib (or .[plots])", file=sys.stderr)
        return 2
    recs = _records(args.sweep_dir, warn=lambda line: print(line, file=sys.stderr))
    if not recs:
        print(f"error: no readable results.json under {args.sweep_dir}", file=sys.stderr)
        return 2
    for name, fn in FIGURES.items():
        if args.only and name not in args.only:
            continue
        paths, why = fn(recs, args.out, run_dir=args.run) if name in ("top3", "tsne") else fn(recs, args.out)
        print(f"{name}: " + (", ".join(paths) if paths else f"skipped ({why})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
