"""Per-epoch records for model selection, shared by both engines.

After every ``SELECTION.EVAL_FREQ`` epochs (and the last), a run appends one JSON object to
``OUTPUT_DIR/epochs.jsonl`` with what each selection protocol reads:

- ``source_val_accuracy`` (the mean over the sources) and ``source_val_accuracy_per_domain``: the
  ensemble on the source validation split (the dataset's own ``val`` of the sources, or a held-out
  part of each source's train split, :mod:`dael_plugin.data.holdout`); DomainBed's training-domain
  validation;
- ``validators`` (DA): unsupervised scores, higher is better (:mod:`dael_plugin.core.validators`),
  from the ensemble's probabilities and the backbone's features on a capped subsample of the
  target's train split. They never receive a target label;
- ``target_val_accuracy``: the same subsample's labels, read by the ``oracle`` alone (never the
  test split; in DA those images were trained on without labels, so the oracle is an upper bound);
  over the labeled ones (``target_val_size``), None where none is (STL-10's unlabeled images);
- ``val_accuracy`` (``val_size``): the ensemble on a dataset's own val split where it is not of
  the sources (WILDS's out-of-distribution val, whole; a semi-supervised set's held-out images),
  read by the ``val`` protocol, WILDS's model selection;
- ``target_test_accuracy``, ``target_test_mean_class_accuracy`` (the mean over the test classes of
  each one's accuracy, VisDA's figure), ``target_test_macro_f1`` (of each one's F1, iWildCam's) and
  ``target_test_accuracy_per_expert``: for reporting only.

Each protocol's current choice is kept as ``model-best-<protocol>.pth.tar`` (written atomically,
on the earliest epoch of the best score). A resumed run first drops the records of epochs it will
redo, so the file is exactly an uninterrupted run's. Rank 0 alone writes under torchrun; every
process evaluates its shard and the outputs are gathered over the host group.

Long because a record is written by both engines and read by select.py, collect and the validators:
its fields, the source validation split, the per-protocol best models and their checks are one
schema and stay in one place.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from dael_plugin.core import validators as V
from dael_plugin.data.images import LEFT_OUT, note_unreadable
from dael_plugin.data.items import named_domain
from dael_plugin.engine import distributed
from dael_plugin.engine.evaluate import macro_f1, mean_class_accuracy
from dael_plugin.engine.record_checks import is_number

EPOCHS = "epochs.jsonl"
VALIDATORS = V.NAMES
SCORED = V.SCORED_PROTOCOLS  # protocols with a per-epoch score in a record; "last" needs none
PROTOCOLS = ("last",) + SCORED


def best_name(protocol: str) -> str:
    return f"model-best-{protocol}.pth.tar"


EXPERT_SIGNALS = ("agreement", "mask_rate")  # DAEL's own: they read several experts


def classifiers(record: Dict[str, Any]) -> int:
    """How many classifiers the record's model has: written since 734f889; an older record
    with per-expert test accuracies had several."""
    k = record.get("classifiers")
    if isinstance(k, int) and not isinstance(k, bool):
        return k
    return 2 if record.get("target_test_accuracy_per_expert") else 1


ACCURACIES = ("target_test_accuracy", "source_val_accuracy", "target_val_accuracy")


def record_problem(rec: Any, previous_epoch: int) -> Optional[str]:
    """What is wrong with one line of ``epochs.jsonl`` (None when nothing): the checks that
    ``results.json`` gets, for each epoch. A validator may be NaN (a score that is undefined there:
    no protocol reads it); an accuracy may not."""
    if not isinstance(rec, dict):
        return "not an epoch record (a JSON object per line)"
    epoch = rec.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
        return f"epoch {epoch!r} is not a whole number of 1 or more"
    if epoch <= previous_epoch:
        return f"epoch {epoch} does not come after epoch {previous_epoch}"
    for key in ACCURACIES:
        v = rec.get(key)
        if v is not None and not (is_number(v) and 0.0 <= v <= 100.0):
            return f"epoch {epoch}: {key} {v!r} is not an accuracy in [0, 100]"
    validators = rec.get("validators")
    if validators is not None and not isinstance(validators, dict):
        return f"epoch {epoch}: validators is not a mapping"
    for k, v in (validators or {}).items():
        if v is not None and not is_number(v):
            return f"epoch {epoch}: validator {k} {v!r} is not a number"
    return None


def protocol_score(record: Dict[str, Any], protocol: str) -> Optional[float]:
    """The score ``protocol`` reads from one epoch's record (higher is better), or None."""
    if protocol == "source_val":
        value = record.get("source_val_accuracy")
    elif protocol == "oracle":
        value = record.get("target_val_accuracy")
    elif protocol == "val":
        value = record.get("val_accuracy")
    elif protocol == "last":
        value = record.get("epoch")
    elif protocol in EXPERT_SIGNALS and classifiers(record) == 1:
        return None  # one classifier: a constant (validator_scores no longer writes it)
    else:
        value = (record.get("validators") or {}).get(protocol)
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def same_on_every_rank(paths: Sequence[str], what: str) -> None:
    """Under torchrun, stop (one line) unless every process drew the same ``paths``: the held-out
    source split must be one split, or a rank would train on another rank's validation images."""
    if not distributed.world().distributed:
        return
    import hashlib

    digest = hashlib.sha256("\n".join(sorted(paths)).encode()).hexdigest()
    if len(set(distributed.gather_objects(digest))) != 1:
        from dael_plugin.errors import DAELConfigError

        raise DAELConfigError(
            f"the processes drew different {what}; every rank must read the same dataset (same --root and files)"
        )


