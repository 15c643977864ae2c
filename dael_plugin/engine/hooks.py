"""What runs around the epochs, as hooks that hold their trainer (detectron2's ``engine/hooks.py``).

Both engines run the same hooks: the built-in trainer from its own ``train`` (engine/trainer.py),
the Dassl engine's trainer from Dassl's ``before_train`` / ``after_epoch`` / ``after_train``, which
Dassl's own ``train`` calls. A hook takes no argument: it reads what it needs from the trainer,
whose side of the contract is written in :class:`HookBase`.

After an epoch the order is the run's contract (engine/trainer.py lists it): the schedulers step,
the divergence flag and the weights are checked, the epoch's record is written, then the "last"
checkpoint, so a run stopped between a record and its checkpoint redoes that epoch (and its
record) on resume, and the saved random state is the next epoch's.
"""

from __future__ import annotations

import os
from typing import Iterable, List, Optional, Sequence

from dael_plugin.engine import checkpoint as ckpt
from dael_plugin.engine import distributed
from dael_plugin.engine.guard import divergence_error, weights_finite


class HookBase:
    """A hook of a training run; ``trainer`` is set when the hook is bound to it (:func:`bind`).

    What the hooks read of their trainer (both engines' trainers have it):

    - ``cfg``, ``epoch`` (0-based; after an epoch, the epoch just trained), ``start_epoch``;
    - ``guard`` (the divergence flag) and ``trained_modules()`` (the modules whose weights and
      batch-norm statistics must be finite);
    - ``schedulers()``: the learning-rate schedulers, stepped once per epoch;
    - ``selection``: the per-epoch records (engine/selection.py), or None;
    - for checkpoints: ``run_id()``, ``run_state(epochs_done, rng_ranks)`` (the whole state to
      save), ``load_run_state(state)`` (the modules, optimisers and loaders from a state),
      ``resume_keys`` (what a resumable state must hold), ``strategy.scaler`` and ``bad_images``.
    """

    trainer = None

    def before_train(self) -> None:
        """Once, after the trainer resumed (``start_epoch`` is set) and before the first epoch."""

    def after_epoch(self) -> None:
        """After each epoch, in the order of the trainer's hooks."""

    def after_train(self) -> None:
        """Once, after the last epoch."""


def bind(trainer, hooks: Iterable[HookBase]) -> List[HookBase]:
    """``hooks`` bound to ``trainer``, in their order."""
    hooks = [h for h in hooks if h is not None]
    for h in hooks:
        h.trainer = trainer
    return hooks


def run(hooks: Sequence[HookBase], stage: str) -> None:
    """Each hook's ``stage`` (``before_train``, ``after_epoch`` or ``after_train``), in order."""
    for h in hooks:
        getattr(h, stage)()


class StepSchedulers(HookBase):
    """The learning-rate schedulers step once per epoch, not on a batch index (Dassl's sampler
    length can differ from the real epoch length)."""

    def after_epoch(self) -> None:
        for sched in self.trainer.schedulers():
            sched.step()


class DivergenceCheck(HookBase):
    """After an epoch: the divergence flag, then the weights and batch-norm statistics, each a
    one-line error naming the epoch and what to change (one host read per epoch)."""

    def after_epoch(self) -> None:
        t = self.trainer
        done, lr, out = t.epoch + 1, t.cfg.OPTIM.LR, t.cfg.OUTPUT_DIR
        if t.guard.tripped():
            raise divergence_error(done, None, lr, out)
        if not weights_finite(t.trained_modules()):
            raise divergence_error(done, None, lr, out, what="model's weights or batch-norm statistics")


class EvalEachEpoch(HookBase):
    """``--eval-each-epoch``: the validation split (the test split where there is none) after every
    epoch, on the built-in engine (Dassl's own ``after_epoch`` evaluates on the Dassl engine)."""

    def before_train(self) -> None:
        if self.trainer.eval_split_each_epoch() == "test":
            print(
                "Note: there is no validation split, so --eval-each-epoch reads the target *test* split; "
                "do not choose an epoch on it"
            )

    def after_epoch(self) -> None:
        t = self.trainer
        t.test(split=t.eval_split_each_epoch())


class EpochRecords(HookBase):
    """The per-epoch records and each protocol's best model (engine/selection.py): a resumed run
    first drops the records of the epochs it redoes."""

    def __init__(self, selection) -> None:
        self.selection = selection

    def before_train(self) -> None:
        self.selection.resume(self.trainer.start_epoch)

    def after_epoch(self) -> None:
        self.selection.after_epoch(self.trainer.epoch + 1)


class LastCheckpoint(HookBase):
    """The "last" checkpoint after every epoch, atomic, with every process's random states (so the
    same command resumes a stopped run exactly), and the resume from it.

    ``epoch_files``: also ``model.pth.tar-<epoch>`` after the last epoch and every ``every`` epochs
    (``TRAIN.CHECKPOINT_FREQ``, as Dassl's; 0: the last alone); off on the Dassl engine, where Dassl
    writes its own epoch files."""

    def __init__(self, every: int = 0, epoch_files: bool = False) -> None:
        self.every, self.epoch_files = every, epoch_files

    def paths(self, epochs_done: int) -> List[str]:
        out = self.trainer.cfg.OUTPUT_DIR
        paths = [os.path.join(out, ckpt.LAST)]
        periodic = self.every > 0 and epochs_done % self.every == 0
        if self.epoch_files and (periodic or epochs_done == self.trainer.cfg.OPTIM.MAX_EPOCH):
            paths.append(os.path.join(out, f"model.pth.tar-{epochs_done}"))
        return paths

    def save(self, epochs_done: int) -> None:
        """Every process hands in its random states (a collective under torchrun, so every rank
        calls this); rank 0 alone builds the run's state and writes it, atomically, to each path."""
        rng_ranks = ckpt.gather_rng()
        if not distributed.world().is_main:
            return
        state = self.trainer.run_state(epochs_done, rng_ranks)
        for path in self.paths(epochs_done):
            ckpt.save_checkpoint(state, path)

    def after_epoch(self) -> None:
        self.save(self.trainer.epoch + 1)  # last: the saved random state is the next epoch's

    def resume(self, directory: str) -> Optional[int]:
        """The epochs done by ``directory``'s "last" checkpoint, read back into the trainer (refused,
        in one line, when it is another run's: config, data, classes, engine), with the random
        states, fp16's scaler and the unreadable images; None where there is no such file."""
        t = self.trainer
        path = os.path.join(directory, ckpt.LAST)
        if not os.path.isfile(path):
            return None
        state = ckpt.read_resumable(path, t.run_id(), t.resume_keys)
        t.load_run_state(state)
        return ckpt.restore_run_state(state, path, t.strategy.scaler, t.bad_images)
