"""Dassl's own checkpoint functions made safe, for every trainer Dassl runs (its baselines too):
loads go through the plugin's ``weights_only=True`` loader whatever the installed torch, and saves
are atomic. :func:`make_dassl_checkpoints_safe` swaps them in at registration."""

from __future__ import annotations

import os.path as osp
from collections import OrderedDict

from dael_plugin.engine import checkpoint as ckpt
from dael_plugin.engine.atomic import save_torch, write_text


def make_dassl_checkpoints_safe() -> None:
    """Dassl's own checkpoint functions, for every trainer it runs (its baselines too), made
    safe: loads always ``weights_only=True`` through the plugin's loader, whatever the installed
    torch (Dassl calls plain ``torch.load``, which runs pickled code before torch 2.6), and saves
    atomic through :mod:`dael_plugin.engine.atomic`. Same arguments, same files."""
    import dassl.engine.trainer as dassl_trainer
    import dassl.utils as dassl_utils
    import dassl.utils.torchtools as torchtools

    for module in (torchtools, dassl_trainer, dassl_utils):
        module.load_checkpoint = load_dassl_checkpoint
        module.save_checkpoint = save_dassl_checkpoint
    # MODEL.INIT_WEIGHTS of Dassl's SimpleNet trainers (SourceOnly, ADDA, AdaBN, DANN, SE): whole or refused
    dassl_trainer.load_pretrained_weights = load_init_weights


# The run whose MODEL.INIT_WEIGHTS Dassl's trainer loads (set by run_dassl: dataset and domains).
INIT_WEIGHTS_RUN: dict = {}


def load_init_weights(model, weight_path: str) -> None:
    """Dassl's ``load_pretrained_weights`` for ``MODEL.INIT_WEIGHTS``: the built-in engine's loader
    (``engine/source_model.load_source_model``, strict, either engine's checkpoint), the model's
    record compared with the run's (not its target)."""
    from dael_plugin.engine.source_model import load_source_model

    load_source_model(weight_path, model, run=INIT_WEIGHTS_RUN or None)


def load_dassl_checkpoint(fpath: str) -> dict:
    """Dassl's ``load_checkpoint``, weights-only (one line naming the file when refused)."""
    if fpath is None:
        raise ValueError("File path is None")
    state = ckpt.load_checkpoint(fpath)
    if isinstance(state.get("scheduler"), dict):
        state["scheduler"] = ckpt.restore_counters(state["scheduler"])
    return state


def save_dassl_checkpoint(
    state: dict, save_dir: str, is_best: bool = False, remove_module_from_keys: bool = True, model_name: str = ""
) -> None:
    """Dassl's ``save_checkpoint``: ``model.pth.tar-N`` (or ``model_name``), the ``checkpoint``
    marker and ``model-best.pth.tar``, each written atomically."""
    if remove_module_from_keys:
        state["state_dict"] = OrderedDict(
            (k[7:] if k.startswith("module.") else k, v) for k, v in state["state_dict"].items()
        )
    if isinstance(state.get("scheduler"), dict):
        state["scheduler"] = ckpt.counters_to_dicts(state["scheduler"])
    fpath = osp.join(save_dir, model_name or f"model.pth.tar-{state['epoch']}")
    save_torch(fpath, state)
    print(f"Checkpoint saved to {fpath}")
    write_text(osp.join(save_dir, "checkpoint"), f"{osp.basename(fpath)}\n")
    if is_best:
        best = osp.join(osp.dirname(fpath), "model-best.pth.tar")
        save_torch(best, state)
        print(f'Best checkpoint saved to "{best}"')