AUTO_MAX_SOURCE_IMAGES = 30_000  # SELECTION.EVAL_FREQ -1 ("auto") writes records up to this many


def resolve_selection(sel: Any, n_source_train: int) -> Tuple[int, float, bool]:
    """``(eval_freq, holdout_fraction, auto)`` of the SELECTION node for a run with
    ``n_source_train`` source training images.

    - ``EVAL_FREQ -1`` (the default, "auto"): records every epoch on a small set (at most
      ``AUTO_MAX_SOURCE_IMAGES`` source training images: the embedded set, PACS, Office-Home, ...),
      none on a large one (Digit-5, DomainNet), where each evaluation costs more;
    - ``HOLDOUT_FRACTION -1`` (the default): 0.2 (DomainBed's) when ``EVAL_FREQ`` was set to 1 or
      more, which asks for selection; 0 under "auto", which keeps every source image for training
      (the paper's protocol), so the automatic records carry no source-validation accuracy unless
      the dataset has its own val split."""
    freq = int(sel.get("EVAL_FREQ", 0)) if sel is not None else 0
    frac = float(sel.get("HOLDOUT_FRACTION", 0.2)) if sel is not None else 0.2
    auto = freq < 0
    if auto:
        freq = 1 if n_source_train <= AUTO_MAX_SOURCE_IMAGES else 0
    if frac < 0:
        frac = 0.0 if auto else 0.2
    return freq, frac, auto


def split_sources(
    sel: Any, train: Sequence[Any], val: Sequence[Any], seed: int, sources: Sequence[str], root: str
) -> Tuple[List[Any], List[Any], Optional[Dict[str, Any]], int]:
    """The run's source validation split, shared by both engines: ``(train, held, info, eval_freq)``.
    With records on, the dataset's own ``val`` of the sources where it has one, else
    ``HOLDOUT_FRACTION`` of each source domain's ``train`` (stratified by class, from ``seed``,
    never trained on); ``info`` is what results.json records of it. Says in one line what it chose.
    Under torchrun the ranks compare their held-out images by path under ``root`` (DATASET.ROOT),
    so a node that mounts the same data at another path draws the same split."""
    from dael_plugin.data.fingerprint import relative_path
    from dael_plugin.data.holdout import holdout_split

    freq, fraction, auto = resolve_selection(sel, len(train))
    why = f"SELECTION.EVAL_FREQ {'-1 (auto: ' + format(len(train), ',') + ' source training images)' if auto else freq}"
    if freq <= 0:
        if auto and distributed.world().is_main:
            print(
                f"dael_plugin: no per-epoch records ({why}, over {AUTO_MAX_SOURCE_IMAGES:,}); set SELECTION.EVAL_FREQ N"
            )
        return list(train), [], None, 0
    if val:
        held, train, kind, fraction = list(val), list(train), "the dataset's val split of the sources", None
    else:
        train, held = holdout_split(train, fraction, seed)
        kind = (
            "held out of each source domain's train split (stratified by class)"
            if held
            else "none: every source training image is trained on (SELECTION.HOLDOUT_FRACTION 0)"
        )
        if held:
            top = os.path.abspath(os.path.expanduser(root or "."))
            same_on_every_rank([relative_path(it.impath, top) for it in held], "held-out source validation splits")
    per = {d: sum(1 for it in held if named_domain(it.domain, sources) == i) for i, d in enumerate(sources)}
    if fraction and not val:
        _check_every_domain_held(train, per, fraction, sources)
    info = {"kind": kind, "fraction": fraction, "seed": seed, "size": len(held), "per_domain": per}
    info.update(eval_freq=freq, auto=auto)
    if distributed.world().is_main:
        if held:
            said = f"source validation: {len(held)} images, {kind}"
        elif auto:
            said = (
                "no source validation split (every source image is trained on, as in the paper; "
                "for source_val selection set SELECTION.EVAL_FREQ 1, which holds out 20%)"
            )
        else:
            said = (
                "no source validation split (SELECTION.HOLDOUT_FRACTION 0: every source image is trained on, "
                "and source_val has no score; set it to 0.2 to hold out 20%)"
            )
        print(f"dael_plugin: records every {freq} epoch(s) in {EPOCHS} ({why}); {said}")
    return train, held, info, freq


