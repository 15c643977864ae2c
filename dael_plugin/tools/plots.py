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

- ``top3``: each expert's and the ensemble's top-3 predictions on a few target
  test images (Fig. 7), from a DAEL run's checkpoint;
- ``tsne``: t-SNE (scikit-learn) of source and target test features,
  SourceOnly against DAEL (Fig. 8), from their checkpoints.

A figure whose runs are not in the sweep is skipped with one line saying what
it needs. Each is written as PNG and PDF. The last two read checkpoints of the
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

from dael_plugin.engine.atomic import write_bytes
from dael_plugin.engine.records import read_records

LOSS_ORDER = ("ce", "ce_cr", "ce_cr_u")
LOSS_LABELS = {"ce": "$L_{ce}$", "ce_cr": "$+L_{cr}$", "ce_cr_u": "$+L_u$"}


def _records(root: str, warn=print) -> List[dict]:
    """The run records under ``root`` (one reader with collect: :mod:`dael_plugin.engine.records`); a
    file that is not a record is skipped with a warning naming it."""
    walk = read_records(root)
    for problem in walk.problems:
        warn(problem.warning())
    return [dict(r.data, _dir=r.dir) for r in walk.records]


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
    import io

    paths = [os.path.join(out, f"{name}.{ext}") for ext in ("png", "pdf")]
    for p in paths:
        buf = io.BytesIO()
        fig.savefig(buf, bbox_inches="tight", dpi=150, format=p.rsplit(".", 1)[1])
        write_bytes(p, buf.getvalue())
    import matplotlib.pyplot as plt

    plt.close(fig)
    return paths


DESIGN_KEYS = {"LOSSES": "losses", "WEIGHT_U": "weight_u", "CR_MODE": "cr_mode", "CLASSIFIER": "classifier",
               "CR_TARGET": "cr_target", "PSEUDO_LABEL": "pseudo_label", "CR_LOSS": "cr_loss", "VIEWS": "views"}


def _others_default(rec: dict, key: str) -> bool:
    """Every design key but ``key`` at the paper's default (absent counts as default)."""
    from dael_plugin.core.hparams import DAELHparams

    d = DAELHparams()
    for k, attr in DESIGN_KEYS.items():
        if k == key:
            continue
        v = _key(rec, k)
        if v is not None and v != str(getattr(d, attr)):
            return False
    return True


def _by(recs, key) -> Dict[str, Dict[str, List[float]]]:
    """``{value of key: {target: [accuracies over seeds]}}`` for DAEL runs that vary
    ``key`` alone (every other design key at the paper's default)."""
    out: Dict[str, Dict[str, List[float]]] = defaultdict(lambda: defaultdict(list))
    for r in recs:
        if str(r.get("trainer")).upper() not in ("DAEL", "DAELDG") or not _others_default(r, key):
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
            and _others_default(r, "")]
    if not rows:
        return None, "experts needs DAEL runs (K experts, every loss term) with expert_accuracy in results.json"
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
        for x, m in enumerate(means):
            ax.annotate(f"{m:.1f}", (x, m), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=7)
        ax.set_xticks(range(len(names) + 1), [f"E[{n}]" for n in names] + ["ensemble"], rotation=30)
        ax.set_ylabel("target test accuracy (%)")
        ax.set_title(f"target {target} ({len(rs)} seeds)")
    fig.suptitle("Experts against their ensemble (Fig. 6): mean ± std over seeds")
    return _save(fig, out, "experts"), None


