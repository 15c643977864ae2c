"""A source model from a finished SourceOnly run of either engine (``MODEL.INIT_WEIGHTS``), for the
trainers that start from one (ADDA, AdaBN) or may (SourceOnly, DANN, SE: Dassl's ``SimpleNet``)."""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence

import torch
import yaml
from torch import nn

from dael_plugin.engine import checkpoint as ckpt
from dael_plugin.errors import DAELConfigError

INIT_WEIGHTS_FIX = "give the checkpoint of a finished SourceOnly run (either engine) with this backbone and dataset"


def source_record(path: str, state: dict) -> Optional[dict]:
    """What a source model trained on: ``{"dataset", "sources", "targets", "fingerprint"}``, from the
    built-in checkpoint's own config and data fingerprint, or from the ``results.json`` of the Dassl
    engine's run folder (``<run>/model/model.pth.tar-N``); None where neither says (Dassl's own
    ``tools/train.py`` writes no record)."""
    if isinstance(state.get("config"), str):
        try:
            cfg = yaml.safe_load(state["config"]) or {}
        except yaml.YAMLError:
            cfg = {}
        ds = cfg.get("DATASET", {}) if isinstance(cfg, dict) else {}
        if ds:
            return {
                "dataset": ds.get("NAME"),
                "sources": list(ds.get("SOURCE_DOMAINS") or ()),
                "targets": list(ds.get("TARGET_DOMAINS") or ()),
                "fingerprint": state.get("data_fingerprint"),
            }
    for up in (os.path.dirname(os.path.dirname(os.path.abspath(path))), os.path.dirname(os.path.abspath(path))):
        results = os.path.join(up, "results.json")
        try:
            with open(results) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and "source_domains" in rec:
            return {
                "dataset": rec.get("dataset"),
                "sources": list(rec.get("source_domains") or ()),
                "targets": list(rec.get("target_domains") or ()),
                "fingerprint": rec.get("data"),
            }
    return None


def check_source_record(
    path: str, record: Optional[dict], dataset: str, sources: Sequence[str], targets: Sequence[str], fingerprint
) -> None:
    """A source model must have trained on this run's sources alone, on the same images: one that
    saw a target domain's labels (a source model of another target) would score what looks like an
    adaptation result. One line each; a model without a record is said and left unchecked."""
    if record is None:
        print(
            f"Warning: MODEL.INIT_WEIGHTS {path} records no domains (Dassl's own tools/train.py writes none): "
            "that it never trained on this run's target is not checked"
        )
        return
    fix = "give the SourceOnly run of this target, seed and data (sweep.py --init-weights-from SWEEP_DIR picks it)"
    seen = [t for t in targets if t in record["sources"]]
    if seen:
        raise DAELConfigError(
            f"MODEL.INIT_WEIGHTS {path} trained on this run's target {seen[0]!r} as a source (its sources: "
            f"{record['sources']}): an adapted model would have seen the target's labels; {fix}"
        )
    if record.get("dataset") and str(record["dataset"]) != str(dataset):
        raise DAELConfigError(f"MODEL.INIT_WEIGHTS {path} trained on dataset {record['dataset']}, not {dataset}; {fix}")
    if sorted(record["sources"]) != sorted(sources):
        raise DAELConfigError(
            f"MODEL.INIT_WEIGHTS {path} trained on sources {record['sources']}, this run's are {list(sources)}; {fix}"
        )
    theirs = (record.get("fingerprint") or {}).get("train_x") or {}
    ours = (fingerprint or {}).get("train_x") or {}
    for domain in sources:
        a, b = theirs.get(domain), ours.get(domain)
        if isinstance(a, dict) and isinstance(b, dict) and a.get("sha256") != b.get("sha256"):
            raise DAELConfigError(
                f"MODEL.INIT_WEIGHTS {path} trained on other images of source {domain!r} ({a.get('images')} "
                f"against this run's {b.get('images')}; another root, copy or seed's subsample); {fix}"
            )


def load_source_model(path: str, model: nn.Module, classnames=None, run: Optional[dict] = None) -> None:
    """A source model into ``model``, whose weights are named as in Dassl's ``SimpleNet``
    (``backbone.*``, ``classifier.*``), from either engine's SourceOnly checkpoint: the built-in
    engine's (``model``: ``F.*``, ``C.*``) or Dassl's (``state_dict``, ``module.`` prefixes
    dropped). The one loader of ``MODEL.INIT_WEIGHTS`` on both engines.

    Stricter than Dassl's ``load_pretrained_weights``, which loads the keys that fit and warns
    about the rest (ADDA given a checkpoint of other names started from random weights, 11.25%
    against 35.0%, with a UserWarning alone): a file that does not fill the model key for key
    (another trainer's, backbone's or dataset's) is one line naming the first key that does not
    fit. ``classnames``: the run's, compared with the checkpoint's where it records them. ``run``
    (``dataset``, ``sources``, ``targets``, ``fingerprint``): the run's, compared with what the
    model trained on (:func:`check_source_record`)."""
    if not os.path.isfile(path):
        raise DAELConfigError(f"MODEL.INIT_WEIGHTS {path}: no such file; {INIT_WEIGHTS_FIX}")
    state = ckpt.load_checkpoint(path, fix=INIT_WEIGHTS_FIX)
    what = ""
    if isinstance(state.get("model"), dict):  # the built-in engine's checkpoint
        names = {"F.": "backbone.", "C.": "classifier."}
        weights = {names[k[:2]] + k[2:]: v for k, v in state["model"].items() if k[:2] in names}
        saved = state.get("classnames")
        if classnames is not None and isinstance(saved, (list, tuple)) and list(saved) != list(classnames):
            raise ckpt.CheckpointError(
                f"MODEL.INIT_WEIGHTS {path} was trained on other classes ({len(saved)}: {list(saved)[:4]}...) "
                f"than this run's ({len(classnames)}: {list(classnames)[:4]}...); {INIT_WEIGHTS_FIX}"
            )
        what = f" (a {state.get('trainer', 'built-in')} run, epoch {state.get('epoch', '?')})"
    elif isinstance(state.get("state_dict", state), dict):  # Dassl's (model/model.pth.tar-N), or bare weights
        weights = {k[7:] if k.startswith("module.") else k: v for k, v in state.get("state_dict", state).items()}
    else:
        raise ckpt.CheckpointError(f"MODEL.INIT_WEIGHTS {path} holds no model weights; {INIT_WEIGHTS_FIX}")
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    extra = sorted(set(weights) - set(own))
    wrong = [k for k in own if k in weights and _shape(weights[k]) != tuple(own[k].shape)]
    if missing or extra or wrong:
        misfit = (
            f"no {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "") if missing else
            f"{wrong[0]} is {_shape(weights[wrong[0]])}, this model's {tuple(own[wrong[0]].shape)}"
            if wrong else f"{len(extra)} keys this model lacks ({extra[0]}, ...)"
        )  # fmt: skip
        raise ckpt.CheckpointError(f"MODEL.INIT_WEIGHTS {path} does not fit this model ({misfit}); {INIT_WEIGHTS_FIX}")
    model.load_state_dict(weights)
    if run is not None:  # a source model, then: of this run's sources and images alone?
        check_source_record(path, source_record(path, state), **run)
    print(f"Loaded the source model from {path}{what}, every key (MODEL.INIT_WEIGHTS)")


def _shape(value) -> object:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
