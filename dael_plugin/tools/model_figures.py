"""Figures that load a trained model: each expert's top-3 predictions (the paper's Fig. 7)
and the t-SNE of features, SourceOnly against DAEL (Fig. 8), from the runs' checkpoints
(:mod:`dael_plugin.tools.plots` draws the record-based figures and runs both)."""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

from dael_plugin.tools.plots_common import DESIGN_KEYS
from dael_plugin.tools.plots_common import design_value as _key
from dael_plugin.tools.plots_common import others_at_default as _others_default
from dael_plugin.tools.plots_common import save_figure as _save


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
        # "model" by module-prefixed name; the Dassl engine's DAEL before 2026-12-05: "models" by name
        model = state.get("model") or {f"{n}.{k}": v for n, m in state.get("models", {}).items() for k, v in m.items()}
        feats = {k[2:]: v for k, v in model.items() if k.startswith("F.")}
        head = {k[2:]: v for k, v in model.items() if k.startswith(("E.", "C."))}
        if state.get("engine") == "dassl" and any(k.startswith("backbone.") for k in feats):  # Dassl's SimpleNet
            if any(k.startswith("head.") for k in feats):  # the experts read head(backbone(x))
                raise ValueError("its F has Dassl's MODEL.HEAD, which the figures do not rebuild")
            feats = {k.split(".", 1)[1]: v for k, v in feats.items() if k.startswith("backbone.")}
        if state.get("engine") not in ("builtin", "dassl") or not feats or not head:
            raise ValueError("not a checkpoint of the built-in engine or of the plugin's DAEL on Dassl")
        # built as the run built it: a timm model for INPUT.SIZE (a ViT's position embedding)
        size = tuple(int(v) for v in cfg["INPUT"]["SIZE"])
        self.backbone = build_backbone(cfg["MODEL"]["BACKBONE"]["NAME"], img_size=size)
        self.backbone.load_state_dict(feats)
        if "weight" in head and head["weight"].dim() == 3:  # ExpertHeads: (K, C, D)
            k, c, d = head["weight"].shape
            self.head = ExpertHeads(d, c, k)
        else:  # SourceOnly's one linear classifier
            c, d = head["weight"].shape
            self.head = nn.Linear(d, c)
        self.head.load_state_dict(head)
        self.backbone.eval(), self.head.eval()
        self.classnames, self.test, self.source, self.target_train = self._data()
        self.algorithm = self._algorithm()

    def _algorithm(self):
        """DAEL's own prediction (core's ``DAEL``) over the rebuilt model, with the run's design and
        class table: under category shift (``CLASS_MASKS``) the experts and the ensemble are masked as
        the run's were; None for SourceOnly's one classifier. The table is each source's classes, from
        the items the run read."""
        import torch
        from yacs.config import CfgNode as CN

        from dael_plugin.config.keys import hparams_from_cfg
        from dael_plugin.core import DAEL, ExpertHeads
        from dael_plugin.data.classes import classes_by_domain

        if not isinstance(self.head, ExpertHeads):
            return None
        hp = hparams_from_cfg(CN(self.cfg))
        held = None
        if hp.reads_class_table:
            held = torch.tensor(
                classes_by_domain(self.source, len(self.cfg["DATASET"]["SOURCE_DOMAINS"]), len(self.classnames))
            )
        return DAEL(self.backbone, self.head, hp, class_mask=held)

    def _data(self):
        from dael_plugin.data.folders import dataset_options, load_splits

        ds = self.cfg["DATASET"]
        seed = max(int(self.cfg.get("SEED", 0)), 0)  # Digit-5's subsample, as the run drew it
        shift = bool(ds.get("CATEGORY_SHIFT", False))
        opts = dataset_options(ds)
        splits = load_splits(ds["NAME"], ds["ROOT"], ds["SOURCE_DOMAINS"], ds["TARGET_DOMAINS"], seed, shift, opts)
        return splits["classnames"], splits["test"], splits["train_x"], splits["train_u"]

    def _tensor(self, items):
        import torch
        from yacs.config import CfgNode as CN

        from dael_plugin.data.images import decode
        from dael_plugin.transforms.host import build_test_transform

        inp = self.cfg["INPUT"]
        tfm = build_test_transform(
            CN({"INPUT": CN({k: inp[k] for k in ("SIZE", "INTERPOLATION", "TRANSFORMS", "PIXEL_MEAN", "PIXEL_STD")})})
        )
        return torch.stack([tfm(decode(i.impath)) for i in items])

    def features_and_probs(self, items):
        """Features ``(N, D)`` and each expert's probabilities ``(N, K, C)``, as the run's records read them."""
        import torch

        with torch.no_grad():
            x = self._tensor(items)
            if self.algorithm is not None:
                return self.algorithm.features_and_experts(x)
            f = self.backbone(x)
            return f, torch.softmax(self.head(f), -1).unsqueeze(1)

    def ensemble(self, probs):
        """The run's prediction ``(N, C)`` from its experts' ``(N, K, C)``: the mean over the experts,
        or the per-class mean of those that know each class (``CLASS_MASKS`` part ``ensemble``)."""
        from dael_plugin.core.category_shift import class_ensemble

        return class_ensemble(probs, self.algorithm.ensemble_mask if self.algorithm is not None else None)


