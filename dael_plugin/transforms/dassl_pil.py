"""Dassl's own transforms, written anew for the host path of both engines.

Each class here is the operation Dassl's ``build_transform`` builds for one of its names, with the
same operations, ranges, probabilities and parameters, drawn in the same order from the same
random streams (Python's ``random``, NumPy's global stream, torch's default generator), so a view
seeded as Dassl's is seeded is the same image bit for bit (``tests/test_dassl_transforms.py``
holds every name against Dassl 0.6.3's own code on real images). The references are Dassl's
``dassl/data/transforms/transforms.py``, ``randaugment.py`` and ``autoaugment.py``:

- geometric RandAugment operations (rotate, shear, translate) resample with PIL's default,
  nearest, and fill with black; each flips its sign with probability 0.5 *inside* the operation;
- ``RandAugment2`` draws ``n`` operations with replacement, then per operation whether it applies
  (p 0.6) and its magnitude, uniform in the operation's range;
- the AutoAugment policies draw one of their sub-policies, then each half with its probability;
  shear resamples bicubically, and shear and translate fill with grey (128, 128, 128);
- ``Cutout`` draws its centres from NumPy, ``GaussianNoise`` its coin from ``random`` and its noise
  from torch.

Two places where Dassl 0.6.3 itself fails under NumPy 1.24 or newer (``np.int`` is gone): its
``SolarizeAdd`` (drawn by ``randaugment``) and every AutoAugment policy's constructor. Here they
compute what Dassl's code computes with the alias it was written for (``np.int`` is ``int``).

Long because it is Dassl's transform module, one idea: its operations and their three
AutoAugment policy tables (75 sub-policies), which must sit beside the operations they name.
"""

from __future__ import annotations

import random
from typing import Callable, List, Sequence, Tuple

import numpy as np
import torch
import torchvision.transforms.functional as TF
from PIL import Image, ImageDraw, ImageEnhance, ImageOps
from torchvision.transforms import InterpolationMode

Op = Callable[[Image.Image, float], Image.Image]


def _signed(v: float) -> float:
    """Dassl's geometric operations: the magnitude's sign flips with probability 0.5."""
    return -v if random.random() > 0.5 else v


def _affine(img: Image.Image, coeffs: Tuple[float, ...]) -> Image.Image:
    return img.transform(img.size, Image.AFFINE, coeffs)  # PIL's default: nearest, black fill


# -- RandAugment's operations (randaugment.py) --------------------------------------------------
def shear_x(img, v):
    return _affine(img, (1, _signed(v), 0, 0, 1, 0))


def shear_y(img, v):
    return _affine(img, (1, 0, 0, _signed(v), 1, 0))


def translate_x(img, v):  # a fraction of the width
    return _affine(img, (1, 0, _signed(v) * img.size[0], 0, 1, 0))


def translate_y(img, v):
    return _affine(img, (1, 0, 0, 0, 1, _signed(v) * img.size[1]))


def translate_x_abs(img, v):  # pixels
    return _affine(img, (1, 0, _signed(v), 0, 1, 0))


def translate_y_abs(img, v):
    return _affine(img, (1, 0, 0, 0, 1, _signed(v)))


def rotate(img, v):
    return img.rotate(_signed(v))


def auto_contrast(img, _):
    return ImageOps.autocontrast(img)


def invert(img, _):
    return ImageOps.invert(img)


def equalize(img, _):
    return ImageOps.equalize(img)


def solarize(img, v):
    return ImageOps.solarize(img, v)


def solarize_add(img, v):
    """Add ``v`` to every value (truncated back to uint8 after clipping), then solarize at 128."""
    added = np.clip(np.asarray(img).astype(int) + v, 0, 255).astype(np.uint8)
    return ImageOps.solarize(Image.fromarray(added), 128)


def posterize(img, v):
    return ImageOps.posterize(img, int(v))


def contrast(img, v):
    return ImageEnhance.Contrast(img).enhance(v)


def color(img, v):
    return ImageEnhance.Color(img).enhance(v)


def brightness(img, v):
    return ImageEnhance.Brightness(img).enhance(v)


