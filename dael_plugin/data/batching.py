"""Batch layout shared by both engines: which chunk of a batch is which domain."""

from __future__ import annotations

from typing import List, Tuple

import torch

from dael_plugin.errors import DAELConfigError


def split_domains(domain: torch.Tensor, per_domain: int, num_domains: int) -> Tuple[List[int], torch.Tensor]:
    """Chunk sizes and per-sample expert index of a domain-balanced batch.

    ``domain`` is the loader's CPU tensor: it is checked as a NumPy array, on the
    host, and never moved to the device and read back (no device sync).
    Dassl's reference silently takes each chunk's first label; a batch from a
    sampler that is not domain-balanced is refused here instead.
    """
    if domain.device.type != "cpu":
        raise ValueError("split_domains takes the loader's CPU tensor of domain labels, not a device tensor")
    d = domain.numpy()
    n = d.size
    if per_domain <= 0 or n % per_domain != 0:
        raise DAELConfigError(
            f"a training batch of {n} images does not split into chunks of {per_domain} per domain; "
            "use DATALOADER.TRAIN_X.SAMPLER RandomDomainSampler with a divisible BATCH_SIZE"
        )
    blocks = d.reshape(-1, per_domain)
    if not (blocks == blocks[:, :1]).all() or d.max() >= num_domains or d.min() < 0:
        raise DAELConfigError(
            "a training batch is not made of contiguous single-domain chunks; DAEL needs a "
            "domain-balanced sampler: set DATALOADER.TRAIN_X.SAMPLER RandomDomainSampler"
        )
    return [per_domain] * blocks.shape[0], domain.long()