def _at_defaults(rec: dict) -> bool:
    return _others_default(rec, "")


def describe(rec: dict) -> str:
    """The run a figure draws, in its title: trainer, setting (the design keys away from the paper's
    defaults), target and seed."""
    from dael_plugin.core.hparams import DAELHparams

    defaults = DAELHparams()
    keys = []
    if str(rec.get("trainer", "")).upper() in ("DAEL", "DAELDG"):
        keys = [
            f"{k}={_key(rec, k)}"
            for k, attr in DESIGN_KEYS.items()
            if _key(rec, k) is not None and _key(rec, k) != str(getattr(defaults, attr))
        ]
    setting = ", ".join(keys) if keys else "defaults"
    return f"{rec.get('trainer')} ({setting}), target {','.join(rec.get('target_domains', []))}, seed {rec.get('seed')}"


TASK = ("dataset", "target", "sources", "backbone", "input size")


def _task(rec: dict) -> tuple:
    """What two runs drawn side by side share: the data, target, sources, backbone and input size."""
    from dael_plugin.engine.results_reader import Record

    cfg = Record(os.path.join(rec.get("_dir", ""), "results.json"), rec).config
    data, model = cfg.get("DATASET") or {}, (cfg.get("MODEL") or {}).get("BACKBONE") or {}
    sources = data.get("SOURCE_DOMAINS") or rec.get("source_domains") or []
    return (
        rec.get("dataset"),
        ",".join(rec.get("target_domains") or []),
        ",".join(sorted(map(str, sources))),
        model.get("NAME"),
        "x".join(map(str, (cfg.get("INPUT") or {}).get("SIZE") or [])),
    )


def _pick(recs, trainer: str, run_dir: Optional[str] = None, like: Optional[dict] = None):
    """The run a one-run figure draws: the one named with ``--run``, else the first (in path order)
    at the paper's defaults; with ``like``, one of its task (:func:`_task`), its seed first; (run or
    None, why not)."""
    if run_dir is not None:
        chosen = [
            r
            for r in recs
            if os.path.abspath(r["_dir"]) == os.path.abspath(run_dir)
            and str(r.get("trainer")).upper() == trainer.upper()
        ]
        if not chosen:
            return None, f"--run {run_dir} is not a {trainer} run with a results.json under the sweep folder"
    else:
        chosen = [
            r
            for r in recs
            if str(r.get("trainer")).upper() == trainer.upper()
            and (trainer.upper() not in ("DAEL", "DAELDG") or _at_defaults(r))
        ]
        if like is not None:  # Fig. 8 sets two runs' features side by side: runs of one task
            chosen = sorted(
                (r for r in chosen if _task(r) == _task(like)), key=lambda r: r.get("seed") != like.get("seed")
            )
            if not chosen:
                return None, (
                    f"needs a {trainer} run of the {str(like.get('trainer'))} run's dataset, target, sources, backbone "
                    f"and input size ({', '.join(f'{k}={v}' for k, v in zip(TASK, _task(like)))}) with its "
                    "checkpoint.pth.tar and data"
                )
    why = ""
    for r in chosen:
        if not (r.get("provenance") or {}).get("config"):
            continue
        try:
            return LoadedRun(r), None
        except Exception as exc:  # a run whose checkpoint or data is gone or foreign
            why = f" (last tried: {str(exc).splitlines()[0][:120]})"
    return (
        None,
        f"needs a {trainer} run{' at the defaults' if run_dir is None else ''} with its "
        f"checkpoint.pth.tar and data{why}",
    )


