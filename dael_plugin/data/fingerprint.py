"""Which images a run read: per split and domain, a count and a SHA-256.

The hash is over the sorted ``<path relative to DATASET.ROOT>\\t<label>`` lines of the split's
images of that domain (repeats kept: Digit-5's USPS is listed three times). Paths and labels
only, no pixel: it takes about a second for DomainNet's 600k images, and it catches what
changes a run: an image added, removed, renamed or relabelled, another Digit-5 subsample,
another copy of a dataset. A file edited in place keeps its fingerprint; ``--check-data
--hash-pixels`` hashes the bytes too.

Both engines' items have ``impath``, ``label`` and ``domain`` (an index into the sources for
train_x and val, into the targets for train_u and test).
"""

from __future__ import annotations

import hashlib
import os
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

from dael_plugin.data.items import named_domain

SPLIT_DOMAINS = {"train_x": "sources", "val": "sources", "train_u": "targets", "test": "targets"}

Fingerprint = Dict[str, Dict[str, Dict[str, object]]]  # split -> domain -> {"images", "sha256"}


def relative_path(path: str, root: str) -> str:
    prefix = root.rstrip(os.sep) + os.sep
    return path[len(prefix) :] if path.startswith(prefix) else os.path.abspath(path)


def seeded_domains(ds) -> Tuple[str, ...]:
    """The domains whose images a dataset draws from the seed (Digit-5's 25,000 of each; the sources
    of a WILDS set under ``NUM_SHOTS``). ``ds``: the config's ``DATASET`` node."""
    from dael_plugin.data.folders import DATASETS  # (importing folders registers every dataset)

    entry = DATASETS.get(str(ds.NAME))
    if entry is None:
        return ()
    few_shot = "NUM_SHOTS" in entry.options and int(ds.get("NUM_SHOTS", -1)) > 0
    return tuple(entry.seeded) + (tuple(ds.SOURCE_DOMAINS) if few_shot else ())


def split_names(sources: Sequence[str], targets: Sequence[str], dataset: Optional[str] = None) -> Dict[str, list]:
    """The named domains of each split's items (:data:`SPLIT_DOMAINS`); the val split of a dataset
    that brings its own split (WILDS's, of other domains than its train split's) is named ``val``."""
    from dael_plugin.data.folders import official_split

    names = {"sources": [str(s) for s in sources], "targets": [str(t) for t in targets]}
    out = {split: names[which] for split, which in SPLIT_DOMAINS.items()}
    if dataset is not None and official_split(dataset) is not None:
        out["val"] = ["val"]
    return out


def data_fingerprint(
    splits: Mapping[str, Optional[Sequence]],
    sources: Sequence[str],
    targets: Sequence[str],
    root: str,
    seeded: Sequence[str] = (),
    extra: Optional[Callable[[object], str]] = None,
    dataset: Optional[str] = None,
) -> Fingerprint:
    """``{split: {domain: {"images": n, "sha256": hex}}}`` for the splits a run read (None or
    empty splits are left out); ``"seeded": True`` marks a domain of ``seeded``, whose images
    are a subsample drawn from the run's seed, so runs of other seeds differ there by design.
    ``extra(item)`` appends a field to each line (``--hash-pixels``: the file's SHA-256)."""
    root = os.path.abspath(os.path.expanduser(root or "."))
    names = split_names(sources, targets, dataset)
    out: Fingerprint = {}
    for split in SPLIT_DOMAINS:
        items = splits.get(split)
        if not items:
            continue
        lines: Dict[str, list] = {d: [] for d in names[split]}
        for item in items:
            line = f"{relative_path(item.impath, root)}\t{int(item.label)}"
            lines[names[split][named_domain(item.domain, names[split])]].append(
                line if extra is None else f"{line}\t{extra(item)}"
            )
        out[split] = {
            domain: {
                "images": len(ls),
                "sha256": hashlib.sha256("\n".join(sorted(ls)).encode()).hexdigest(),
                **({"seeded": True} if domain in seeded else {}),
            }
            for domain, ls in lines.items()
        }
    return out


def dataset_fingerprint(cfg, dataset) -> Fingerprint:
    """The fingerprint of a Dassl ``DatasetBase`` (its ``train_x``, ``train_u``, ``val``, ``test``)."""
    splits = {k: getattr(dataset, k, None) for k in SPLIT_DOMAINS}
    ds = cfg.DATASET
    return data_fingerprint(splits, ds.SOURCE_DOMAINS, ds.TARGET_DOMAINS, ds.ROOT, seeded_domains(ds), dataset=ds.NAME)


def fingerprint_changes(saved: Fingerprint, now: Fingerprint) -> list:
    """``"<split>/<domain>: ..."`` for each split and domain whose images differ."""
    changes = []
    for split in sorted(set(saved) | set(now)):
        a, b = saved.get(split, {}), now.get(split, {})
        for domain in sorted(set(a) | set(b)):
            was, new = a.get(domain), b.get(domain)
            if was == new:
                continue
            if was is None or new is None:
                changes.append(
                    f"{split}/{domain}: "
                    + (
                        "read now, not by the checkpoint's run"
                        if was is None
                        else "read by the checkpoint's run, not now"
                    )
                )
                continue
            changes.append(
                f"{split}/{domain}: {new['images']:,} images (sha256 {str(new['sha256'])[:12]}) where the "
                f"checkpoint's run read {was['images']:,} (sha256 {str(was['sha256'])[:12]})"
            )
    return changes


def one_digest(fp: Fingerprint, seed_free: bool = False) -> str:
    """One short hash of a whole fingerprint, equal when every split and domain is. ``seed_free``
    leaves out the hashes of seeded domains (their counts stay): equal for runs of other seeds
    on the same copy of the data."""

    def sha(v) -> str:
        return "" if seed_free and v.get("seeded") else str(v.get("sha256"))

    text = "\n".join(f"{s}/{d}\t{v.get('images')}\t{sha(v)}" for s in sorted(fp) for d, v in sorted(fp[s].items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
