"""Image decoding shared by both engines and ``--check-data``."""

from __future__ import annotations

import os
import stat
from typing import Callable, Iterable, List, Optional, Sequence

import numpy as np
from PIL import Image

# How many same-domain replacements a loader tries for one unreadable image.
MAX_REPLACEMENTS = 32


def decode(path: str) -> Image.Image:
    """Decode to RGB (16-bit, RGBA, palette and grey images included); raises on a bad file.

    Only a regular file is opened: opening a FIFO named like an image blocks until a writer comes
    (a run hung, and ignored SIGTERM), and a link to ``/dev/zero`` never ends."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(f"{path} is not a regular file")
    with Image.open(path) as f:
        f.load()
        if f.mode in ("I;16", "I;16B", "I;16L", "I"):
            arr = np.asarray(f, dtype=np.float64)
            peak = 65535.0 if f.mode.startswith("I;16") else max(float(arr.max()), 1.0)
            f = Image.fromarray(np.clip(arr / peak * 255.0, 0, 255).astype(np.uint8), "L")
        elif f.mode in ("RGBA", "LA", "PA") or (f.mode == "P" and "transparency" in f.info):
            f = f.convert("RGBA")
            bg = Image.new("RGBA", f.size, (0, 0, 0, 255))
            f = Image.alpha_composite(bg, f)
        return f.convert("RGB")


# Images up to this many pixels stay decoded in a loader process (64x64: digit
# sets, whose decode dominates their loading; a 100k-image set is ~1.2 GB per worker).
CACHE_PIXELS = 64 * 64


class ReplacingReader:
    """Decode item ``idx``; if it cannot be decoded, remember it and (in training)
    try other items of the same domain, chosen by ``pick(members) -> index``.

    Shared by the built-in loader and the Dassl engine's dataset wrapper, which
    differ only in where the replacement's randomness comes from.
    """

    def __init__(
        self,
        impaths: Iterable[str],
        domains: Sequence[int],
        load: Optional[Callable[[int], Image.Image]] = None,
        cache_pixels: int = CACHE_PIXELS,
    ) -> None:
        self.impaths = list(impaths)
        self.domains = np.asarray(domains, dtype=np.int64)
        self.load = load or self._decode_cached
        self.cache_pixels = cache_pixels
        self._cache = {}
        self.bad: set = set()
        self._members = {}

    def _decode_cached(self, idx: int) -> Image.Image:
        """Decode, keeping small images (at most ``cache_pixels``) decoded in this
        process: with persistent workers, later epochs skip the PNG/JPEG decode."""
        img = self._cache.get(idx)
        if img is None:
            img = decode(self.impaths[idx])
            if self.keeps(img):
                self._cache[idx] = img
        return img

    def keeps(self, img: Image.Image) -> bool:
        """Whether an image this small stays decoded in this process (at most ``cache_pixels``)."""
        return img.width * img.height <= self.cache_pixels

    def _same_domain(self, idx: int) -> np.ndarray:
        d = int(self.domains[idx])
        if d not in self._members:
            self._members[d] = np.flatnonzero(self.domains == d)
        return self._members[d]

    def read(self, idx: int, replace: bool, pick: Callable[[np.ndarray], int]):
        """``(index, image or None, first unreadable path or "")``."""
        bad_path = ""
        for _ in range(MAX_REPLACEMENTS + 1):
            if idx not in self.bad:
                try:
                    return idx, self.load(idx), bad_path
                except Exception:  # any decoder failure: truncated, empty, not an image
                    self.bad.add(idx)
            bad_path = bad_path or self.impaths[idx]
            if not replace:
                return idx, None, bad_path
            idx = int(pick(self._same_domain(idx)))
        from dael_plugin.errors import DAELConfigError

        raise DAELConfigError(
            f"could not find a readable image in domain {int(self.domains[idx])} after {MAX_REPLACEMENTS} "
            f"tries (first unreadable: {bad_path}); run with --check-data to list every bad file"
        )


def not_regular_files(paths: Iterable[str]) -> List[str]:
    """The paths (in order) that are not regular files: a FIFO, a device or a link to one, a
    folder named like an image, a broken link. One ``scandir`` per folder, whose entries carry
    their type, so that checking DomainNet's 600k images costs a few hundred folder reads; a
    missing path counts too."""
    wanted: dict = {}
    for p in paths:
        wanted.setdefault(os.path.dirname(p), set()).add(os.path.basename(p))
    regular = set()
    for folder, names in wanted.items():
        try:
            with os.scandir(folder or ".") as it:
                for entry in it:
                    if entry.name in names and entry.is_file():  # follows links: a link to /dev/zero is not
                        regular.add(os.path.join(folder, entry.name))
        except OSError:
            continue
    return [p for p in paths if p not in regular]


def note_unreadable(seen: set, paths: Iterable[str], what: str) -> None:
    """Log each newly met unreadable path once (``paths``: a batch's ``bad_path`` list)."""
    for p in paths:
        if p and p not in seen:
            seen.add(p)
            print(f"warning: cannot decode {p}; {what}")


REPLACED = "replaced by another image of the same domain"
LEFT_OUT = "left out of the evaluation"
