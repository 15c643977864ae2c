"""Figures from a sweep's runs (matplotlib): the ones its results support.

    python scripts/plots.py SWEEP_DIR --out FIG_DIR

- ``loss_ablation``: target accuracy for ``TRAINER.DAEL.LOSSES`` ce -> ce_cr ->
  ce_cr_u (the paper's Fig. 4), mean and seed spread per target;
- ``weight_u``: target accuracy against lambda_u (``WEIGHT_U``, Fig. 5), mean
  ± std over seeds, one line per target;
- ``experts``: each expert's accuracy against the ensemble's (Fig. 6), from
  ``expert_accuracy`` in the records;
- ``curves``: the pseudo-label mask rate ``mask_u`` and the kept pseudo-labels'
  accuracy ``pl_acc_u`` over training, read from each run's TensorBoard events.

A figure whose runs are not in the sweep is skipped with one line saying what
it needs. Each is written as PNG and PDF. (Fig. 7's top-3 predictions and
Fig. 8's t-SNE need checkpoints and features: not made here yet.)
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
from collections import defaultdict
from typing import Dict, List, Optional

LOSS_ORDER = ("ce", "ce_cr", "ce_cr_u")
LOSS_LABELS = {"ce": "$L_{ce}$", "ce_cr": "$+L_{cr}$", "ce_cr_u": "$+L_u$"}


def _records(root: str) -> List[dict]:
    recs = []
    for path in sorted(glob.glob(os.path.join(root, "**", "results.json"), recursive=True)):
        with open(path) as f:
            rec = json.load(f)
        if rec.get("accuracy") is None:
            continue
        rec["_dir"] = os.path.dirname(path)
        recs.append(rec)
    return recs


def _key(rec: dict, key: str) -> Optional[str]:
    """A DAEL key's value in the run's merged config (``provenance.config``), else None."""
    import yaml

    text = (rec.get("provenance") or {}).get("config")
    if not text:
        return None
    node = yaml.safe_load(text).get("TRAINER", {}).get(str(rec.get("trainer", "")).upper(), {})
    value = node.get(key)
    return None if value is None else str(value)


def _save(fig, out: str, name: str) -> List[str]:
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, f"{name}.{ext}") for ext in ("png", "pdf")]
    for p in paths:
        fig.savefig(p, bbox_inches="tight", dpi=150)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return paths


def _by(recs, key) -> Dict[str, Dict[str, List[float]]]:
    """``{value of key: {target: [accuracies over seeds]}}`` for DAEL runs."""
    out: Dict[str, Dict[str, List[float]]] = defaultdict(lambda: defaultdict(list))
    for r in recs:
        if str(r.get("trainer")).upper() not in ("DAEL", "DAELDG"):
            continue
        v = _key(r, key)
        if v is not None:
            out[v][",".join(r["target_domains"])].append(float(r["accuracy"]))
    return out


def loss_ablation(recs, out: str):
    import matplotlib.pyplot as plt

    data = _by(recs, "LOSSES")
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


def weight_u(recs, out: str):
    import matplotlib.pyplot as plt

    data = _by(recs, "WEIGHT_U")
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


def experts(recs, out: str):
    import matplotlib.pyplot as plt

    rows = [r for r in recs if str(r.get("trainer")).upper() == "DAEL" and len(r.get("expert_accuracy") or {}) > 1
            and _key(r, "LOSSES") in (None, "ce_cr_u") and _key(r, "CLASSIFIER") in (None, "experts")]
    if not rows:
        return None, "experts needs DAEL runs (K experts, every loss term) with expert_accuracy in results.json"
    groups: Dict[str, List[dict]] = defaultdict(list)
    for r in rows:
        groups[",".join(r["target_domains"])].append(r)
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 3.2), squeeze=False)
    for ax, (target, rs) in zip(axes[0], sorted(groups.items())):
        names = list(rs[0]["expert_accuracy"])
        vals = [statistics.fmean(r["expert_accuracy"][n] for r in rs) for n in names]
        ens = statistics.fmean(r["accuracy"] for r in rs)
        ax.bar(range(len(names) + 1), vals + [ens], color=["tab:gray"] * len(names) + ["tab:red"])
        ax.set_xticks(range(len(names) + 1), [f"E[{n}]" for n in names] + ["ensemble"], rotation=30)
        ax.set_ylabel("target test accuracy (%)")
        ax.set_title(f"target {target} ({len(rs)} seeds)")
    fig.suptitle("Experts against their ensemble (Fig. 6)")
    return _save(fig, out, "experts"), None


def curves(recs, out: str):
    import matplotlib.pyplot as plt
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series = []
    for r in recs:
        if str(r.get("trainer")).upper() != "DAEL":
            continue
        tb = os.path.join(r["_dir"], "tensorboard")
        if not os.path.isdir(tb):
            continue
        acc = EventAccumulator(tb)
        acc.Reload()
        tags = acc.Tags().get("scalars", [])
        if "train/mask_u" in tags:
            label = f"{','.join(r['target_domains'])} seed {r.get('seed')}"
            pl = [(e.step, e.value) for e in acc.Scalars("train/pl_acc_u")] if "train/pl_acc_u" in tags else []
            series.append((label, [(e.step, e.value) for e in acc.Scalars("train/mask_u")], pl))
    if not series:
        return None, "curves needs DAEL (DA) runs with TensorBoard events holding train/mask_u"
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    for label, mask, pl in series:
        a1.plot([s for s, _ in mask], [100 * v for _, v in mask], label=label)
        if pl:
            a2.plot([s for s, _ in pl], [v for _, v in pl], label=label)
    a1.set_xlabel("training step")
    a1.set_ylabel("pseudo-labels kept (%)")
    a1.set_title("Mask rate (confidence >= CONF_THRE)")
    a2.set_xlabel("training step")
    a2.set_ylabel("accuracy of kept pseudo-labels (%)")
    a2.set_title("Pseudo-label accuracy")
    a1.legend(fontsize=7)
    return _save(fig, out, "curves"), None


FIGURES = {"loss_ablation": loss_ablation, "weight_u": weight_u, "experts": experts, "curves": curves}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir")
    p.add_argument("--out", required=True, help="folder for the PNG and PDF files")
    args = p.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        print("error: scripts/plots.py needs matplotlib: pip install matplotlib (or .[plots])", file=sys.stderr)
        return 2
    recs = _records(args.sweep_dir)
    if not recs:
        print(f"error: no results.json under {args.sweep_dir}", file=sys.stderr)
        return 2
    for name, fn in FIGURES.items():
        paths, why = fn(recs, args.out)
        print(f"{name}: " + (", ".join(paths) if paths else f"skipped ({why})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
