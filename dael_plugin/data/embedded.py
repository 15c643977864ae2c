"""The embedded multi-domain digit set, generated offline from installed packages.

Four 32x32 RGB domains in the spirit of Digit-5, built in a few seconds from
scikit-learn's handwritten digits (``load_digits``), scikit-learn's two
sample photos (``load_sample_images``) and Pillow's bundled font:

- ``hand``: plain handwriting, light ink on black (MNIST-like);
- ``blend``: handwriting blended over natural-photo patches (MNIST-M-like);
- ``street``: coloured, blurred, cluttered with neighbouring digits (SVHN-like);
- ``font``: printed digits in Pillow's font on coloured backgrounds (SYN-like).

The handwriting domains use disjoint writers' samples, and each domain's
train and test splits come from disjoint base digits, so no test image is a
re-styled training image. The output is deterministic and cached under
``<root>/embedded_digits`` in Dassl's folder layout
``<domain>/<split>/<class>/<n>.png``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

import filelock
import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from dael_plugin.errors import DAELConfigError

DATASET_DIR = "embedded_digits"
DOMAINS = ("hand", "blend", "street", "font")
CLASSNAMES = tuple(str(i) for i in range(10))
VERSION = "embedded-digits-v2"
SIZE = 32
RENDERS_PER_DIGIT = 2
TEST_FRACTION = 0.2


def _base_digits() -> Tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


def _photos() -> List[np.ndarray]:
    from sklearn.datasets import load_sample_images

    return [np.asarray(im, dtype=np.float32) for im in load_sample_images().images]


def _ink(img8: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An 8x8 digit as a jittered 32x32 ink mask in [0, 1]."""
    pil = Image.fromarray((img8 * 255).astype(np.uint8))
    side = int(rng.integers(18, 25))
    pil = pil.resize((side, side), Image.BILINEAR)
    pil = pil.rotate(float(rng.uniform(-15, 15)), resample=Image.BILINEAR, expand=True)
    canvas = Image.new("L", (SIZE, SIZE), 0)
    off = (SIZE - pil.size[0]) // 2 + int(rng.integers(-2, 3)), (SIZE - pil.size[1]) // 2 + int(rng.integers(-2, 3))
    canvas.paste(pil, off)
    if rng.random() < 0.5:  # stroke thickness varies between writers
        canvas = canvas.filter(ImageFilter.MaxFilter(3))
    return np.asarray(canvas, dtype=np.float32) / 255.0


def _to_image(arr: np.ndarray) -> Image.Image:
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def _hand(img8, rng, **_) -> Image.Image:
    ink = _ink(img8, rng)
    return _to_image(np.repeat(ink[..., None], 3, axis=2) * 255.0)


def _blend(img8, rng, photos, **_) -> Image.Image:
    ink = _ink(img8, rng)
    photo = photos[int(rng.integers(len(photos)))]
    crop = int(rng.integers(32, 96))
    y, x = int(rng.integers(0, photo.shape[0] - crop)), int(rng.integers(0, photo.shape[1] - crop))
    patch = Image.fromarray(photo[y : y + crop, x : x + crop].astype(np.uint8)).resize((SIZE, SIZE), Image.BILINEAR)
    bg = np.asarray(patch, dtype=np.float32)
    return _to_image(np.abs(bg - ink[..., None] * 255.0))


def _contrasting_colours(rng) -> Tuple[np.ndarray, np.ndarray]:
    bg = rng.uniform(0, 255, 3)
    fg = rng.uniform(0, 255, 3)
    while np.abs(fg - bg).sum() < 200:
        fg = rng.uniform(0, 255, 3)
    return bg, fg


def _shift_x(img: np.ndarray, shift: int) -> np.ndarray:
    """Shift an image sideways, filling with zeros (no wrap-around)."""
    out = np.zeros_like(img)
    if shift > 0:
        out[:, shift:] = img[:, :-shift]
    elif shift < 0:
        out[:, :shift] = img[:, -shift:]
    else:
        out[:] = img
    return out


def _street(img8, rng, neighbours, **_) -> Image.Image:
    ink = _ink(img8, rng)
    clutter = np.zeros_like(ink)
    for side in (-1, 1):  # the edges of the neighbouring house-number digits
        nb = _ink(neighbours[int(rng.integers(len(neighbours)))], rng)
        clutter = np.maximum(clutter, _shift_x(nb, side * (20 + int(rng.integers(-2, 3)))))
    mask = np.maximum(ink, 0.8 * clutter)
    bg, fg = _contrasting_colours(rng)
    arr = bg[None, None] * (1 - mask[..., None]) + fg[None, None] * mask[..., None]
    arr = arr + rng.normal(0, 8, arr.shape)
    img = _to_image(arr).filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.0))))
    return img


