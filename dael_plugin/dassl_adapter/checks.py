"""Dataset checks against Dassl's registry, with one-line errors."""
from __future__ import annotations

from dassl.data.datasets import DATASET_REGISTRY

from ..errors import DAELConfigError


def check_dataset_cfg(cfg) -> None:
    name = cfg.DATASET.NAME
    names = DATASET_REGISTRY.registered_names()
    if name not in names:
        raise DAELConfigError(f"unknown dataset DATASET.NAME={name!r}; registered datasets: {sorted(names)}")
    domains = list(getattr(DATASET_REGISTRY.get(name), "domains", []) or [])
    if domains:
        for d in list(cfg.DATASET.SOURCE_DOMAINS) + list(cfg.DATASET.TARGET_DOMAINS):
            if d not in domains:
                raise DAELConfigError(f"dataset {name} has no domain {d!r}; its domains are {domains}")
