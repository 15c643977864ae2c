"""What both engines' training loops share, written once: the epoch over a trainer's batches (the
step, the device-side meters, the divergence flag read only where the host reads anyway), the
target loader cycled, the images a batch replaced, the choice of the evaluation split, and a
process's share of a domain chunk. The trainers (``engine/trainer.py``, ``dassl_adapter/trainer.py``)
feed batches and models and keep only their log formats; what runs around the epochs is
engine/hooks.py.
"""

from __future__ import annotations

import datetime
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Tuple

import torch
from tqdm import tqdm

from dael_plugin.config.defaults import SUPPORTED_VALUES
from dael_plugin.data.images import REPLACED, note_unreadable
from dael_plugin.engine import distributed
from dael_plugin.engine.guard import FiniteGuard
from dael_plugin.engine.step import DeviceMeters, format_meters, short_meters
from dael_plugin.errors import DAELConfigError

Batch = Tuple[dict, Optional[dict]]
COUNT_ITER = SUPPORTED_VALUES["TRAIN.COUNT_ITER"]  # Dassl's TrainerXU's values


def train_epoch(
    batches: Iterable[Batch],
    num_batches: int,
    forward_backward: Callable[[dict, Optional[dict]], dict],
    guard: FiniteGuard,
    print_freq: int,
    report: Callable[[int, DeviceMeters], None],
    diverged: Callable[[int], Exception],
) -> DeviceMeters:
    """One training epoch: ``forward_backward`` on each ``(batch_x, batch_u)``, its 0-dim results
    summed on the device. The host reads the divergence flag (on every process of a torchrun run,
    through the host group) and hands the meters to ``report(i, meters)`` only every
    ``print_freq`` batches, at the last batch, and at every batch of an epoch shorter than
    ``print_freq``; a flag raised is ``diverged(batches_done)``. No step reads a device value."""
    meters = DeviceMeters()
    guard.reset()
    for i, (batch_x, batch_u) in enumerate(batches):
        meters.update(forward_backward(batch_x, batch_u))
        if (i + 1) % print_freq == 0 or i + 1 == num_batches or num_batches < print_freq:
            if guard.tripped():
                raise diverged(i + 1)
            report(i, meters)
    return meters


def show_progress() -> bool:
    """Progress bars only on a terminal; redirected logs get a line per PRINT_FREQ."""
    return sys.stderr.isatty()


class EpochLog:
    """What an epoch says around its loop (``BuiltinTrainer.run_epoch``): ``start(n)`` before the
    first of its ``n`` batches, ``fetched()`` as each batch is read and ``stepped()`` after its
    step, ``report(i, meters)`` where :func:`train_epoch` reads the meters, ``close()`` where the
    run diverged, ``end(meters)`` after the last batch. Says nothing; the engines' logs derive."""

    def start(self, num_batches: int) -> None:
        self.n = num_batches

    def fetched(self) -> None:
        pass

    def stepped(self) -> None:
        pass

    def report(self, i: int, meters: DeviceMeters) -> None:
        pass

    def close(self) -> None:
        pass

    def end(self, meters: DeviceMeters) -> None:
        pass


class ProgressLog(EpochLog):
    """The built-in engine's: a progress bar on a terminal (the count, the meters under short
    names and the run's eta, in 100 columns), else a line every ``PRINT_FREQ`` batches; a line
    at the epoch's end; the meters and the rate to TensorBoard (``trainer.writer``)."""

    def __init__(self, trainer) -> None:
        self.tr, self.tty = trainer, show_progress()

    def start(self, num_batches: int) -> None:
        super().start(num_batches)
        self.bar = tqdm(
            total=num_batches,
            desc=f"epoch {self.tr.epoch + 1}/{self.tr.cfg.OPTIM.MAX_EPOCH}",
            leave=False,
            disable=not self.tty,
            bar_format="{desc} {n_fmt}/{total_fmt}{postfix}",
        )

    def stepped(self) -> None:
        self.bar.update(1)

    def _where(self) -> Tuple[str, int, float]:
        tr = self.tr
        lr = tr.optim.param_groups[0]["lr"]
        return f"epoch [{tr.epoch + 1}/{tr.cfg.OPTIM.MAX_EPOCH}]", tr.cfg.OPTIM.MAX_EPOCH - tr.epoch - 1, lr

    def report(self, i: int, meters: DeviceMeters) -> None:
        tr, n = self.tr, self.n
        if (i + 1) % tr.cfg.TRAIN.PRINT_FREQ and i + 1 < n:
            return  # a short epoch's every batch: the flag was read, nothing to say
        means = meters.means()
        where, epochs_left, lr = self._where()
        if tr.writer is not None:
            for k, v in means.items():
                tr.writer.add_scalar(f"train/{k}", v, tr.epoch * n + i)
            tr.writer.add_scalar("train/lr", lr, tr.epoch * n + i)
        eta = self._eta(n - i - 1 + epochs_left * n)
        if self.tty:
            self.bar.set_postfix_str(f"{short_meters(means)} eta {eta}", refresh=False)
        elif i + 1 < n:
            print(f"{where} batch [{i + 1}/{n}] {format_meters(means)} lr {lr:.4e} eta {eta}")

    def _eta(self, batches_left: int) -> datetime.timedelta:
        """Time left in the whole run, at this process's pace so far (Dassl's eta is the run's too)."""
        per_batch = (time.time() - self.tr._run_start) / max(1, self.tr._batches_run)
        return datetime.timedelta(seconds=int(per_batch * batches_left))

    def close(self) -> None:
        self.bar.close()

    def end(self, meters: DeviceMeters) -> None:
        self.bar.close()
        where, epochs_left, lr = self._where()
        eta = self._eta(epochs_left * self.n)
        print(f"{where} batches {self.n} {format_meters(meters.means())} eta {eta} lr {lr:.4e}")


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