def sharpness(img, v):
    return ImageEnhance.Sharpness(img).enhance(v)


def cutout_abs(img, v):
    """A grey (125, 123, 114) square of side ``v`` pixels. Dassl draws its corner with
    ``np.random.uniform(w)``, which is ``uniform(low=w, high=1.0)``: kept as drawn."""
    w, h = img.size
    x0, y0 = np.random.uniform(w), np.random.uniform(h)
    x0, y0 = int(max(0, x0 - v / 2.0)), int(max(0, y0 - v / 2.0))
    out = img.copy()
    ImageDraw.Draw(out).rectangle((x0, y0, min(w, x0 + v), min(h, y0 + v)), (125, 123, 114))
    return out


def identity(img, _):
    return img


# (operation, min, max), in Dassl's list order: the order random.choices indexes.
RANDAUGMENT_LIST: Sequence[Tuple[Op, float, float]] = (
    (auto_contrast, 0, 1), (equalize, 0, 1), (invert, 0, 1), (rotate, 0, 30), (posterize, 4, 8),
    (solarize, 0, 256), (solarize_add, 0, 110), (color, 0.1, 1.9), (contrast, 0.1, 1.9),
    (brightness, 0.1, 1.9), (sharpness, 0.1, 1.9), (shear_x, 0.0, 0.3), (shear_y, 0.0, 0.3),
    (cutout_abs, 0, 40), (translate_x_abs, 0.0, 100), (translate_y_abs, 0.0, 100),
)  # fmt: skip
RANDAUGMENT2_LIST: Sequence[Tuple[Op, float, float]] = (
    (auto_contrast, 0, 1), (brightness, 0.1, 1.9), (color, 0.1, 1.9), (contrast, 0.1, 1.9),
    (equalize, 0, 1), (identity, 0, 1), (invert, 0, 1), (posterize, 4, 8), (rotate, -30, 30),
    (sharpness, 0.1, 1.9), (shear_x, -0.3, 0.3), (shear_y, -0.3, 0.3), (solarize, 0, 256),
    (translate_x, -0.3, 0.3), (translate_y, -0.3, 0.3),
)  # fmt: skip
FIXMATCH_LIST: Sequence[Tuple[Op, float, float]] = (
    (auto_contrast, 0, 1), (brightness, 0.05, 0.95), (color, 0.05, 0.95), (contrast, 0.05, 0.95),
    (equalize, 0, 1), (identity, 0, 1), (posterize, 4, 8), (rotate, -30, 30), (sharpness, 0.05, 0.95),
    (shear_x, -0.3, 0.3), (shear_y, -0.3, 0.3), (solarize, 0, 256), (translate_x, -0.3, 0.3),
    (translate_y, -0.3, 0.3),
)  # fmt: skip


class RandAugment:
    """Dassl's ``randaugment``: ``n`` operations drawn with replacement, each at magnitude
    ``m`` of 30 of its range."""

    def __init__(self, n: int = 2, m: int = 10) -> None:
        if not 0 <= m <= 30:
            raise ValueError(f"randaugment's magnitude must be in [0, 30], not {m}")
        self.n, self.m = n, m

    def __call__(self, img):
        for op, lo, hi in random.choices(RANDAUGMENT_LIST, k=self.n):
            img = op(img, (self.m / 30) * (hi - lo) + lo)
        return img


class RandAugment2:
    """Dassl's ``randaugment2`` (DAEL's strong view): ``n`` operations drawn with replacement;
    each applies with probability ``p``, at a magnitude drawn uniformly in its range."""

    def __init__(self, n: int = 2, p: float = 0.6) -> None:
        self.n, self.p = n, p

    def __call__(self, img):
        for op, lo, hi in random.choices(RANDAUGMENT2_LIST, k=self.n):
            if random.random() > self.p:
                continue
            img = op(img, random.random() * (hi - lo) + lo)
        return img


class RandAugmentFixMatch:
    """Dassl's ``randaugment_fixmatch``: FixMatch's list, every drawn operation applied at a
    magnitude drawn uniformly in its range."""

    def __init__(self, n: int = 2) -> None:
        self.n = n

    def __call__(self, img):
        for op, lo, hi in random.choices(FIXMATCH_LIST, k=self.n):
            img = op(img, random.random() * (hi - lo) + lo)
        return img