def _check_every_domain_held(train: Sequence[Any], per: Dict[str, int], fraction: float, sources) -> None:
    """A fraction that rounds to no image in every class of a source domain (0.01 of 120-image
    domains; any fraction with one image per class) gives a split without that domain, and source
    validation then scores the others alone: one line, with the fraction that would hold one out."""
    empty = [d for d, n in per.items() if n == 0]
    if not empty:
        return
    from collections import Counter

    from dael_plugin.errors import DAELConfigError

    largest = {d: 0 for d in empty}
    sizes = Counter((named_domain(it.domain, sources), it.label) for it in train)  # nothing was held out of these
    for (domain, _), n in sizes.items():
        name = sources[domain]
        if name in largest:
            largest[name] = max(largest[name], n)
    d = empty[0]
    m = largest[d]
    fix = (
        f"a fraction of at least {0.5 / m:.3g} holds out one image of its largest class ({m} images)"
        if m >= 2
        else "its classes have one training image each, so none can be held out"
    )
    raise DAELConfigError(
        f"SELECTION.HOLDOUT_FRACTION {fraction:g} holds out no image of source domain(s) {empty} (it rounds to 0 "
        f"images per class there): {fix}; or set SELECTION.HOLDOUT_FRACTION 0 for no source validation split"
    )


def subsample(items: Sequence[Any], cap: int, seed: int) -> List[Any]:
    """At most ``cap`` of ``items`` (all where ``cap <= 0``), drawn once from ``seed``, in their order."""
    if cap <= 0 or len(items) <= cap:
        return list(items)
    keep = torch.randperm(len(items), generator=torch.Generator().manual_seed(int(seed) + 17))[:cap]
    return [items[i] for i in sorted(keep.tolist())]


def record_loaders(
    make_loader: Callable[[Sequence[Any]], Any],
    source_val: Optional[Sequence[Any]],
    train_x: Sequence[Any],
    train_u: Optional[Sequence[Any]],
    test_loader: Any,
    cap: int,
    seed: int,
    val: Optional[Sequence[Any]] = None,
) -> Dict[str, Any]:
    """The loaders a :class:`Selection` reads, the same on both engines (``make_loader`` builds an
    evaluation loader over items): the source validation split, the capped source-train and target
    subsamples, the test loader, and ``val``, a dataset's own val split of other images than the
    sources' (WILDS's out-of-distribution val, whole). DEV's source features are read only where
    DEV can be scored, with a source validation split."""
    return {
        "source_val": make_loader(source_val) if source_val else None,
        "source_train": make_loader(subsample(train_x, cap, seed)) if source_val else None,
        "target": make_loader(subsample(train_u, cap, seed)) if train_u else None,
        "test": test_loader,
        "val": make_loader(val) if val else None,
    }


@dataclass
class Outputs:
    """A split's features ``(N, D)``, experts' probabilities ``(N, K, C)``, labels and source
    domains ``(N,)``, on the device, over every process's shard."""

    feats: torch.Tensor
    probs: torch.Tensor
    labels: torch.Tensor
    domains: torch.Tensor
    class_mask: Optional[torch.Tensor] = None  # category shift: the per-class ensemble (core/category_shift.py)

    @property
    def ensemble(self) -> torch.Tensor:
        from dael_plugin.core.category_shift import class_ensemble

        return class_ensemble(self.probs, self.class_mask)


