"""A source model from a finished SourceOnly run of either engine (``MODEL.INIT_WEIGHTS``), for the
trainers that start from one (ADDA, AdaBN) or may (SourceOnly, DANN, SE: Dassl's ``SimpleNet``)."""

from __future__ import annotations

import os

from torch import nn

from dael_plugin.engine import checkpoint as ckpt
from dael_plugin.errors import DAELConfigError

INIT_WEIGHTS_FIX = "give the checkpoint of a finished SourceOnly run (either engine) with this backbone and dataset"


def load_source_model(path: str, backbone: nn.Module, classifier: nn.Module, classnames=None) -> None:
    """A source model into ``backbone`` and ``classifier``, from either engine's SourceOnly
    checkpoint: the built-in engine's (``model``: ``F.*``, ``C.*``) or Dassl's (``state_dict``:
    ``backbone.*``, ``classifier.*``, ``module.`` prefixes dropped).

    Stricter than Dassl's ``load_pretrained_weights``, which loads the keys that fit and warns
    about the rest: a file whose backbone or classifier does not fit key for key (another
    trainer's, backbone's or dataset's) would leave part of the model at its random start and
    train on as if it were the source model. Here it is one line naming the file."""
    if not os.path.isfile(path):
        raise DAELConfigError(f"MODEL.INIT_WEIGHTS {path}: no such file; {INIT_WEIGHTS_FIX}")
    state = ckpt.load_checkpoint(path, fix=INIT_WEIGHTS_FIX)
    what = ""
    if isinstance(state.get("model"), dict):  # the built-in engine's checkpoint
        weights, parts = state["model"], {"F.": backbone, "C.": classifier}
        saved = state.get("classnames")
        if classnames is not None and isinstance(saved, (list, tuple)) and list(saved) != list(classnames):
            raise ckpt.CheckpointError(
                f"MODEL.INIT_WEIGHTS {path} was trained on other classes ({len(saved)}: {list(saved)[:4]}...) "
                f"than this run's ({len(classnames)}: {list(classnames)[:4]}...); {INIT_WEIGHTS_FIX}"
            )
        what = f" (a {state.get('trainer', 'built-in')} run, epoch {state.get('epoch', '?')})"
    elif isinstance(state.get("state_dict"), dict):  # Dassl's (model/model.pth.tar-N)
        weights = {k[7:] if k.startswith("module.") else k: v for k, v in state["state_dict"].items()}
        parts = {"backbone.": backbone, "classifier.": classifier}
    else:
        raise ckpt.CheckpointError(f"MODEL.INIT_WEIGHTS {path} holds no model weights; {INIT_WEIGHTS_FIX}")
    for prefix, module in parts.items():
        sub = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
        own = module.state_dict()
        missing = sorted(set(own) - set(sub))
        wrong = [k for k in own if k in sub and tuple(sub[k].shape) != tuple(own[k].shape)]
        if missing or wrong or len(sub) != len(own):
            what = (
                f"no {prefix}{missing[0]}" if missing else
                f"{prefix}{wrong[0]} is {tuple(sub[wrong[0]].shape)}, this model's {tuple(own[wrong[0]].shape)}"
                if wrong else f"{len(sub) - len(own)} {prefix}* keys this model lacks"
            )  # fmt: skip
            raise ckpt.CheckpointError(
                f"MODEL.INIT_WEIGHTS {path} does not fit this model ({what}); {INIT_WEIGHTS_FIX}"
            )
        module.load_state_dict(sub)
    print(f"Loaded the source model from {path}{what} (MODEL.INIT_WEIGHTS)")
