"""Batch samplers seeded per draw, for both engines.

Every draw is an ``(index, draw_seed)`` pair: the dataset seeds the random
augmentations of the draw from ``draw_seed`` alone (:class:`seeded_draw`), and
``draw_seed`` is a function of (seed, epoch, position). So a run gives the
same batches whatever the number of loader workers, long-lived workers need
no reseeding, and a resumed run's fresh workers reproduce exactly what an
uninterrupted run's would have drawn.

The source loader's sampler is named by ``DATALOADER.TRAIN_X.SAMPLER``, one meaning per name on
both engines (:func:`source_batch_sampler`):

- ``RandomDomainSampler`` / ``SeqDomainSampler``: :class:`DasslDomainBatchSampler`, Dassl's
  epochs (they end when the *smallest* domain runs short of a chunk);
- ``CyclingDomainSampler`` (the plugin's own): :class:`DomainBalancedBatchSampler`, an epoch
  that covers the *largest* domain, cycling the smaller ones;
- ``RandomSampler``: :class:`SeededRandomBatchSampler`, shuffled batches of the pooled sources
  (also the target loader's).

``DomainBalancedBatchSampler`` avoids the traps of Dassl's RandomDomainSampler:

- Linear time: an epoch is built from per-domain permutations with numpy,
  no ``list.remove``.
- A fixed, stated epoch length: ``ceil(max_d n_d * K / (n_domain * per_domain))``
  batches, so every image of the *largest* source domain is seen once per
  epoch (with all K domains in each batch: ``ceil(max_d n_d / per_domain)``).
- No silent dropping: smaller domains are cycled, each pass a fresh
  permutation, instead of ending the epoch when the smallest runs out.

Each batch is ``n_domain`` contiguous single-domain chunks of ``per_domain``
draws, the layout DAEL's per-domain experts need.
"""

from __future__ import annotations

import math
import random
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Sampler, get_worker_info

from dael_plugin.config.keys import DASSL_DOMAIN_SAMPLERS, SOURCE_SAMPLERS
from dael_plugin.errors import DAELConfigError

Draw = Tuple[int, int]


def draw_seeds(seed: int, epoch: int, stream: int, count: int) -> np.ndarray:
    """``count`` seeds for one epoch of one sampler, a function of its arguments only."""
    return np.random.default_rng([seed, epoch, stream, 0xDAE1]).integers(0, 2**62, size=count, dtype=np.int64)


