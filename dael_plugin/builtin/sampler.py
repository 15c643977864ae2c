"""Batch samplers of the built-in engine: domain-balanced, seeded per draw.

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

Every draw is an ``(index, draw_seed)`` pair. The dataset seeds its random
augmentations from ``draw_seed``, which is a function of (seed, epoch,
position) only. So a run gives the same batches whatever the number of
loader workers, and a resumed run's fresh workers reproduce exactly what an
uninterrupted run's long-lived workers would have drawn.
"""
from __future__ import annotations

import math
from typing import Iterator, List, Sequence, Tuple

import numpy as np
from torch.utils.data import Sampler

from ..errors import DAELConfigError

Draw = Tuple[int, int]


def draw_seeds(seed: int, epoch: int, stream: int, count: int) -> np.ndarray:
    """``count`` seeds for one epoch of one sampler, a function of its arguments only."""
    return np.random.default_rng([seed, epoch, stream, 0xDAE1]).integers(0, 2 ** 62, size=count, dtype=np.int64)


class DomainBalancedBatchSampler(Sampler[List[Draw]]):
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
        self.members = [np.flatnonzero(self.domains == d) for d in self.domain_ids]
        largest = max(len(m) for m in self.members)
        self.num_batches = math.ceil(largest * k / (self.n_domain * self.per_domain))
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_batches

    def small_domains(self) -> List[Tuple[int, int]]:
        """(domain id, size) of each domain with fewer images than its per-batch share."""
        return [(int(d), len(m)) for d, m in zip(self.domain_ids, self.members) if len(m) < self.per_domain]

    def _stream(self, rng: np.random.Generator, members: np.ndarray, count: int) -> np.ndarray:
        passes = math.ceil(count / len(members))
        return np.concatenate([rng.permutation(members) for _ in range(passes)])[:count]

    def plan(self) -> np.ndarray:
        """This epoch's ``(num_batches, batch_size)`` indices."""
        rng = np.random.default_rng([self.seed, self.epoch])
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
        plan = self.plan()
        seeds = draw_seeds(self.seed, self.epoch, 0, plan.size).reshape(plan.shape)
        for idx, s in zip(plan.tolist(), seeds.tolist()):
            yield list(zip(idx, s))


class SeededRandomBatchSampler(Sampler[List[Draw]]):
    """Shuffled batches of ``(index, draw_seed)``, a function of (seed, epoch, stream)."""

    def __init__(self, n: int, batch_size: int, seed: int = 0, stream: int = 1, drop_last: bool = True) -> None:
        if batch_size <= 0:
            raise DAELConfigError(f"batch size {batch_size} must be positive")
        self.n, self.batch_size, self.seed, self.stream = n, batch_size, seed, stream
        self.drop_last = drop_last and n >= batch_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else math.ceil(self.n / self.batch_size)

    def __iter__(self) -> Iterator[List[Draw]]:
        perm = np.random.default_rng([self.seed, self.epoch, self.stream]).permutation(self.n)
        seeds = draw_seeds(self.seed, self.epoch, self.stream, self.n)
        for b in range(len(self)):
            sl = slice(b * self.batch_size, (b + 1) * self.batch_size)
            yield list(zip(perm[sl].tolist(), seeds[sl].tolist()))
