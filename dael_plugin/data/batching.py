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


def release_loaders(root: object, depth: int = 5) -> int:
    """Stop the worker processes of every ``DataLoader`` reachable from ``root`` (its attributes,
    and theirs, dict values and list items, ``depth`` levels down: the records' loaders sit at
    ``trainer.selection.model.loaders[name]``, four levels, and on the Dassl engine at
    ``trainer.method.selection.model.loaders[name]``, five); returns how many it stopped.

    A run's loaders keep their workers across epochs (``persistent_workers``). When the run ends
    in a process that goes on (``train.main`` called from Python: a notebook, a test, a sweep in
    one process), the trainer and its loaders become garbage in reference cycles. Collected by the
    cyclic GC, an iterator's queues may be finalised before the iterator, its shutdown message
    never reaches the workers, and each worker costs a 5 s join timeout at whatever line the
    collection happens to run (measured: 12 workers, 60 s). Dropping the iterator here, while its
    queues are whole, stops the workers in milliseconds."""
    from torch.utils.data import DataLoader

    seen, found = set(), []

    def walk(obj, level):
        if id(obj) in seen or level > depth:
            return
        seen.add(id(obj))
        if isinstance(obj, DataLoader):
            found.append(obj)
            return
        if isinstance(obj, dict):
            children = list(obj.values())
        elif isinstance(obj, (list, tuple)):
            if len(obj) > 64:  # a split's items (600k for DomainNet), not a list of loaders
                return
            children = list(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            children = list(vars(obj).values())
        else:
            return
        for child in children:
            if isinstance(child, (str, bytes, int, float, bool)) or child is None:
                continue
            walk(child, level + 1)

    walk(root, 0)
    stopped = 0
    for loader in found:
        it = getattr(loader, "_iterator", None)  # a persistent-workers loader's iterator (torch's attribute)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
            stopped += 1
        if it is not None:
            loader._iterator = None
    return stopped
