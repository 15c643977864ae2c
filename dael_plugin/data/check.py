"""``--check-data``: decode every image of a run's splits before training.

Works on both engines: the built-in trainer's item lists and Dassl's
``Datum`` lists both carry ``impath``. Decoding runs in a thread pool (PIL
releases the GIL while decoding) with a progress bar on a terminal.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

from tqdm import tqdm

from dael_plugin.data.fingerprint import split_names
from dael_plugin.data.items import named_domain
from dael_plugin.errors import DAELConfigError


def _try_decode(path: str, hash_bytes: bool = False) -> Tuple[Optional[str], str]:
    """``(reason it cannot be decoded or None, SHA-256 of its bytes or "")``."""
    import hashlib

    from dael_plugin.data.images import decode

    try:
        decode(path)  # a regular file only (a FIFO would block the read below)
        digest = ""
        if hash_bytes:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        return None, digest
    except Exception as exc:  # any decoder failure is a bad file
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}", ""


def check_images(
    paths: Sequence[str], workers: int = 2, hash_bytes: bool = False
) -> Tuple[List[Tuple[str, str]], Dict[str, str]]:
    """``(path, reason)`` for each file that cannot be decoded, and (``hash_bytes``) each path's
    SHA-256."""
    paths = list(dict.fromkeys(paths))
    bad, digests = [], {}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = pool.map(lambda p: _try_decode(p, hash_bytes), paths, chunksize=64)
        for path, (reason, digest) in tqdm(
            zip(paths, results), total=len(paths), desc="check-data", disable=not sys.stderr.isatty(), leave=False
        ):
            if reason is not None:
                bad.append((path, reason))
            digests[path] = digest
    return bad, digests


def _splits(trainer, engine: str) -> Dict[str, Sequence]:
    if engine == "builtin":
        s = trainer.splits
        out = {"train_x": s["train_x"], "train_u": s["train_u"] if trainer.is_da else None}
        return {**out, "val": s["val"], "test": s["test"]}
    ds = trainer.dm.dataset
    return {name: getattr(ds, name, None) for name in ("train_x", "train_u", "val", "test")}


def _classnames(trainer, engine: str) -> List[str]:
    if engine == "builtin":
        return list(trainer.classnames)
    return list(trainer.dm.dataset.classnames)


def count_table(splits: Dict[str, Sequence], names: Dict[str, list], classnames: Sequence[str]) -> List[str]:
    """Images per split and domain (``names``: each split's, fingerprint.split_names), then per
    class: the lines ``--check-data`` prints. A label past the class names (a test class no training
    image has: Dassl's number of classes is the largest training label + 1) is a row of its own."""
    columns, counts = [], {}
    for split, items in splits.items():
        if not items:
            continue
        domains = names[split]
        for d in domains:
            columns.append(f"{split}/{d}")
        for it in items:
            key = (f"{split}/{domains[named_domain(it.domain, domains)]}", int(it.label))
            counts[key] = counts.get(key, 0) + 1
    extra = sorted({k for _, k in counts if k >= len(classnames)})
    classnames = list(classnames) + [f"{k} (no class)" for k in extra]
    width = max([len(c) for c in columns] + [8])
    cwidth = max([len(str(c)) for c in classnames] + [5])

    def row(label, values):
        return f"{label:<{cwidth}}  " + "  ".join(f"{v:>{width}}" for v in values)

    lines = [row("class", columns)]
    for k, cname in zip(list(range(len(classnames) - len(extra))) + extra, classnames):
        lines.append(row(str(cname), [f"{counts.get((c, k), 0):,}" for c in columns]))
    lines.append(row("all", [f"{sum(v for (c2, _), v in counts.items() if c2 == c):,}" for c in columns]))
    return lines


def _pixel_fingerprint(splits, ds, digests: Dict[str, str]) -> dict:
    """Per split and domain, a SHA-256 over the sorted (relative path, label, bytes' SHA-256)."""
    from dael_plugin.data.fingerprint import data_fingerprint

    sources, targets = ds.SOURCE_DOMAINS, ds.TARGET_DOMAINS
    fp = data_fingerprint(
        splits, sources, targets, ds.ROOT, extra=lambda it: digests.get(it.impath, ""), dataset=ds.NAME
    )
    return {split: {d: v["sha256"] for d, v in doms.items()} for split, doms in fp.items()}


def check_trainer_data(trainer: object, engine: str, workers: int, hash_pixels: bool = False) -> Optional[dict]:
    """Decode all images of the run and print how many there are per split, domain and class;
    raise one error line after listing the bad files. Returns the pixel fingerprint
    (``hash_pixels``) or None."""
    cfg = trainer.cfg
    splits = {k: v for k, v in _splits(trainer, engine).items() if v}
    paths = [item.impath for items in splits.values() for item in items]
    bad, digests = check_images(paths, workers, hash_pixels)
    n = len(set(paths))
    if bad:
        for path, reason in bad:
            print(f"bad image: {path} ({reason})", file=sys.stderr)
        raise DAELConfigError(
            f"--check-data: {len(bad)} of {n} images cannot be decoded (listed above); "
            "replace or delete them, then rerun"
        )
    ds = cfg.DATASET
    print(f"--check-data: images per class, split and domain of {ds.NAME}:")
    for line in count_table(
        splits, split_names(ds.SOURCE_DOMAINS, ds.TARGET_DOMAINS, ds.NAME), _classnames(trainer, engine)
    ):
        print("  " + line)
    print(f"--check-data: all {n:,} images decode")
    if not hash_pixels:
        return None
    pixels = _pixel_fingerprint(splits, ds, digests)
    print("--check-data --hash-pixels: a SHA-256 of the bytes per split and domain goes to results.json")
    return pixels