def epoch_length(loaders: Sequence[Any], count_iter: str) -> int:
    """Batches in an epoch under ``TRAIN.COUNT_ITER`` (:func:`epoch_batches`): the source loader's
    (``train_x``; a DG run's always, as Dassl's TrainerX), the target's (``train_u``) or the shorter's."""
    loaders = [ld for ld in loaders if ld is not None]
    lengths = {"train_x": len(loaders[0])}
    if len(loaders) > 1:
        lengths.update(train_u=len(loaders[1]), smaller_one=min(len(ld) for ld in loaders))
    return lengths.get(count_iter, lengths["train_x"])


def epoch_batches(loaders: Sequence[Any], epoch: int, count_iter: str) -> Tuple[int, Iterator[Batch]]:
    """The epoch's length and its ``(batch_x, batch_u)`` pairs over the source loader and the
    target's (``loaders[1]``, absent or None in DG; ``batch_u`` None then), as Dassl's
    ``TrainerXU.run_epoch`` counts them under ``TRAIN.COUNT_ITER``: as many batches as the source
    loader has (``train_x``), the target loader (``train_u``) or the shorter of the two
    (``smaller_one``); a loader that runs out starts a fresh pass (:func:`next_cycled`)."""
    if count_iter not in COUNT_ITER:  # Dassl's TrainerXU raises a ValueError in its first epoch
        raise DAELConfigError(f"TRAIN.COUNT_ITER={count_iter!r}: an epoch counts the batches of one of {COUNT_ITER}")
    loaders = [ld for ld in loaders if ld is not None]
    for loader in loaders:
        loader.batch_sampler.set_epoch(epoch)
    n = epoch_length(loaders, count_iter)

    def batches() -> Iterator[Batch]:
        its = [iter(ld) for ld in loaders]
        for _ in range(n):
            pairs = [next_cycled(it, ld) for it, ld in zip(its, loaders)]
            its[:] = [it for _, it in pairs]
            yield pairs[0][0], pairs[1][0] if len(pairs) > 1 else None

    return n, batches()


def pick_eval_split(split: str, val_loader: Any, test_loader: Any) -> Tuple[str, Any]:
    """The split to evaluate and its loader: ``val`` where the dataset has one, else the test split
    with one line saying so."""
    if split == "val":
        if val_loader is not None:
            return "val", val_loader
        print("Note: TEST.SPLIT is val but this dataset has no validation split; evaluating on *test*")
    return "test", test_loader


def local_share(per_domain: int) -> int:
    """Images of each domain chunk in this process's share of a batch (all of them in one process)."""
    return per_domain // distributed.world().size


def sync_batch_norm(module: torch.nn.Module) -> None:
    """In a torchrun run: batch statistics over every process's shard, per domain chunk, in the
    device group (:func:`dael_plugin.core.chunk_norm.set_sync`). Nothing otherwise."""
    from dael_plugin.core.chunk_norm import set_sync

    w = distributed.world()
    if w.distributed:
        set_sync(module, distributed.device_group(), w.size)


def end_sync_batch_norm(module: torch.nn.Module) -> None:
    """When training ends: the batch-norm modules forget the process group (evaluation normalises
    with running statistics, and a model holding a group cannot be copied with ``copy.deepcopy``)."""
    from dael_plugin.core.chunk_norm import _ChunkedMixin, set_sync

    if any(isinstance(m, _ChunkedMixin) and m._dael_sync is not None for m in module.modules()):
        set_sync(module, None, 1)
