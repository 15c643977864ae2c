"""``--check-data``: decode every image of a run's splits before training.

Works on both engines: the built-in trainer's item lists and Dassl's
``Datum`` lists both carry ``impath``. Decoding runs in a thread pool (PIL
releases the GIL while decoding) with a progress bar on a terminal.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, List, Optional, Sequence, Tuple

from tqdm import tqdm

from dael_plugin.errors import DAELConfigError


def _try_decode(path: str) -> Optional[str]:
    from dael_plugin.data.images import decode

    try:
        decode(path)
        return None
    except Exception as exc:  # any decoder failure is a bad file
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


def check_images(paths: Sequence[str], workers: int = 2) -> List[Tuple[str, str]]:
    """``(path, reason)`` for each file that cannot be decoded."""
    paths = list(dict.fromkeys(paths))
    bad = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = pool.map(_try_decode, paths, chunksize=64)
        for path, reason in tqdm(
            zip(paths, results), total=len(paths), desc="check-data", disable=not sys.stderr.isatty(), leave=False
        ):
            if reason is not None:
                bad.append((path, reason))
    return bad


def _split_paths(trainer, engine: str) -> Iterable[Tuple[str, Sequence]]:
    if engine == "builtin":
        s = trainer.splits
        yield "train_x", s["train_x"]
        if s["train_u"] is not None and getattr(trainer, "is_da", False):
            yield "train_u", s["train_u"]
        if s["val"]:
            yield "val", s["val"]
        yield "test", s["test"]
    else:
        ds = trainer.dm.dataset
        for name in ("train_x", "train_u", "val", "test"):
            items = getattr(ds, name, None)
            if items:
                yield name, items


def check_trainer_data(trainer: object, engine: str, workers: int) -> None:
    """Decode all images of the run; raise one error line after listing the bad files."""
    paths = [item.impath for _, items in _split_paths(trainer, engine) for item in items]
    bad = check_images(paths, workers)
    n = len(set(paths))
    if bad:
        for path, reason in bad:
            print(f"bad image: {path} ({reason})", file=sys.stderr)
        raise DAELConfigError(
            f"--check-data: {len(bad)} of {n} images cannot be decoded (listed above); "
            "replace or delete them, then rerun"
        )
    print(f"--check-data: all {n:,} images decode")