# -- AutoAugment's policies (autoaugment.py) ----------------------------------------------------
GREY = (128, 128, 128)


def _pm() -> int:
    return random.choice([-1, 1])


def _rotate_with_fill(img, v):
    rot = img.convert("RGBA").rotate(v)
    return Image.composite(rot, Image.new("RGBA", rot.size, (128,) * 4), rot).convert(img.mode)


def _aa_enhance(kind) -> Op:
    return lambda img, v: kind(img).enhance(1 + v * _pm())


AA_OPS = {
    "shearX": lambda img, v: img.transform(img.size, Image.AFFINE, (1, v * _pm(), 0, 0, 1, 0), Image.BICUBIC,
                                           fillcolor=GREY),
    "shearY": lambda img, v: img.transform(img.size, Image.AFFINE, (1, 0, 0, v * _pm(), 1, 0), Image.BICUBIC,
                                           fillcolor=GREY),
    "translateX": lambda img, v: img.transform(img.size, Image.AFFINE, (1, 0, v * img.size[0] * _pm(), 0, 1, 0),
                                               fillcolor=GREY),
    "translateY": lambda img, v: img.transform(img.size, Image.AFFINE, (1, 0, 0, 0, 1, v * img.size[1] * _pm()),
                                               fillcolor=GREY),
    "rotate": _rotate_with_fill,
    "color": _aa_enhance(ImageEnhance.Color),
    "posterize": lambda img, v: ImageOps.posterize(img, v),
    "solarize": lambda img, v: ImageOps.solarize(img, v),
    "contrast": _aa_enhance(ImageEnhance.Contrast),
    "sharpness": _aa_enhance(ImageEnhance.Sharpness),
    "brightness": _aa_enhance(ImageEnhance.Brightness),
    "autocontrast": lambda img, v: ImageOps.autocontrast(img),
    "equalize": lambda img, v: ImageOps.equalize(img),
    "invert": lambda img, v: ImageOps.invert(img),
}  # fmt: skip


def _aa_magnitudes() -> dict:
    """Each operation's ten magnitudes (a sub-policy names an index)."""
    ten = lambda lo, hi: np.linspace(lo, hi, 10)  # noqa: E731
    return {
        "shearX": ten(0, 0.3), "shearY": ten(0, 0.3), "translateX": ten(0, 150 / 331),
        "translateY": ten(0, 150 / 331), "rotate": ten(0, 30), "color": ten(0.0, 0.9),
        "posterize": np.round(ten(8, 4), 0).astype(int), "solarize": ten(256, 0), "contrast": ten(0.0, 0.9),
        "sharpness": ten(0.0, 0.9), "brightness": ten(0.0, 0.9),
        "autocontrast": [0] * 10, "equalize": [0] * 10, "invert": [0] * 10,
    }  # fmt: skip


class SubPolicy:
    """Two operations, each applied with its own probability at its indexed magnitude."""

    def __init__(self, p1: float, op1: str, idx1: int, p2: float, op2: str, idx2: int) -> None:
        mags = _aa_magnitudes()
        self.halves = ((p1, AA_OPS[op1], mags[op1][idx1]), (p2, AA_OPS[op2], mags[op2][idx2]))

    def __call__(self, img):
        for p, op, v in self.halves:
            if random.random() < p:
                img = op(img, v)
        return img


class AutoAugmentPolicy:
    """One of the policy's sub-policies, drawn uniformly (``random.randint``)."""

    table: Sequence[tuple] = ()

    def __init__(self) -> None:
        self.policies = [SubPolicy(*row) for row in self.table]

    def __call__(self, img):
        return self.policies[random.randint(0, len(self.policies) - 1)](img)