def _font(label, rng, font_cache, **_) -> Image.Image:
    size = int(rng.integers(18, 27))
    if size not in font_cache:
        font_cache[size] = ImageFont.load_default(size=size)
    font = font_cache[size]
    bg, fg = _contrasting_colours(rng)
    tile = Image.new("RGB", (48, 48), tuple(int(v) for v in bg))
    draw = ImageDraw.Draw(tile)
    box = draw.textbbox((0, 0), str(label), font=font)
    w, h = box[2] - box[0], box[3] - box[1]
    pos = (24 - w // 2 - box[0] + int(rng.integers(-2, 3)), 24 - h // 2 - box[1] + int(rng.integers(-2, 3)))
    draw.text(pos, str(label), fill=tuple(int(v) for v in fg), font=font)
    tile = tile.rotate(float(rng.uniform(-12, 12)), resample=Image.BILINEAR, fillcolor=tuple(int(v) for v in bg))
    return tile.crop((8, 8, 40, 40))


def _split_writers(labels: np.ndarray, n_groups: int, rng) -> List[np.ndarray]:
    """Partition sample indices into class-stratified, disjoint groups."""
    groups: List[List[int]] = [[] for _ in range(n_groups)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        for g, part in enumerate(np.array_split(idx, n_groups)):
            groups[g].extend(part.tolist())
    return [np.array(sorted(g)) for g in groups]


def _train_test(indices: np.ndarray, labels: np.ndarray, rng) -> Dict[str, np.ndarray]:
    test = []
    for c in np.unique(labels[indices]):
        idx = rng.permutation(indices[labels[indices] == c])
        test.extend(idx[: int(round(len(idx) * TEST_FRACTION))].tolist())
    test_set = set(test)
    return {"train": np.array([i for i in indices if i not in test_set]), "test": np.array(sorted(test))}


def generate(out_dir: str, seed: int = 0) -> Dict[str, Dict[str, int]]:
    """Write the set to ``out_dir``; returns image counts per domain and split."""
    rng = np.random.default_rng(seed)
    images, labels = _base_digits()
    photos = _photos()
    writer_groups = _split_writers(labels, 3, rng)
    counts: Dict[str, Dict[str, int]] = {}
    font_cache: dict = {}
    for d, domain in enumerate(DOMAINS):
        drng = np.random.default_rng([seed, d])
        group = writer_groups[min(d, 2)] if domain != "font" else writer_groups[d % 3]
        splits = _train_test(group, labels, drng)
        counts[domain] = {}
        for split, idx in splits.items():
            n = 0
            for i in idx:
                for _ in range(RENDERS_PER_DIGIT):
                    label = int(labels[i])
                    if domain == "hand":
                        img = _hand(images[i], drng)
                    elif domain == "blend":
                        img = _blend(images[i], drng, photos=photos)
                    elif domain == "street":
                        img = _street(images[i], drng, neighbours=images[group])
                    else:
                        img = _font(label, drng, font_cache)
                    folder = os.path.join(out_dir, domain, split, CLASSNAMES[label])
                    os.makedirs(folder, exist_ok=True)
                    img.save(os.path.join(folder, f"{n:05d}.png"))
                    n += 1
            counts[domain][split] = n
    return counts


def _stamp(target: str) -> Optional[str]:
    try:
        with open(os.path.join(target, "VERSION")) as f:
            return f.read().strip()
    except OSError:
        return None


def ensure_embedded(root: str, seed: int = 0) -> str:
    """Generate the set under ``<root>/embedded_digits`` unless a matching copy is there.

    Safe when many runs start at once on a fresh root (a sweep): one generates, under the kernel's
    lock on ``<root>/.embedded_digits.lock``, into a temporary folder renamed into place when whole;
    the others wait and then read it. Nothing is ever deleted but this function's own unfinished
    temporary folders (left by a run killed while generating): a folder of that name holding
    another version, or anything not made here, is one error line, never overwritten.
    """
    root = os.path.abspath(os.path.expanduser(root or "."))
    target = os.path.join(root, DATASET_DIR)
    expected = f"{VERSION} seed={seed}"
    if _stamp(target) == expected:
        return target
    try:
        os.makedirs(root, exist_ok=True)
        with filelock.FileLock(os.path.join(root, f".{DATASET_DIR}.lock")):
            if _stamp(target) == expected:  # another run made it while this one waited
                return target
            if os.path.lexists(target):
                found = _stamp(target)
                raise DAELConfigError(
                    f"{target} exists but is not the embedded set this version makes "
                    f"({'its VERSION says ' + repr(found) if found else 'no VERSION file'}, expected {expected!r}); "
                    "nothing was changed there: move it aside, or pass another --root"
                )
            for stale in os.listdir(root):  # unfinished generations of killed runs (this lock is held)
                if stale.startswith(f".{DATASET_DIR}-") and os.path.isdir(os.path.join(root, stale)):
                    shutil.rmtree(os.path.join(root, stale), ignore_errors=True)
            tmp = tempfile.mkdtemp(prefix=f".{DATASET_DIR}-", dir=root)
            # Said once, with the path: a typo in --root would otherwise build a second set quietly.
            print(
                f"dael_plugin: no embedded set under {root}: generating it there (about 20 MB, once); "
                "if --root has a typo, stop now and fix it",
                file=sys.stderr,
            )
            try:
                generate(tmp, seed)
                with open(os.path.join(tmp, "VERSION"), "w") as f:
                    f.write(expected + "\n")
                umask = os.umask(0)
                os.umask(umask)
                for dirpath, _, _ in os.walk(tmp):  # mkdtemp made it private; the set is for everyone
                    os.chmod(dirpath, 0o777 & ~umask)
                os.rename(tmp, target)  # whole or not at all: readers never see a partial set
            finally:
                if os.path.isdir(tmp):
                    shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        raise DAELConfigError(
            f"cannot write the embedded set under {root} ({exc.strerror or exc}); pass a writable --root"
        ) from None
    return target