def curves(recs, out: str):
    """Mask rate and pseudo-label accuracy over training, for DAEL runs at the paper's
    defaults: per target, the mean over seeds and the seeds' range as a band."""
    import matplotlib.pyplot as plt
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    groups: Dict[str, List[Tuple[dict, dict]]] = defaultdict(list)  # target -> [(mask, pl)] of {step: value}
    for r in recs:
        if str(r.get("trainer")).upper() != "DAEL" or not _others_default(r, ""):
            continue
        tb = os.path.join(r["_dir"], "tensorboard")
        if not os.path.isdir(tb):
            continue
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
    for i, (target, runs) in enumerate(sorted(groups.items())):
        color = f"C{i}"
        label = f"{target} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
        for ax, which in ((a1, 0), (a2, 1)):
            series = [run[which] for run in runs if run[which]]
            if not series:
                continue
            steps = sorted(set.intersection(*(set(x) for x in series)))
            vals = [[x[t] for x in series] for t in steps]
            # Each target its own colour, line style and marker, so a line on top of another still shows.
            ax.plot(steps, [statistics.fmean(v) for v in vals], color=color, label=label, alpha=0.85,
                    linestyle=("-", "--", "-.", ":")[i % 4], marker="osD^v"[i % 5], markevery=max(1, len(steps) // 8),
                    markersize=4)
            if len(series) > 1:
                ax.fill_between(steps, [min(v) for v in vals], [max(v) for v in vals], color=color, alpha=0.2,
                                linewidth=0)
    a1.set_xlabel("training step")
    a1.set_ylabel("pseudo-labels kept (%)")
    a1.set_title("Mask rate (confidence >= CONF_THRE)")
    a2.set_xlabel("training step")
    a2.set_ylabel("accuracy of kept pseudo-labels (%)")
    a2.set_title("Pseudo-label accuracy")
    for ax in (a1, a2):
        ax.set_ylim(0, 100)  # percentages: nothing above 100
    a1.legend(title="target: mean, band = seed range", fontsize=8, title_fontsize=8)
    return _save(fig, out, "curves"), None


class LoadedRun:
    """A finished run's model and target test images, rebuilt from its checkpoint and merged config."""

    def __init__(self, rec: dict) -> None:
        import yaml
        from torch import nn

        from dael_plugin.backbones import build_backbone
        from dael_plugin.core import ExpertHeads
        from dael_plugin.engine import checkpoint as ckpt

        self.rec = rec
        cfg = yaml.safe_load(rec["provenance"]["config"])
        self.cfg = cfg
        state = ckpt.load_checkpoint(os.path.join(rec["_dir"], ckpt.LAST), map_location="cpu")
        if state.get("engine") == "builtin":
            model = state["model"]
            feats = {k[2:]: v for k, v in model.items() if k.startswith("F.")}
            head = {k[2:]: v for k, v in model.items() if k.startswith(("E.", "C."))}
        elif state.get("engine") == "dassl" and set(state.get("models", {})) == {"F", "E"}:
            feats = {k.split(".", 1)[1]: v for k, v in state["models"]["F"].items() if k.startswith("backbone.")}
            head = state["models"]["E"]
        else:
            raise ValueError("not a checkpoint of the built-in engine or of the plugin's DAEL on Dassl")
        self.backbone = build_backbone(cfg["MODEL"]["BACKBONE"]["NAME"])
        self.backbone.load_state_dict(feats)
        if "weight" in head and head["weight"].dim() == 3:  # ExpertHeads: (K, C, D)
            k, c, d = head["weight"].shape
            self.head = ExpertHeads(d, c, k)
        else:  # SourceOnly's one linear classifier
            c, d = head["weight"].shape
            self.head = nn.Linear(d, c)
        self.head.load_state_dict(head)
        self.backbone.eval(), self.head.eval()
        self.classnames, self.test, self.source = self._data()

    def _data(self):
        from dael_plugin.data.folders import load_splits

        ds = self.cfg["DATASET"]
        splits = load_splits(ds["NAME"], ds["ROOT"], ds["SOURCE_DOMAINS"], ds["TARGET_DOMAINS"])
        return splits["classnames"], splits["test"], splits["train_x"]

    def _tensor(self, items):
        import torch
        from yacs.config import CfgNode as CN

        from dael_plugin.data.images import decode
        from dael_plugin.transforms.host import build_test_transform

        inp = self.cfg["INPUT"]
        tfm = build_test_transform(CN({"INPUT": CN({k: inp[k] for k in ("SIZE", "INTERPOLATION", "TRANSFORMS",
                                                                           "PIXEL_MEAN", "PIXEL_STD")})}))
        return torch.stack([tfm(decode(i.impath)) for i in items])

    def features_and_probs(self, items):
        import torch

        with torch.no_grad():
            f = self.backbone(self._tensor(items))
            logits = self.head(f)
            probs = torch.softmax(logits, -1)
            return f, probs if probs.dim() == 3 else probs.unsqueeze(1)


def _at_defaults(rec: dict) -> bool:
    return _others_default(rec, "")


def describe(rec: dict) -> str:
    """The run a figure draws, in its title: trainer, setting (the design keys away from the paper's
    defaults), target and seed."""
    from dael_plugin.core.hparams import DAELHparams

    defaults = DAELHparams()
    keys = []
    if str(rec.get("trainer", "")).upper() in ("DAEL", "DAELDG"):
        keys = [f"{k}={_key(rec, k)}" for k, attr in DESIGN_KEYS.items()
                if _key(rec, k) is not None and _key(rec, k) != str(getattr(defaults, attr))]
    setting = ", ".join(keys) if keys else "defaults"
    return (f"{rec.get('trainer')} ({setting}), target {','.join(rec.get('target_domains', []))}, "
            f"seed {rec.get('seed')}")


def _pick(recs, trainer: str, run_dir: Optional[str] = None, like: Optional[dict] = None):
    """The run a one-run figure draws: the one named with ``--run``, else the first (in path order)
    at the paper's defaults, preferring the target and seed of ``like``; (run or None, why not)."""
    if run_dir is not None:
        chosen = [r for r in recs if os.path.abspath(r["_dir"]) == os.path.abspath(run_dir)
                  and str(r.get("trainer")).upper() == trainer.upper()]
        if not chosen:
            return None, f"--run {run_dir} is not a {trainer} run with a results.json under the sweep folder"
    else:
        chosen = [r for r in recs if str(r.get("trainer")).upper() == trainer.upper()
                  and (trainer.upper() not in ("DAEL", "DAELDG") or _at_defaults(r))]
        if like is not None:
            chosen.sort(key=lambda r: (r.get("target_domains") != like.get("target_domains"),
                                       r.get("seed") != like.get("seed")))
    why = ""
    for r in chosen:
        if not (r.get("provenance") or {}).get("config"):
            continue
        try:
            return LoadedRun(r), None
        except Exception as exc:  # a run whose checkpoint or data is gone or foreign
            why = f" (last tried: {str(exc).splitlines()[0][:120]})"
    return None, f"needs a {trainer} run{' at the defaults' if run_dir is None else ''} with its " \
                 f"checkpoint.pth.tar and data{why}"


def _pick_items(items, n, seed=0):
    import random

    rng = random.Random(seed)
    return rng.sample(list(items), min(n, len(items)))


def top3(recs, out: str, n_images: int = 4, run_dir: Optional[str] = None):
    import matplotlib.pyplot as plt

    run, why = _pick(recs, "DAEL", run_dir)
    if run is None:
        return None, f"top3 {why}"
    items = _pick_items(run.test, n_images)
    _, probs = run.features_and_probs(items)  # (N, K, C)
    if probs.shape[1] == 1:  # one shared classifier (Table 3b's ablation): nothing to compare
        rows = [("classifier", probs[:, 0])]
    else:
        names = list(run.rec.get("expert_accuracy") or {}) or [f"E{k}" for k in range(probs.shape[1])]
        rows = [(f"E[{n}]", probs[:, k]) for k, n in enumerate(names[: probs.shape[1]])] + [("ensemble", probs.mean(1))]
    images = run._tensor(items)
    import torch

    mean = torch.tensor(run.cfg["INPUT"]["PIXEL_MEAN"]).view(3, 1, 1)
    std = torch.tensor(run.cfg["INPUT"]["PIXEL_STD"]).view(3, 1, 1)
    fig, axes = plt.subplots(len(rows) + 1, len(items), figsize=(2.3 * len(items), 1.2 * (len(rows) + 1) + 1.2),
                             squeeze=False)
    for j, item in enumerate(items):
        ax = axes[0][j]
        ax.imshow((images[j] * std + mean).clamp(0, 1).permute(1, 2, 0).numpy())
        ax.set_title(f"true: {run.classnames[item.label]}", fontsize=8)
        ax.axis("off")
        for i, (who, p) in enumerate(rows, 1):
            top = p[j].topk(min(3, p.shape[-1]))
            ax = axes[i][j]
            labels = [run.classnames[c] for c in top.indices.tolist()]
            ax.barh(range(len(labels))[::-1], top.values.tolist(),
                    color=["tab:green" if c == item.label else "tab:gray" for c in top.indices.tolist()])
            ax.set_yticks(range(len(labels))[::-1], labels, fontsize=7)
            ax.set_xlim(0, 1)
            ax.tick_params(axis="x", labelsize=6)
            if j == 0:
                ax.set_ylabel(who, fontsize=8)
            if i == len(rows):
                ax.set_xlabel("probability", fontsize=7)
    fig.suptitle(f"Top-3 predictions (Fig. 7) of {describe(run.rec)}; green: true class", fontsize=9)
    fig.tight_layout()
    return _save(fig, out, "top3"), None


def tsne(recs, out: str, per_domain: int = 150, run_dir: Optional[str] = None):
    import matplotlib.pyplot as plt
    import torch
    from sklearn.manifold import TSNE

    dael, why = _pick(recs, "DAEL", run_dir)
    if dael is None:
        return None, f"tsne {why}"
    source_only, why = _pick(recs, "SourceOnly", like=dael.rec)  # the DAEL run's target and seed, if there
    if source_only is None:
        return None, f"tsne {why}"
    runs = [("SourceOnly", source_only), ("DAEL", dael)]
    # Two figures of the same embeddings: by domain (are source and target mixed?) and by class
    # (``tsne_class``: are the classes aligned across domains?).
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    fig_c, axes_c = plt.subplots(1, 2, figsize=(9, 4.2))
    for ax, ax_c, (_, run) in zip(axes, axes_c, runs):
        src = _pick_items(run.source, per_domain * len(run.cfg["DATASET"]["SOURCE_DOMAINS"]))
        tgt = _pick_items(run.test, per_domain)
        f_src, _ = run.features_and_probs(src)
        f_tgt, _ = run.features_and_probs(tgt)
        feats = torch.cat([f_src, f_tgt]).numpy()
        emb = TSNE(n_components=2, init="pca", random_state=0, perplexity=min(30, len(feats) - 1)).fit_transform(feats)
        n = len(src)
        ax.scatter(emb[:n, 0], emb[:n, 1], s=6, c="tab:blue", alpha=0.6, label="source")
        ax.scatter(emb[n:, 0], emb[n:, 1], s=6, c="tab:red", alpha=0.6, label="target")
        labels = [it.label for it in list(src) + list(tgt)]
        cmap = plt.get_cmap("tab10" if max(labels) < 10 else "tab20")
        ax_c.scatter(emb[:n, 0], emb[:n, 1], s=6, c=labels[:n], cmap=cmap, vmin=0, vmax=cmap.N - 1, alpha=0.6,
                     marker="o", label="source (o)")
        ax_c.scatter(emb[n:, 0], emb[n:, 1], s=12, c=labels[n:], cmap=cmap, vmin=0, vmax=cmap.N - 1, alpha=0.8,
                     marker="x", label="target (x)")
        for a in (ax, ax_c):
            a.set_title(describe(run.rec), fontsize=8)
            a.set_xlabel("t-SNE 1")
            a.set_ylabel("t-SNE 2")
            a.legend(markerscale=3)
    fig.suptitle("Source and target features (Fig. 8)")
    fig_c.suptitle("The same features coloured by class (one colour a class)")
    by_class = _save(fig_c, out, "tsne_class")
    return _save(fig, out, "tsne") + by_class, None


FIGURES = {"loss_ablation": loss_ablation, "weight_u": weight_u, "experts": experts, "curves": curves,
           "top3": top3, "tsne": tsne}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir")
    p.add_argument("--out", required=True, help="folder for the PNG and PDF files")
    p.add_argument("--run", default=None, metavar="DIR",
                   help="the DAEL run that Fig. 7 and Fig. 8 draw (default: the first at the paper's defaults)")
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
        print(f"error: no results.json under {args.sweep_dir}", file=sys.stderr)
        return 2
    for name, fn in FIGURES.items():
        if args.only and name not in args.only:
            continue
        paths, why = fn(recs, args.out, run_dir=args.run) if name in ("top3", "tsne") else fn(recs, args.out)
        print(f"{name}: " + (", ".join(paths) if paths else f"skipped ({why})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