class Shard:
    """A batch sampler's share of each global batch in a run on ``world`` processes.

    Every global batch is drawn as in a single process (the draws are functions of (seed,
    epoch, position)); each process then keeps its ``1/world`` of every chunk of ``chunk``
    draws (each domain's chunk, or the whole target batch), so the union of the processes'
    shards is exactly the single-process batch and each shard keeps the chunk layout."""

    rank, world = 0, 1

    def set_shard(self, rank: int, world: int) -> None:
        chunk = self.shard_chunk()
        if chunk % world:
            raise DAELConfigError(
                f"{self.shard_what()} is {chunk}, which does not split over {world} processes; "
                f"make it a multiple of {world}"
            )
        self.rank, self.world = int(rank), int(world)

    def shard_chunk(self) -> int:
        raise NotImplementedError

    def shard_what(self) -> str:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose draws come next (each draw is a function of seed, epoch and position)."""
        self.epoch = epoch

    def small_domains(self) -> List[Tuple[int, int]]:
        """(domain id, size) of each domain with fewer images than its per-batch share."""
        return []

    def _take(self, batch: List[Draw]) -> List[Draw]:
        if self.world == 1:
            return batch
        chunk = self.shard_chunk()
        if len(batch) % chunk:  # a short last batch: shards of equal size, or none at all
            chunk = len(batch)
            if chunk % self.world:
                raise DAELConfigError(
                    f"a last batch of {chunk} does not split over {self.world} processes; use a batch size it divides"
                )
        n = chunk // self.world
        return [
            d
            for start in range(0, len(batch), chunk)
            for d in batch[start + self.rank * n : start + (self.rank + 1) * n]
        ]


class DomainBalancedBatchSampler(Shard, Sampler[List[Draw]]):
    def __init__(self, domains: Sequence[int], batch_size: int, n_domain: int = 0, seed: int = 0) -> None:
        self.domains = np.asarray(domains, dtype=np.int64)
        self.domain_ids = np.unique(self.domains)
        k = len(self.domain_ids)
        if batch_size <= 0:
            raise DAELConfigError(f"DATALOADER.TRAIN_X.BATCH_SIZE={batch_size} must be positive")
        self.n_domain = k if n_domain <= 0 else n_domain
        if self.n_domain > k:
            raise DAELConfigError(f"DATALOADER.TRAIN_X.N_DOMAIN={n_domain} exceeds the {k} domains in the data")
        if batch_size % self.n_domain != 0:
            raise DAELConfigError(
                f"DATALOADER.TRAIN_X.BATCH_SIZE={batch_size} is not divisible by the {self.n_domain} domains per batch"
            )
        self.per_domain = batch_size // self.n_domain
        self.in_order = self.n_domain == k  # every batch: each domain's chunk, in domain order
        self.members = [np.flatnonzero(self.domains == d) for d in self.domain_ids]
        largest = max(len(m) for m in self.members)
        self.num_batches = math.ceil(largest * k / (self.n_domain * self.per_domain))
        self.seed = seed
        self.epoch, self.passes = 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.passes = epoch, 0

    def __len__(self) -> int:
        return self.num_batches

    def shard_chunk(self) -> int:
        return self.per_domain

    def shard_what(self) -> str:
        return "the number of images per domain in a batch (DATALOADER.TRAIN_X.BATCH_SIZE / N_DOMAIN)"

    def small_domains(self) -> List[Tuple[int, int]]:
        """(domain id, size) of each domain with fewer images than its per-batch share."""
        return [(int(d), len(m)) for d, m in zip(self.domain_ids, self.members) if len(m) < self.per_domain]

    def _stream(self, rng: np.random.Generator, members: np.ndarray, count: int) -> np.ndarray:
        passes = math.ceil(count / len(members))
        return np.concatenate([rng.permutation(members) for _ in range(passes)])[:count]

    def plan(self, key: Optional[int] = None) -> np.ndarray:
        """The ``(num_batches, batch_size)`` indices of this epoch, or of the pass keyed ``key``."""
        rng = np.random.default_rng([self.seed, self.epoch if key is None else key])
        k = len(self.domain_ids)
        if self.n_domain == k:
            chosen = np.tile(np.arange(k), (self.num_batches, 1))
        else:
            chosen = np.argsort(rng.random((self.num_batches, k)), axis=1)[:, : self.n_domain]
            chosen.sort(axis=1)
        need = np.bincount(chosen.ravel(), minlength=k) * self.per_domain
        streams = [self._stream(rng, self.members[d], int(need[d])) for d in range(k)]
        # Vectorised gather: the j-th use of domain d in the epoch takes chunk j of its stream.
        flat = chosen.ravel()
        order = np.argsort(flat, kind="stable")
        rank = np.empty_like(order)
        starts = np.concatenate([[0], np.cumsum(np.bincount(flat, minlength=k))[:-1]])
        rank[order] = np.arange(flat.size) - starts[flat[order]]
        cols = rank[:, None] * self.per_domain + np.arange(self.per_domain)
        out = np.empty((flat.size, self.per_domain), dtype=np.int64)
        for d in range(k):
            rows = flat == d
            out[rows] = streams[d][cols[rows]]
        return out.reshape(self.num_batches, -1)

    def __iter__(self) -> Iterator[List[Draw]]:
        # Pass 0 is keyed by the epoch; a later pass of the epoch (a source loader cycled under
        # TRAIN.COUNT_ITER) draws afresh, keyed as SeededRandomBatchSampler's later passes
        key = self.epoch + 100_003 * self.passes
        self.passes += 1
        plan = self.plan(key)
        seeds = draw_seeds(self.seed, key, 0, plan.size).reshape(plan.shape)
        for idx, s in zip(plan.tolist(), seeds.tolist()):
            yield self._take(list(zip(idx, s)))


class DasslDomainBatchSampler(Shard, Sampler[List[Draw]]):
    """Dassl's ``RandomDomainSampler``, drawn per draw from (seed, epoch, pass).

    The same epochs as Dassl's: each batch takes ``n_domain`` domains in random
    order and ``per_domain`` images of each, without replacement, and the epoch
    ends after the batch that leaves a chosen domain with fewer than
    ``per_domain`` images (with every domain in each batch: ``min_d floor(n_d /
    per_domain)`` batches). Dassl draws from Python's global ``random`` in the
    main process, with an ``O(n)`` ``list.remove`` per image, and its length is
    fixed at construction; here each epoch is a NumPy plan from (seed, epoch),
    its length is that epoch's, and each pass over the loader within an epoch
    (the target loader restarts when it runs out) draws afresh."""

    def __init__(
        self,
        domains: Sequence[int],
        batch_size: int,
        n_domain: int = 0,
        seed: int = 0,
        sequential: bool = False,
        names: Sequence[str] = (),
    ) -> None:
        self.domains = np.asarray(domains, dtype=np.int64)
        self.domain_ids = np.unique(self.domains)
        k = len(self.domain_ids)
        self.sequential = sequential  # Dassl's SeqDomainSampler: every domain, in order, in each batch
        self.n_domain = k if (n_domain <= 0 or sequential) else n_domain
        if batch_size <= 0 or self.n_domain > k or batch_size % self.n_domain:
            raise DAELConfigError(
                f"DATALOADER.TRAIN_X.BATCH_SIZE={batch_size} does not split into {self.n_domain} of the {k} domains"
            )
        self.per_domain = batch_size // self.n_domain
        self.in_order = sequential  # RandomDomainSampler: the batch's domains in random order, as Dassl's
        self.members = [np.flatnonzero(self.domains == d) for d in self.domain_ids]
        small = [(int(d), len(m)) for d, m in zip(self.domain_ids, self.members) if len(m) < self.per_domain]
        if small:
            d, n = small[0]
            named = repr(names[d]) if d < len(names) else str(d)  # (names: where each number is one domain)
            raise DAELConfigError(
                f"source domain {named} has {n} training images, fewer than its per-batch share of "
                f"{self.per_domain}: Dassl's sampler cannot fill one batch; lower "
                "DATALOADER.TRAIN_X.BATCH_SIZE, or set DATALOADER.TRAIN_X.SAMPLER CyclingDomainSampler"
            )
        self.seed, self.epoch, self.passes = seed, 0, 0
        self._plan = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.passes, self._plan = epoch, 0, None

    def shard_chunk(self) -> int:
        return self.per_domain

    def shard_what(self) -> str:
        return "the number of images per domain in a batch (DATALOADER.TRAIN_X.BATCH_SIZE / N_DOMAIN)"

    def plan(self, pass_: int = 0) -> np.ndarray:
        """This epoch's (and pass's) ``(batches, batch_size)`` indices."""
        rng = np.random.default_rng([self.seed, self.epoch, pass_, 0xDA55])
        left = [rng.permutation(m) for m in self.members]
        used = [0] * len(left)
        batches = []
        while True:  # a loop over batches, not images
            chosen = np.arange(len(left)) if self.sequential else rng.permutation(len(left))[: self.n_domain]
            if any(len(left[d]) - used[d] < self.per_domain for d in chosen):
                break  # Dassl checks after each domain; an epoch never holds a short chunk
            batches.append(np.concatenate([left[d][used[d] : used[d] + self.per_domain] for d in chosen]))
            for d in chosen:
                used[d] += self.per_domain
            if any(len(left[d]) - used[d] < self.per_domain for d in chosen):
                break
        return np.stack(batches) if batches else np.zeros((0, self.per_domain * self.n_domain), dtype=np.int64)

    def __len__(self) -> int:
        if self._plan is None:
            self._plan = self.plan(0)
        return len(self._plan)

    def __iter__(self) -> Iterator[List[Draw]]:
        plan = self._plan if (self.passes == 0 and self._plan is not None) else self.plan(self.passes)
        seeds = draw_seeds(self.seed, self.epoch, 2 + self.passes, plan.size).reshape(plan.shape)
        self.passes += 1
        for idx, s in zip(plan.tolist(), seeds.tolist()):
            yield self._take(list(zip(idx, s)))


class SeededRandomBatchSampler(Shard, Sampler[List[Draw]]):
    """Shuffled batches of ``(index, draw_seed)``, a function of (seed, epoch, stream, pass):
    each pass over the loader within an epoch (a target loader that restarts) draws afresh."""

    def __init__(self, n: int, batch_size: int, seed: int = 0, stream: int = 1, drop_last: bool = True) -> None:
        if batch_size <= 0:
            raise DAELConfigError(f"batch size {batch_size} must be positive")
        self.n, self.batch_size, self.seed, self.stream = n, batch_size, seed, stream
        self.drop_last = drop_last and n >= batch_size
        self.epoch, self.passes = 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.passes = epoch, 0

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else math.ceil(self.n / self.batch_size)

    def shard_chunk(self) -> int:
        return self.batch_size

    def shard_what(self) -> str:
        return "the batch size (DATALOADER.TRAIN_U.BATCH_SIZE, or TRAIN_X's for a pooled source)"

    def __iter__(self) -> Iterator[List[Draw]]:
        # Pass 0 keeps the (seed, epoch, stream) key of earlier versions; later passes of an
        # epoch use (epoch + 100003 * pass), as the built-in loop's target restarts did.
        epoch = self.epoch + 100_003 * self.passes
        self.passes += 1
        perm = np.random.default_rng([self.seed, epoch, self.stream]).permutation(self.n)
        seeds = draw_seeds(self.seed, epoch, self.stream, self.n)
        for b in range(len(self)):
            sl = slice(b * self.batch_size, (b + 1) * self.batch_size)
            yield self._take(list(zip(perm[sl].tolist(), seeds[sl].tolist())))


def source_batch_sampler(
    name: str, domains: Sequence[int], batch_size: int, n_domain: int, seed: int, names: Sequence[str] = ()
) -> Shard:
    """The source loader's batch sampler for ``DATALOADER.TRAIN_X.SAMPLER`` ``name``, the same on
    both engines (module docstring); ``names``: the domains' names, where each number is one, for
    its error lines."""
    if name in DASSL_DOMAIN_SAMPLERS:
        sequential = name == "SeqDomainSampler"
        return DasslDomainBatchSampler(domains, batch_size, n_domain, seed, sequential=sequential, names=names)
    if name == "CyclingDomainSampler":
        return DomainBalancedBatchSampler(domains, batch_size, n_domain, seed)
    if name == "RandomSampler":
        return SeededRandomBatchSampler(len(domains), batch_size, seed, stream=0)
    raise DAELConfigError(f"DATALOADER.TRAIN_X.SAMPLER={name!r} is not one of {list(SOURCE_SAMPLERS)}")


def sampler_summary(name: str, batches: int, per_domain: int) -> str:
    """The log's line on a domain sampler's epoch (the first epoch's length)."""
    what = {
        "RandomDomainSampler": "Dassl's RandomDomainSampler epoch, until a drawn source domain runs short of a chunk",
        "SeqDomainSampler": "Dassl's SeqDomainSampler epoch, until a source domain runs short of a chunk",
        "CyclingDomainSampler": "every image of the largest source domain once, the smaller ones cycled",
    }[name]
    return f"{name}: {batches} batches per epoch ({what}); {per_domain} images per domain per batch"


class held_rng:
    """Hold the main process's torch, NumPy and Python ``random`` states and put them back on exit.
    Nested holds save nothing: the outermost one puts back what it found. Around a batch's draws
    (``__getitems__``), each draw seeds the streams without saving three states of its own."""

    depth = 0

    def __init__(self) -> None:
        self.saved = None

    def __enter__(self):
        if get_worker_info() is None and held_rng.depth == 0:
            self.saved = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        held_rng.depth += 1

    def __exit__(self, *exc):
        held_rng.depth -= 1
        if self.saved is not None:
            torch.set_rng_state(self.saved[0])
            np.random.set_state(self.saved[1])
            random.setstate(self.saved[2])


class seeded_draw:
    """Seed torch, NumPy and Python ``random`` for one draw. In the main process the previous
    states are put back afterwards (once per batch inside :func:`held_rng`), so the model's own
    randomness is untouched; a worker's own streams then matter to nothing."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.held = held_rng()

    def __enter__(self):
        self.held.__enter__()
        torch.default_generator.manual_seed(self.seed)  # the CPU generator only: augmentations run there
        np.random.seed(self.seed % (2**32))
        random.seed(self.seed)

    def __exit__(self, *exc):
        self.held.__exit__(*exc)


class DrawPicker:
    """Replacements for unreadable images that depend on the draw's seed alone; the generator is
    made only when an image turns out unreadable (not on every draw)."""

    def __init__(self, seed: int) -> None:
        self.seed, self.rng = seed, None

    def __call__(self, members: np.ndarray) -> int:
        if self.rng is None:
            self.rng = np.random.default_rng([self.seed, 0xBAD])
        return int(members[self.rng.integers(len(members))])
