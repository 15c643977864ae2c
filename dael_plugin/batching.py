"""Batch layout shared by both engines: which chunk of a batch is which domain."""
from __future__ import annotations

from typing import List, Tuple

import torch

from .errors import DAELConfigError


def split_domains(domain: torch.Tensor, per_domain: int, num_domains: int) -> Tuple[List[int], torch.Tensor]:
    """Chunk sizes and per-sample expert index of a domain-balanced batch.

    ``domain`` is the loader's CPU tensor, so the checks cost no device sync.
    Dassl's reference silently takes each chunk's first label; a batch from a
    sampler that is not domain-balanced is refused here instead.
    """
    n = domain.numel()
    if per_domain <= 0 or n % per_domain != 0:
        raise DAELConfigError(
            f"a training batch of {n} images does not split into chunks of {per_domain} per domain; "
            "use DATALOADER.TRAIN_X.SAMPLER RandomDomainSampler with a divisible BATCH_SIZE"
        )
    blocks = domain.view(-1, per_domain)
    if not bool((blocks == blocks[:, :1]).all()) or int(domain.max()) >= num_domains or int(domain.min()) < 0:
        raise DAELConfigError(
            "a training batch is not made of contiguous single-domain chunks; DAEL needs a "
            "domain-balanced sampler: set DATALOADER.TRAIN_X.SAMPLER RandomDomainSampler"
        )
    return [per_domain] * blocks.shape[0], domain.long()
