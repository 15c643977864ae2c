"""What both engines' trainers run around the step, written once.

``engine/loop.py`` holds the epoch itself; this module holds what each trainer did around it, in
its own copy, until both called these: the images a batch replaced, the target loader cycled,
the end-of-epoch divergence check, the checkpoint that gathers every rank's random states before
rank 0 writes, and the resume that reads a checkpoint back into the modules. The trainers keep
only what differs: Dassl's registries, log format and evaluator on one side, the built-in data
and model set-up on the other (each tallies its evaluation with ``engine/evaluate.py``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Tuple

import torch

from dael_plugin.data.images import REPLACED, note_unreadable
from dael_plugin.engine import checkpoint as ckpt
from dael_plugin.engine import distributed
from dael_plugin.engine.guard import FiniteGuard, divergence_error, weights_finite


def note_bad(bad_images: set, *batches: Optional[dict]) -> None:
    """Remember the images a batch's loader could not read (and replaced), for results.json."""
    for b in batches:
        if b is not None:
            note_unreadable(bad_images, b.get("bad_path", []), REPLACED)


def next_cycled(it: Iterator, loader: Iterable) -> Tuple[Any, Iterator]:
    """The next batch, and the iterator: a loader that runs out starts again (a fresh pass, with
    fresh draws), as Dassl's loop cycles the shorter of its two loaders."""
    try:
        return next(it), it
    except StopIteration:
        it = iter(loader)
        return next(it), it


def check_after_epoch(
    guard: FiniteGuard, modules: Iterable[torch.nn.Module], epochs_done: int, lr: float, output_dir: str
) -> None:
    """After an epoch: the divergence flag, then the weights and batch-norm statistics, each a
    one-line error naming the epoch and what to change (one host read per epoch)."""
    if guard.tripped():
        raise divergence_error(epochs_done, None, lr, output_dir)
    if not weights_finite(modules):
        raise divergence_error(epochs_done, None, lr, output_dir, what="model's weights or batch-norm statistics")


def save_run(state_of: Callable[[list], dict], paths: Sequence[str]) -> None:
    """Every process hands in its random states (a collective under torchrun, so every rank must
    call this); rank 0 alone builds the run's state and writes it, atomically, to each path."""
    rng_ranks = ckpt.gather_rng()
    if not distributed.world().is_main or not paths:
        return
    state = state_of(rng_ranks)
    for path in paths:
        ckpt.save_checkpoint(state, path)


def resume_run(
    path: str, run: ckpt.RunId, required: Tuple[str, ...], load: Callable[[dict], None], scaler: Any, bad_images: set
) -> int:
    """Read a run's last checkpoint (refused, in one line, when it is another run's: config, data,
    classes, engine), hand it to ``load`` for the trainer's modules, optimisers and loaders, then
    restore the random states and the loss scaler; returns the epochs it holds."""
    state = ckpt.read_resumable(path, run, required)
    load(state)
    return ckpt.restore_run_state(state, path, scaler, bad_images)