@torch.no_grad()
def collect(
    encode: Callable[[torch.Tensor], Tuple[torch.Tensor, torch.Tensor]],
    loader: Iterable[dict],
    device: torch.device,
    bad_images: Optional[set] = None,
    class_mask: Optional[torch.Tensor] = None,
) -> Optional[Outputs]:
    """``encode(x) -> (features, experts' probabilities)`` over ``loader`` (this process's shard),
    gathered over the processes; unreadable images left out. None when no image was readable."""
    parts: List[Tuple[torch.Tensor, ...]] = []
    for batch in loader:
        img, label, domain = batch["img"], batch["label"], batch.get("domain", torch.zeros_like(batch["label"]))
        if "valid" in batch:
            valid = batch["valid"]
            if bad_images is not None:
                note_unreadable(bad_images, batch["bad_path"], LEFT_OUT)
            img, label, domain = img[valid], label[valid], domain[valid]
        if label.numel() == 0:
            continue
        feats, probs = encode(img.to(device, non_blocking=True))
        parts.append((feats.float(), probs.float(), label.to(device), domain.to(device)))
    mine = [torch.cat(t) for t in zip(*parts)] if parts else None
    if distributed.world().distributed:
        everyone = distributed.gather_objects([t.cpu() for t in mine] if mine is not None else None)
        kept = [p for p in everyone if p is not None]
        mine = [torch.cat(t).to(device) for t in zip(*kept)] if kept else None
    return Outputs(*mine, class_mask=class_mask) if mine is not None else None