class ImageNetPolicy(AutoAugmentPolicy):
    table = (
        (0.4, "posterize", 8, 0.6, "rotate", 9), (0.6, "solarize", 5, 0.6, "autocontrast", 5),
        (0.8, "equalize", 8, 0.6, "equalize", 3), (0.6, "posterize", 7, 0.6, "posterize", 6),
        (0.4, "equalize", 7, 0.2, "solarize", 4), (0.4, "equalize", 4, 0.8, "rotate", 8),
        (0.6, "solarize", 3, 0.6, "equalize", 7), (0.8, "posterize", 5, 1.0, "equalize", 2),
        (0.2, "rotate", 3, 0.6, "solarize", 8), (0.6, "equalize", 8, 0.4, "posterize", 6),
        (0.8, "rotate", 8, 0.4, "color", 0), (0.4, "rotate", 9, 0.6, "equalize", 2),
        (0.0, "equalize", 7, 0.8, "equalize", 8), (0.6, "invert", 4, 1.0, "equalize", 8),
        (0.6, "color", 4, 1.0, "contrast", 8), (0.8, "rotate", 8, 1.0, "color", 2),
        (0.8, "color", 8, 0.8, "solarize", 7), (0.4, "sharpness", 7, 0.6, "invert", 8),
        (0.6, "shearX", 5, 1.0, "equalize", 9), (0.4, "color", 0, 0.6, "equalize", 3),
        (0.4, "equalize", 7, 0.2, "solarize", 4), (0.6, "solarize", 5, 0.6, "autocontrast", 5),
        (0.6, "invert", 4, 1.0, "equalize", 8), (0.6, "color", 4, 1.0, "contrast", 8),
        (0.8, "equalize", 8, 0.6, "equalize", 3),
    )  # fmt: skip


class CIFAR10Policy(AutoAugmentPolicy):
    table = (
        (0.1, "invert", 7, 0.2, "contrast", 6), (0.7, "rotate", 2, 0.3, "translateX", 9),
        (0.8, "sharpness", 1, 0.9, "sharpness", 3), (0.5, "shearY", 8, 0.7, "translateY", 9),
        (0.5, "autocontrast", 8, 0.9, "equalize", 2), (0.2, "shearY", 7, 0.3, "posterize", 7),
        (0.4, "color", 3, 0.6, "brightness", 7), (0.3, "sharpness", 9, 0.7, "brightness", 9),
        (0.6, "equalize", 5, 0.5, "equalize", 1), (0.6, "contrast", 7, 0.6, "sharpness", 5),
        (0.7, "color", 7, 0.5, "translateX", 8), (0.3, "equalize", 7, 0.4, "autocontrast", 8),
        (0.4, "translateY", 3, 0.2, "sharpness", 6), (0.9, "brightness", 6, 0.2, "color", 8),
        (0.5, "solarize", 2, 0.0, "invert", 3), (0.2, "equalize", 0, 0.6, "autocontrast", 0),
        (0.2, "equalize", 8, 0.6, "equalize", 4), (0.9, "color", 9, 0.6, "equalize", 6),
        (0.8, "autocontrast", 4, 0.2, "solarize", 8), (0.1, "brightness", 3, 0.7, "color", 0),
        (0.4, "solarize", 5, 0.9, "autocontrast", 3), (0.9, "translateY", 9, 0.7, "translateY", 9),
        (0.9, "autocontrast", 2, 0.8, "solarize", 3), (0.8, "equalize", 8, 0.1, "invert", 3),
        (0.7, "translateY", 9, 0.9, "autocontrast", 1),
    )  # fmt: skip