def _pick_items(items, n, seed=0):
    import random

    rng = random.Random(seed)
    return rng.sample(list(items), min(n, len(items)))


def top3(
    recs: List[dict], out: str, n_images: int = 4, run_dir: Optional[str] = None
) -> Tuple[Optional[List[str]], Optional[str]]:
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
        rows = [(f"E[{n}]", probs[:, k]) for k, n in enumerate(names[: probs.shape[1]])] + [
            ("ensemble", run.ensemble(probs))
        ]
    images = run._tensor(items)
    import torch

    mean = torch.tensor(run.cfg["INPUT"]["PIXEL_MEAN"]).view(3, 1, 1)
    std = torch.tensor(run.cfg["INPUT"]["PIXEL_STD"]).view(3, 1, 1)
    fig, axes = plt.subplots(
        len(rows) + 1, len(items), figsize=(2.3 * len(items), 1.2 * (len(rows) + 1) + 1.2), squeeze=False
    )
    for j, item in enumerate(items):
        ax = axes[0][j]
        ax.imshow((images[j] * std + mean).clamp(0, 1).permute(1, 2, 0).numpy())
        ax.set_title(f"true: {run.classnames[item.label]}", fontsize=8)
        ax.axis("off")
        for i, (who, p) in enumerate(rows, 1):
            top = p[j].topk(min(3, p.shape[-1]))
            ax = axes[i][j]
            labels = [run.classnames[c] for c in top.indices.tolist()]
            ax.barh(
                range(len(labels))[::-1],
                top.values.tolist(),
                color=["tab:green" if c == item.label else "tab:gray" for c in top.indices.tolist()],
            )
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


def tsne(
    recs: List[dict], out: str, per_domain: int = 150, run_dir: Optional[str] = None
) -> Tuple[Optional[List[str]], Optional[str]]:
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
    fig_c, axes_c = plt.subplots(1, 2, figsize=(10, 4.2), layout="constrained")
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
        ax_c.scatter(
            emb[:n, 0],
            emb[:n, 1],
            s=6,
            c=labels[:n],
            cmap=cmap,
            vmin=0,
            vmax=cmap.N - 1,
            alpha=0.6,
            marker="o",
            label="source (o)",
        )
        ax_c.scatter(
            emb[n:, 0],
            emb[n:, 1],
            s=12,
            c=labels[n:],
            cmap=cmap,
            vmin=0,
            vmax=cmap.N - 1,
            alpha=0.8,
            marker="x",
            label="target (x)",
        )
        for a in (ax, ax_c):
            a.set_title(describe(run.rec), fontsize=8)
            a.set_xlabel("t-SNE 1")
            a.set_ylabel("t-SNE 2")
            a.legend(markerscale=3, loc="upper right", fontsize=7)
    # The colour of each class, by its name, once for both panels (markers: o source, x target).
    from matplotlib.lines import Line2D

    present = sorted(set(labels))
    names = list(runs[1][1].classnames)
    handles = [
        Line2D(
            [], [], linestyle="", marker="o", markersize=5, color=cmap(c), label=names[c] if c < len(names) else str(c)
        )
        for c in present
    ]
    fig_c.legend(handles=handles, title="class", loc="outside right center", fontsize=7, title_fontsize=7)
    fig.suptitle("Source and target features (Fig. 8)")
    fig_c.suptitle("The same features coloured by class (one colour a class)")
    by_class = _save(fig_c, out, "tsne_class")
    return _save(fig, out, "tsne") + by_class, None