def _accuracy(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return 100.0 * (probs.argmax(-1) == labels).float().mean()


def validator_scores(
    target: Outputs,
    num_classes: int,
    conf_thre: float,
    seed: int,
    names: Sequence[str] = VALIDATORS,
    source_val: Optional[Outputs] = None,
    source_train: Optional[Outputs] = None,
) -> Dict[str, float]:
    """Every validator in ``names`` on the target's outputs. ``target.labels`` are never read (a
    test scrambles them); the source's labels are (DEV's losses, ClassAMI's source half)."""
    p = target.ensemble
    ratios = None
    out: Dict[str, torch.Tensor | float] = {}
    for name in names:
        if name == "entropy":
            out[name] = V.entropy_score(p)
        elif name == "im":
            out[name] = V.im_score(p)
        elif name == "bnm":
            out[name] = V.bnm_score(p)
        elif name == "snd":
            out[name] = V.snd_score(p)
        elif name in EXPERT_SIGNALS and target.probs.shape[1] == 1:
            # DAEL's own signals, over its experts: one classifier (SourceOnly, MME) agrees with
            # itself always (a constant 1) and has no L_u whose threshold the mask rate reads. Not
            # written, so no protocol "chooses" by a tie rule, and the ranking pools no constant.
            continue
        elif name == "agreement":
            out[name] = V.expert_agreement(target.probs)
        elif name == "mask_rate":
            out[name] = V.mask_rate(target.probs, conf_thre)
        elif name == "classami":
            pseudo = p.argmax(-1)
            src = (source_val.feats, source_val.labels) if source_val is not None else (None, None)
            out[name] = V.class_ami(target.feats, pseudo, num_classes, seed, *src)
        elif name in ("dev", "devn"):
            if source_val is None or source_train is None:
                continue  # DEV needs the source's validation split
            losses = -source_val.ensemble.gather(1, source_val.labels[:, None]).clamp_min(1e-12).log().squeeze(1)
            if ratios is None:  # one domain classifier for DEV and DEVN
                ratios, _ = V.density_ratios(source_train.feats, target.feats, source_val.feats)
            out[name] = V.dev_score(source_train.feats, target.feats, source_val.feats, losses, name == "devn", ratios)
        else:
            raise ValueError(f"unknown validator {name!r}; choose from {', '.join(VALIDATORS)}")
    values = [v for v in out.values() if isinstance(v, torch.Tensor)]
    read = torch.stack([v.float() for v in values]).tolist() if values else []  # one host read
    it = iter(read)
    return {k: round(float(next(it) if isinstance(v, torch.Tensor) else v), 6) for k, v in out.items()}


@dataclass(frozen=True)
class Scoring:
    """How an epoch is scored (:func:`epoch_record`): the sources' names (the experts' and the
    per-domain figures'), the classes, the pseudo-label threshold the validators use, the seed of
    their draws, which validators, and whether the run is DA (only then do they score the target)."""

    source_names: Sequence[str]
    num_classes: int
    conf_thre: float
    seed: int
    validators: Sequence[str] = VALIDATORS
    da: bool = True


def epoch_record(epoch: int, outs: Dict[str, Optional[Outputs]], scoring: Scoring) -> Dict[str, Any]:
    """One epoch's record (module docstring). ``epoch``: epochs done (1-based); ``outs``: the
    splits' outputs by :func:`record_loaders`' names (``test``, ``source_val``, ``target``,
    ``source_train``; a split that is absent or None is not scored)."""
    test, source_val, target = outs.get("test"), outs.get("source_val"), outs.get("target")
    source_names = scoring.source_names
    rec: Dict[str, Any] = {"epoch": int(epoch)}
    if source_val is not None:
        per = {}
        # (one named source: every item is of it, whatever its metadata domain, data/items.named_domain)
        domains = source_val.domains if len(source_names) > 1 else torch.zeros_like(source_val.domains)
        for d, name in enumerate(source_names):
            sel = domains == d
            if bool(sel.any()):
                per[name] = round(float(_accuracy(source_val.ensemble[sel], source_val.labels[sel])), 4)
        rec["source_val_accuracy"] = round(sum(per.values()) / len(per), 4) if per else None
        rec["source_val_accuracy_per_domain"] = per
        rec["source_val_size"] = int(source_val.labels.numel())
    if target is not None:
        rec["classifiers"] = int(target.probs.shape[1])
        if scoring.da:
            sc = scoring
            rec["validators"] = validator_scores(
                target, sc.num_classes, sc.conf_thre, sc.seed, sc.validators, source_val, outs.get("source_train")
            )
        known = target.labels >= 0  # STL-10's unlabeled images are labeled -1: no oracle figure from them
        n_known = int(known.sum())
        accuracy = _accuracy(target.ensemble[known], target.labels[known]) if n_known else None
        rec["target_val_accuracy"] = None if accuracy is None else round(float(accuracy), 4)
        rec["target_val_size"] = n_known
    val = outs.get("val")
    if val is not None:  # a dataset's own val of other images (WILDS's out-of-distribution val)
        rec["val_accuracy"] = round(float(_accuracy(val.ensemble, val.labels)), 4)
        rec["val_size"] = int(val.labels.numel())
    if test is not None:
        rec["target_test_accuracy"] = round(float(_accuracy(test.ensemble, test.labels)), 4)
        pred = test.ensemble.argmax(-1)
        rec["target_test_mean_class_accuracy"] = round(mean_class_accuracy(test.labels.cpu(), pred.cpu()), 4)
        rec["target_test_macro_f1"] = round(macro_f1(test.labels.cpu(), pred.cpu()), 4)
        if test.probs.shape[1] > 1:
            hits = (test.probs.argmax(-1) == test.labels[:, None]).float().mean(0) * 100.0
            rec["target_test_accuracy_per_expert"] = {
                n: round(float(v), 4) for n, v in zip(source_names, hits.tolist())
            }
        rec["target_test_size"] = int(test.labels.numel())
    return rec


CHOSEN_FIX = "restore it from a backup, or resume the run (its next choice rewrites it)"


def check_chosen_model(path: str, protocol: str, model_dir: str, seed: Any, data_fingerprint: Optional[dict]) -> None:
    """``--eval-only --select``: ``path`` (``model-best-<protocol>``) is the model this run's own
    records choose, or one line saying why not. Its epoch must be the protocol's choice over
    ``epochs.jsonl`` (the earliest best score, the writer's tie rule): a file written while the run
    stopped, before its record, or copied in from another run, holds another. Its seed and its data
    fingerprint must be this evaluation's. Loads to the CPU, ``weights_only``."""
    from dael_plugin.data.fingerprint import fingerprint_changes
    from dael_plugin.engine.checkpoint import CheckpointError, load_checkpoint, saved_seed

    state = load_checkpoint(path, fix=CHOSEN_FIX)
    epoch = state.get("epoch")
    records, problems = EpochsFile(model_dir).read_checked()
    if problems:
        raise CheckpointError(f"cannot check {path} against its run: {problems[0]}; restore epochs.jsonl")
    scored = [(s, r["epoch"]) for r in records for s in [protocol_score(r, protocol)] if s is not None]
    if not scored:
        raise CheckpointError(
            f"{path} holds epoch {epoch}, and {os.path.join(model_dir, EPOCHS)} has no {protocol} score for any "
            "epoch: the run stopped while keeping its first choice, or the file comes from another run; resume "
            "the run to finish it"
        )
    best = max(s for s, _ in scored)
    chosen = min(e for s, e in scored if s == best)
    if epoch != chosen:
        raise CheckpointError(
            f"{path} holds epoch {epoch}, but the run's records choose epoch {chosen} under {protocol}: the file "
            "comes from another run or from an epoch the run did not finish; resume the run (it rewrites the file)"
        )
    run_seed = saved_seed(state)
    if run_seed is not None and seed is not None and run_seed != int(seed):
        raise CheckpointError(
            f"{path} holds a run of seed {run_seed}; this evaluation is --seed {seed}: pass --seed {run_seed}"
        )
    saved = state.get("data_fingerprint")
    if isinstance(saved, dict) and isinstance(data_fingerprint, dict):
        changes = fingerprint_changes(saved, data_fingerprint)
        if changes:
            raise CheckpointError(
                f"{path} was trained on other images than this evaluation reads ({changes[0]}"
                f"{f'; {len(changes) - 1} more' if len(changes) > 1 else ''}); evaluate it on the data its run read"
            )


class EpochsFile:
    """``OUTPUT_DIR/epochs.jsonl``: read, cut back on resume, appended (each write replaces the file
    atomically), and the protocols' best checkpoints kept beside it."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, EPOCHS)

    def read(self) -> List[Dict[str, Any]]:
        """The records, skipping a line that is not an epoch record (named once)."""
        records, problems = self.read_checked()
        for problem in problems:
            print(f"warning: {problem}; skipped")
        return records

    def read_checked(self) -> Tuple[List[Dict[str, Any]], List[str]]:
        """The well-formed records, and one line for each problem (``file line N: what``): a line
        that is not a JSON object (binary included), an epoch that is not a whole number after the
        line before's, an accuracy outside [0, 100] or not a number, a validator score that is not a
        number. A path that exists but is no regular file (a FIFO) is a problem, never opened."""
        if not os.path.isfile(self.path):
            there = os.path.lexists(self.path)
            return [], ([f"{self.path} is not a regular file; move it away"] if there else [])
        out: List[Dict[str, Any]] = []
        problems: List[str] = []
        with open(self.path, "rb") as f:
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw.decode("utf-8"))
                except ValueError:  # UnicodeDecodeError included
                    rec = None
                what = record_problem(rec, out[-1]["epoch"] if out else 0)
                if what is not None:
                    problems.append(f"{self.path} line {n}: {what}")
                    continue
                out.append(rec)
        return out, problems

    def _write(self, records: List[Dict[str, Any]]) -> None:
        from dael_plugin.engine.atomic import write_text

        write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))

    def truncate(self, epochs_done: int) -> None:
        """Drop the records of epochs after ``epochs_done`` (a resume redoes them)."""
        if not distributed.world().is_main:
            return
        records = self.read()
        kept = [r for r in records if r["epoch"] <= epochs_done]
        if len(kept) != len(records) or (records and not os.path.isfile(self.path)):
            self._write(kept)

    def append(self, record: Dict[str, Any], save_best: Callable[[str], None], keep: Sequence[str]) -> List[str]:
        """Add ``record``; for each protocol in ``keep`` whose score beats every earlier epoch's,
        ``save_best(path)``. Returns the protocols whose choice moved to this epoch. Rank 0 only."""
        if not distributed.world().is_main:
            return []
        from dael_plugin.engine.atomic import link_or_copy

        earlier = [r for r in self.read() if r["epoch"] < record["epoch"]]
        moved = []
        for protocol in keep:
            score = protocol_score(record, protocol)
            if score is None:
                continue
            before = [s for s in (protocol_score(r, protocol) for r in earlier) if s is not None]
            if not before or score > max(before):
                path = os.path.join(self.output_dir, best_name(protocol))
                if moved:  # the same model: one write, hard links for the other protocols
                    link_or_copy(os.path.join(self.output_dir, best_name(moved[0])), path)
                else:
                    save_best(path)
                moved.append(protocol)
        self._write(earlier + [record])
        return moved


@dataclass(frozen=True)
class EvaluatedModel:
    """What the records read of a trainer: ``encode`` (images -> features and the experts'
    probabilities), the device, the loaders (:func:`record_loaders`, test-time transforms),
    ``set_eval`` (its modules in eval mode), ``save_best(path)`` (writes a protocol's chosen
    model), the images its loaders could not read, and the category-shift ensemble's class mask."""

    encode: Callable[[torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]
    device: torch.device
    loaders: Dict[str, Any]
    set_eval: Callable[[], None]
    save_best: Callable[[str], None]
    bad_images: Optional[set] = None
    class_mask: Optional[torch.Tensor] = None


class Selection:
    """What a trainer runs for the records: evaluates its model every ``eval_freq`` epochs, then
    writes the record and the best checkpoints of the protocols in ``keep``. The trainer calls
    :meth:`resume` once and :meth:`after_epoch` after each epoch, before its "last" checkpoint."""

    def __init__(
        self,
        output_dir: str,
        eval_freq: int,
        max_epoch: int,
        keep: Sequence[str],
        scoring: Scoring,
        model: EvaluatedModel,
    ) -> None:
        self.records = EpochsFile(output_dir)
        self.eval_freq, self.max_epoch = int(eval_freq), int(max_epoch)
        self.keep, self.scoring, self.model = list(keep), scoring, model

    @classmethod
    def from_cfg(
        cls, cfg: Any, eval_freq: int, num_classes: int, conf_thre: float, da: bool, model: EvaluatedModel
    ) -> "Selection":
        """Both engines' records, from the run's config (``SELECTION``, the sources, the seed)."""
        sel = cfg.SELECTION
        validators = [str(v).lower() for v in sel.VALIDATORS]
        seed = max(int(cfg.SEED), 0)
        scoring = Scoring(
            list(cfg.DATASET.SOURCE_DOMAINS), int(num_classes), float(conf_thre), seed, validators, bool(da)
        )
        return cls(cfg.OUTPUT_DIR, eval_freq, cfg.OPTIM.MAX_EPOCH, keep_list(sel.KEEP_BEST, da), scoring, model)

    def resume(self, epochs_done: int) -> None:
        self.records.truncate(epochs_done)

    def due(self, epochs_done: int) -> bool:
        return self.eval_freq > 0 and (epochs_done % self.eval_freq == 0 or epochs_done == self.max_epoch)

    def after_epoch(self, epochs_done: int) -> Optional[Dict[str, Any]]:
        if not self.due(epochs_done):
            return None
        import time

        start = time.perf_counter()
        m = self.model
        m.set_eval()
        cuda = [m.device] if m.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):  # evaluation draws nothing from the training streams
            outs = {
                k: (collect(m.encode, ld, m.device, m.bad_images, m.class_mask) if ld is not None else None)
                for k, ld in m.loaders.items()
            }
            forward = time.perf_counter() - start
            rec = epoch_record(epochs_done, outs, self.scoring)
        moved = self.records.append(rec, m.save_best, self.keep)
        if distributed.world().is_main:
            shown = {
                k: rec.get(k)
                for k in ("source_val_accuracy", "val_accuracy", "target_val_accuracy")
                if rec.get(k) is not None
            }
            scores = ", ".join(f"{k} {v:.2f}" for k, v in shown.items())
            print(
                f"epoch record {epochs_done}: "
                + (scores or "no source validation split or target data to score")
                + (f", validators {len(rec.get('validators', {}))}" if "validators" in rec else "")
                + (f"; best so far under {', '.join(moved)}" if moved else "")
                + f" ({EPOCHS}; {forward:.1f} s forward, {time.perf_counter() - start - forward:.1f} s scores)"
            )
        return rec


def keep_list(names: Sequence[str], da: bool) -> List[str]:
    """``SELECTION.KEEP_BEST`` resolved (checked in config/keys.py): ``all`` is every scored
    protocol of this setting."""
    names = [str(n).lower() for n in names]
    if "all" in names:
        return ["source_val", "oracle"] + (list(VALIDATORS) if da else []) + ["val"]
    return [n for n in names if da or n not in VALIDATORS]