class SVHNPolicy(AutoAugmentPolicy):
    table = (
        (0.9, "shearX", 4, 0.2, "invert", 3), (0.9, "shearY", 8, 0.7, "invert", 5),
        (0.6, "equalize", 5, 0.6, "solarize", 6), (0.9, "invert", 3, 0.6, "equalize", 3),
        (0.6, "equalize", 1, 0.9, "rotate", 3), (0.9, "shearX", 4, 0.8, "autocontrast", 3),
        (0.9, "shearY", 8, 0.4, "invert", 5), (0.9, "shearY", 5, 0.2, "solarize", 6),
        (0.9, "invert", 6, 0.8, "autocontrast", 1), (0.6, "equalize", 3, 0.9, "rotate", 3),
        (0.9, "shearX", 4, 0.3, "solarize", 3), (0.8, "shearY", 8, 0.7, "invert", 4),
        (0.9, "equalize", 5, 0.6, "translateY", 6), (0.9, "invert", 4, 0.6, "equalize", 7),
        (0.3, "contrast", 3, 0.8, "rotate", 4), (0.8, "invert", 5, 0.0, "translateY", 2),
        (0.7, "shearY", 6, 0.4, "solarize", 8), (0.6, "invert", 4, 0.8, "rotate", 4),
        (0.3, "shearY", 7, 0.9, "translateX", 3), (0.1, "shearX", 6, 0.6, "invert", 5),
        (0.7, "solarize", 2, 0.6, "translateY", 7), (0.8, "shearY", 4, 0.8, "invert", 8),
        (0.7, "shearX", 9, 0.8, "translateY", 3), (0.8, "shearY", 5, 0.7, "autocontrast", 3),
        (0.7, "shearX", 2, 0.1, "invert", 5),
    )  # fmt: skip


# -- Dassl's own classes in transforms.py ---------------------------------------------------------
class Random2DTranslation:
    """With probability ``p`` (drawn as ``random.uniform(0, 1) > p`` keeps the image), enlarge to
    1.125 times the size and crop back at a random corner; otherwise resize to the size. Dassl
    fixes bilinear interpolation here, whatever ``INPUT.INTERPOLATION`` says."""

    def __init__(self, height: int, width: int, p: float = 0.5,
                 interpolation: InterpolationMode = InterpolationMode.BILINEAR) -> None:  # fmt: skip
        self.height, self.width, self.p, self.interpolation = height, width, p, interpolation

    def __call__(self, img):
        if random.uniform(0, 1) > self.p:
            return TF.resize(img, [self.height, self.width], interpolation=self.interpolation)
        big_w, big_h = int(round(self.width * 1.125)), int(round(self.height * 1.125))
        img = TF.resize(img, [big_h, big_w], interpolation=self.interpolation)
        left = int(round(random.uniform(0, big_w - self.width)))
        top = int(round(random.uniform(0, big_h - self.height)))
        return TF.crop(img, top, left, self.height, self.width)


class Cutout:
    """``n_holes`` squares of side ``length`` zeroed in a (C, H, W) tensor, centres from NumPy's
    global stream (rows ``[cy - L//2, cy + L//2)`` clipped to the image, likewise columns)."""

    def __init__(self, n_holes: int = 1, length: int = 16) -> None:
        self.n_holes, self.length = n_holes, length

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        h, w = img.size(1), img.size(2)
        mask = np.ones((h, w), np.float32)
        half = self.length // 2
        for _ in range(self.n_holes):
            cy, cx = np.random.randint(h), np.random.randint(w)
            mask[
                np.clip(cy - half, 0, h) : np.clip(cy + half, 0, h), np.clip(cx - half, 0, w) : np.clip(cx + half, 0, w)
            ] = 0
        return img * torch.from_numpy(mask).expand_as(img)


class GaussianNoise:
    """With probability ``p`` (a coin from ``random``), add N(mean, std) noise from torch."""

    def __init__(self, mean: float = 0, std: float = 0.15, p: float = 0.5) -> None:
        self.mean, self.std, self.p = mean, std, p

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        if random.uniform(0, 1) > self.p:
            return img
        return img + (torch.randn(img.size()) * self.std + self.mean)


class InstanceNormalization:
    """Per-channel standardisation of a (C, H, W) tensor (torch's unbiased std, ``eps`` on it)."""

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps = eps

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        c = img.shape[0]
        flat = img.reshape(c, -1)
        return (img - flat.mean(1).view(c, 1, 1)) / (flat.std(1).view(c, 1, 1) + self.eps)


__all__: List[str] = [
    "CIFAR10Policy",
    "Cutout",
    "FIXMATCH_LIST",
    "GaussianNoise",
    "ImageNetPolicy",
    "InstanceNormalization",
    "RANDAUGMENT2_LIST",
    "RANDAUGMENT_LIST",
    "RandAugment",
    "RandAugment2",
    "RandAugmentFixMatch",
    "Random2DTranslation",
    "SVHNPolicy",
]
