"""A domain-balanced batch sampler without the traps of Dassl's RandomDomainSampler.

- Linear time: an epoch is built from per-domain permutations with numpy,
  no ``list.remove``.
- A fixed, stated epoch length: ``ceil(max_d n_d * K / (n_domain * per_domain))``
  batches, so every image of the *largest* source domain is seen once per
  epoch (with all K domains in each batch: ``ceil(max_d n_d / per_domain)``).
- No silent dropping: smaller domains are cycled, each pass a fresh
  permutation, instead of ending the epoch when the smallest runs out.

Each batch is ``n_domain`` contiguous single-domain chunks of ``per_domain``
indices, the layout DAEL's per-domain experts need.
"""
from __future__ import annotations

import math
from typing import Iterator, List, Sequence

import numpy as np
from torch.utils.data import Sampler

from ..errors import DAELConfigError


class DomainBalancedBatchSampler(Sampler[List[int]]):
    def __init__(self, domains: Sequence[int], batch_size: int, n_domain: int = 0, seed: int = 0) -> None:
        self.domains = np.asarray(domains, dtype=np.int64)
        self.domain_ids = np.unique(self.domains)
        k = len(self.domain_ids)
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

    def _stream(self, rng: np.random.Generator, members: np.ndarray, count: int) -> np.ndarray:
        passes = math.ceil(count / len(members))
        return np.concatenate([rng.permutation(members) for _ in range(passes)])[:count]

    def __iter__(self) -> Iterator[List[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        k = len(self.domain_ids)
        if self.n_domain == k:
            chosen = np.tile(np.arange(k), (self.num_batches, 1))
        else:
            chosen = np.argsort(rng.random((self.num_batches, k)), axis=1)[:, : self.n_domain]
            chosen.sort(axis=1)
        need = np.bincount(chosen.ravel(), minlength=k) * self.per_domain
        streams = [self._stream(rng, self.members[d], int(need[d])) for d in range(k)]
        offsets = np.zeros(k, dtype=np.int64)
        for row in chosen:
            batch = []
            for d in row:
                batch.extend(streams[d][offsets[d]: offsets[d] + self.per_domain].tolist())
                offsets[d] += self.per_domain
            yield batch
