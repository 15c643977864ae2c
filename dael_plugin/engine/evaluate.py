"""Evaluation shared by both engines: the loop over a test loader, the tallies, and their report.

Each engine keeps only its own summary line (the built-in engine's accuracy
and macro-F1; Dassl's evaluator on the Dassl engine). Unreadable images are
left out and named once; each expert's and the ensemble's hits are counted on
the device. Under several processes (:mod:`dael_plugin.engine.distributed`)
each process evaluates its shard and :meth:`ExpertTally.gathered` joins them,
so every figure is the whole test set's.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch
from tqdm import tqdm

from dael_plugin.data.images import LEFT_OUT, note_unreadable
from dael_plugin.engine import distributed


class ExpertTally:
    """Hits of the ensemble (mean of the experts' probabilities) and of each expert, on the device."""

    def __init__(self, class_mask: Optional[torch.Tensor] = None) -> None:
        self.class_mask = class_mask  # category shift: the per-class ensemble (core/category_shift.py)
        self.correct: Optional[torch.Tensor] = None
        self.total = 0
        self.y_true: List[torch.Tensor] = []
        self.y_pred: List[torch.Tensor] = []
        self.expert_pred: List[torch.Tensor] = []
        self.index: List[torch.Tensor] = []  # each prediction's item in the split (the loader's ``index``)

    def update(self, probs: torch.Tensor, labels: torch.Tensor, index: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``probs`` ``(B, K, C)``; returns the ensemble's ``(B, C)`` probabilities."""
        from dael_plugin.core.category_shift import class_ensemble

        ens = class_ensemble(probs, self.class_mask)
        hits = (probs.argmax(-1) == labels.unsqueeze(1)).sum(0)
        self.correct = hits if self.correct is None else self.correct + hits
        self.total += labels.shape[0]
        self.y_true.append(labels)
        self.y_pred.append(ens.argmax(-1))
        self.expert_pred.append(probs.argmax(-1))
        if index is not None:
            self.index.append(index.cpu())
        return ens

    def gathered(self) -> "ExpertTally":
        """The tally of every process's shard (itself when not distributed)."""
        if not distributed.world().distributed:
            return self
        mine = None
        if self.total:
            mine = (torch.cat(self.y_true).cpu(), torch.cat(self.y_pred).cpu(), torch.cat(self.expert_pred).cpu())
            mine += (torch.cat(self.index),) if len(self.index) == len(self.y_true) else (None,)
        parts: List[Optional[tuple]] = distributed.gather_objects(mine)  # the host group (gloo)
        out = ExpertTally()
        device = self.correct.device if self.correct is not None else torch.device("cpu")
        for part in parts:
            if part is None:
                continue
            yt, yp, ep = (t.to(device) for t in part[:3])
            hits = (ep == yt.unsqueeze(1)).sum(0)
            out.correct = hits if out.correct is None else out.correct + hits
            out.total += yt.shape[0]
            out.y_true.append(yt)
            out.y_pred.append(yp)
            out.expert_pred.append(ep)
            if part[3] is not None:
                out.index.append(part[3])
        return out

    def in_item_order(self, n: int) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """(true, predicted) on the CPU, one per item of an ``n``-item split in its order; None where
        an item has no prediction (an unreadable image left out) or the loader gave no indices."""
        if not self.index or len(self.index) != len(self.y_true):
            return None
        index = torch.cat(self.index).long()
        if index.numel() != n or not torch.equal(index.sort().values, torch.arange(n)):
            return None
        yt, yp = self.labels()
        order = index.argsort()
        return yt[order], yp[order]

    def expert_accuracy(self) -> List[float]:
        if self.correct is None or self.total == 0:
            return []
        return (100.0 * self.correct.float() / self.total).tolist()

    def labels(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(true, predicted) as CPU tensors."""
        return torch.cat(self.y_true).cpu(), torch.cat(self.y_pred).cpu()

    def per_class(self, classnames: Sequence[str], expert_names: Sequence[str] = ()) -> Dict[str, Dict[str, float]]:
        """``{"ensemble": {class: %}, <expert>: {class: %}}`` over the classes present. The classes
        are their labels where the dataset leaves one unnamed (Dassl's VLCS, CIFARSTL and DigitSingle
        name every class "") or names two alike, so that no two share an entry."""
        names = list(classnames)
        if not all(names) or len(set(names)) < len(names):
            names = [str(c) for c in range(len(names))]
        true = torch.cat(self.y_true).cpu()
        preds = {"ensemble": torch.cat(self.y_pred).cpu()}
        experts = torch.cat(self.expert_pred).cpu()
        if experts.shape[1] > 1:
            for k, name in enumerate(expert_names or [f"expert{i}" for i in range(experts.shape[1])]):
                preds[name] = experts[:, k]
        out: Dict[str, Dict[str, float]] = {}
        for who, pred in preds.items():
            out[who] = {}
            for c in true.unique().tolist():
                sel = true == c
                out[who][names[c] if c < len(names) else str(c)] = round(
                    100.0 * float((pred[sel] == c).float().mean()), 2
                )
        return out


def macro_f1(labels, predictions) -> float:
    """Dassl's ``macro_f1`` (its ``Classification`` evaluator: scikit-learn's
    ``f1_score(y_true, y_pred, average="macro", labels=np.unique(y_true))``), in percent, from the
    per-class counts: F1 = 2 tp / (2 tp + fp + fn) for each class the labels hold (never 0/0:
    each has tp + fn > 0), averaged over those classes. A prediction of a class the labels lack
    counts as a false positive of no averaged class, as in scikit-learn. Written here because
    ``sklearn.metrics`` costs every training process 2 s of CPU to import; a test holds it to
    scikit-learn's on random and hand-worked cases."""
    import numpy as np

    y, p = np.asarray(labels, dtype=np.int64).ravel(), np.asarray(predictions, dtype=np.int64).ravel()
    if y.size == 0:
        return 0.0
    n = int(max(y.max(), p.max())) + 1
    tp = np.bincount(y[y == p], minlength=n).astype(np.float64)
    fn = np.bincount(y, minlength=n) - tp
    fp = np.bincount(p, minlength=n) - tp
    present = np.unique(y)
    f1 = 2 * tp[present] / (2 * tp[present] + fp[present] + fn[present])
    return float(100.0 * f1.mean())


def mean_class_accuracy(labels, predictions) -> float:
    """The mean over the classes the labels hold of each class's accuracy, in percent: Dassl's
    ``perclass_accuracy`` (its ``Classification`` evaluator with ``TEST.PER_CLASS_RESULT``), the
    figure VisDA-2017 reports. A class without a test image counts for nothing (not as 0%)."""
    import numpy as np

    y, p = np.asarray(labels, dtype=np.int64).ravel(), np.asarray(predictions, dtype=np.int64).ravel()
    classes, inverse = np.unique(y, return_inverse=True)
    hits = np.bincount(inverse, weights=(y == p).astype(np.float64), minlength=len(classes))
    return float(np.mean(100.0 * hits / np.bincount(inverse, minlength=len(classes))))


def classification_results(
    labels, predictions, classnames: Sequence[str], per_class: bool = False
) -> Tuple[Dict[str, float], List[str]]:
    """Dassl's ``Classification`` evaluator without Dassl (dassl/evaluation/evaluator.py): its
    results (``accuracy``, ``error_rate``, ``macro_f1`` and, with ``TEST.PER_CLASS_RESULT``
    (``per_class``), ``perclass_accuracy``: the mean of the accuracies of the classes the labels
    hold, a class without a test image counting for nothing) and the lines it prints."""
    import numpy as np

    y, p = np.asarray(labels, dtype=np.int64).ravel(), np.asarray(predictions, dtype=np.int64).ravel()
    total, correct = len(y), int((y == p).sum())
    acc = 100.0 * correct / total
    results = {"accuracy": acc, "error_rate": 100.0 - acc, "macro_f1": macro_f1(y, p)}
    lines = [
        "=> result",
        f"* total: {total:,}",
        f"* correct: {correct:,}",
        f"* accuracy: {acc:.1f}%",
        f"* error: {100.0 - acc:.1f}%",
        f"* macro_f1: {results['macro_f1']:.1f}%",
    ]
    if per_class:
        lines.append("=> per-class result")
        accs = []
        for label in np.unique(y).tolist():
            hits = int((p[y == label] == label).sum())
            n = int((y == label).sum())
            accs.append(100.0 * hits / n)
            name = classnames[label] if label < len(classnames) else str(label)
            lines.append(f"* class: {label} ({name})\ttotal: {n:,}\tcorrect: {hits:,}\tacc: {accs[-1]:.1f}%")
        results["perclass_accuracy"] = mean_class_accuracy(y, p)
        lines.append(f"* average: {results['perclass_accuracy']:.1f}%")
    return results, lines


def save_confusion_matrix(labels, predictions, output_dir: str) -> str:
    """``TEST.COMPUTE_CMAT``: Dassl's ``cmat.pt``, scikit-learn's confusion matrix normalised over
    each true class (a NumPy array, as Dassl saves it), written whole or not at all."""
    import os

    from sklearn.metrics import confusion_matrix

    from dael_plugin.engine.atomic import save_torch

    path = os.path.join(output_dir, "cmat.pt")
    save_torch(path, confusion_matrix(labels, predictions, normalize="true"))
    return path


def evaluate_experts(
    predict_experts: Callable[[torch.Tensor], torch.Tensor],
    loader: Iterable[dict],
    device: torch.device,
    bad_images: Set[str],
    progress: bool = False,
    class_mask: Optional[torch.Tensor] = None,
) -> Tuple[ExpertTally, int]:
    """Every expert's predictions over ``loader``, gathered over the processes of a distributed run.

    Returns the tally and the number of unreadable images left out (named once in ``bad_images``)."""
    tally = ExpertTally(class_mask)
    skipped = 0
    for batch in tqdm(loader, leave=False, dynamic_ncols=True, disable=not progress):
        img, label, index = batch["img"], batch["label"], batch.get("index")
        if "valid" in batch:
            valid = batch["valid"]
            note_unreadable(bad_images, batch["bad_path"], LEFT_OUT)
            skipped += int((~valid).sum())
            img, label = img[valid], label[valid]
            index = index[valid] if index is not None else None
        if label.numel() == 0:
            continue
        y = label.to(device, non_blocking=True)
        tally.update(predict_experts(img.to(device, non_blocking=True)), y, index)
    skipped = _sum_over_processes(skipped)
    return tally.gathered(), skipped


def report_official(name: str, root: str, split: str, ordered) -> Optional[Dict[str, float]]:
    """A WILDS dataset's own evaluation of a test (data/wilds_formats.official_metrics; ``ordered``:
    the split's labels and predictions in item order, or None), printed as WILDS prints it; None
    for another dataset, or (said) where an item of the split went unscored."""
    from dael_plugin.data.wilds_formats import is_wilds, official_metrics

    if not is_wilds(name) or split not in ("test", "val"):
        return None
    out = official_metrics(name, root, split, *ordered) if ordered is not None else None
    if out is None:
        print(f"* WILDS's figures: not computed (an image of the {split} split has no prediction: left out unread)")
        return None
    print(f"* WILDS's figures: {out[1]}")
    return out[0]


def _sum_over_processes(n: int) -> int:
    return int(sum(distributed.gather_objects(n)))


def report_experts(
    tally: ExpertTally,
    classnames: Sequence[str],
    expert_names: Sequence[str],
    write: Callable[[str, float], None],
    split: str,
) -> Tuple[Dict[str, Dict[str, float]], List[float]]:
    """Print the per-class and per-expert lines and write their scalars; returns
    ``(per-class accuracy, expert accuracy)`` (the experts' line only where ``expert_names`` is given)."""
    per_class = tally.per_class(classnames, expert_names)
    print("* per-class accuracy: " + ", ".join(f"{c} {a:.1f}%" for c, a in per_class["ensemble"].items()))
    experts = tally.expert_accuracy() if expert_names else []
    if experts:
        print("* expert accuracy: " + ", ".join(f"{n} {a:.2f}%" for n, a in zip(expert_names, experts)))
    for c, a in per_class["ensemble"].items():
        write(f"{split}/class_{c}", a)
    for n, a in zip(expert_names, experts):
        write(f"{split}/expert_{n}", a)
    return per_class, experts
