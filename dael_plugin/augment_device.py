"""Weak and strong views made on the training device, in batch (``TRAINER.DAEL.AUG_ON_DEVICE``).

The loader workers then only decode and resize to uint8 tensors; every
random operation runs here on the whole batch, with its own random draw
*per sample* (which operation, whether it applies, its magnitude, where it
crops or cuts out), as Dassl's per-image PIL transforms do, and the two views
are drawn independently. Nothing loops over samples or syncs the host: an
operation a sample did not draw is computed and discarded by ``torch.where``,
and all geometric operations of a step are one ``grid_sample``.

Why plain PyTorch (``affine_grid``/``grid_sample``, ``conv2d``,
``scatter_add``), measured with ``scripts/bench_device_aug.py`` (README "Speed"):

- torchvision v2 draws one set of parameters per call: per-sample draws need
  a Python loop over the images (on 2 CPU cores and 32x32 images that loop is
  as fast as the batched version here, 26 ms against 29 ms for 128 images, but
  on a GPU it launches every operation once per image);
- kornia's ``RandAugment`` draws its operations once per batch, not per
  sample; its per-sample functional operations time within 30% of the ones
  here (warp 1.1 against 1.4 ms, sharpness 4.1 against 5.7 ms, equalize 1.8
  against 1.7 ms), not enough to add a dependency;
- NVIDIA DALI runs only on a GPU, and the views must also work on CPU.

Supported names: ``random_flip``, ``random_crop``, ``random_translation``,
``cutout``, ``normalize`` and the RandAugment family ``randaugment``,
``randaugment2``, ``randaugment_fixmatch``, ``tv_randaugment`` with Dassl's
or torchvision's operation lists and magnitude rules. Other names are
refused in one line. Pixel results differ slightly from PIL's (bilinear
resampling of float images instead of PIL's integer arithmetic).
"""
from __future__ import annotations

import math
from typing import Callable, List, Sequence, Tuple

import torch
from torch.nn import functional as F

from .errors import DAELConfigError

DEVICE_NAMES = ("random_flip", "random_crop", "random_translation", "cutout", "normalize",
                "randaugment", "randaugment2", "randaugment_fixmatch", "tv_randaugment")

# Operation lists (name, min, max), as in Dassl's dassl/data/transforms/randaugment.py.
DASSL_LIST2 = [("AutoContrast", 0, 1), ("Brightness", 0.1, 1.9), ("Color", 0.1, 1.9), ("Contrast", 0.1, 1.9),
               ("Equalize", 0, 1), ("Identity", 0, 1), ("Invert", 0, 1), ("Posterize", 4, 8), ("Rotate", -30, 30),
               ("Sharpness", 0.1, 1.9), ("ShearX", -0.3, 0.3), ("ShearY", -0.3, 0.3), ("Solarize", 0, 256),
               ("TranslateX", -0.3, 0.3), ("TranslateY", -0.3, 0.3)]
FIXMATCH = [("AutoContrast", 0, 1), ("Brightness", 0.05, 0.95), ("Color", 0.05, 0.95), ("Contrast", 0.05, 0.95),
            ("Equalize", 0, 1), ("Identity", 0, 1), ("Posterize", 4, 8), ("Rotate", -30, 30),
            ("Sharpness", 0.05, 0.95), ("ShearX", -0.3, 0.3), ("ShearY", -0.3, 0.3), ("Solarize", 0, 256),
            ("TranslateX", -0.3, 0.3), ("TranslateY", -0.3, 0.3)]
DASSL_LIST = [("AutoContrast", 0, 1), ("Equalize", 0, 1), ("Invert", 0, 1), ("Rotate", 0, 30), ("Posterize", 4, 8),
              ("Solarize", 0, 256), ("SolarizeAdd", 0, 110), ("Color", 0.1, 1.9), ("Contrast", 0.1, 1.9),
              ("Brightness", 0.1, 1.9), ("Sharpness", 0.1, 1.9), ("ShearX", 0.0, 0.3), ("ShearY", 0.0, 0.3),
              ("CutoutAbs", 0, 40), ("TranslateXabs", 0.0, 100), ("TranslateYabs", 0.0, 100)]
# torchvision's RandAugment: (name, magnitude at bin 30 of 31, signed).
TV_LIST = [("Identity", 0.0, False), ("ShearX", 0.3, True), ("ShearY", 0.3, True), ("TranslateXrel", 150 / 331, True),
           ("TranslateYrel", 150 / 331, True), ("Rotate", 30.0, True), ("Brightness", 0.9, True), ("Color", 0.9, True),
           ("Contrast", 0.9, True), ("Sharpness", 0.9, True), ("Posterize", 4, False), ("Solarize", 1.0, False),
           ("AutoContrast", 0.0, False), ("Equalize", 0.0, False)]
GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXabs", "TranslateYabs",
             "TranslateXrel", "TranslateYrel"}


def check_device_names(choices: Sequence[str], key: str) -> None:
    bad = [c for c in choices if c not in DEVICE_NAMES]
    if bad:
        raise DAELConfigError(f"{key} has {bad}, which AUG_ON_DEVICE cannot make on the device (it makes "
                              f"{list(DEVICE_NAMES)}); drop them or set AUG_ON_DEVICE False")


# -- colour operations on float images in [0, 1], per-sample factors (B,) -------------
def _b(v: torch.Tensor) -> torch.Tensor:
    return v.view(-1, 1, 1, 1)


def _gray(x: torch.Tensor) -> torch.Tensor:
    # PIL's "L" conversion weights (ITU-R 601-2).
    return (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3]) if x.shape[1] == 3 else x


def _blend(a: torch.Tensor, b: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's ImageEnhance: ``a + factor * (b - a)``, clipped."""
    return (a + _b(factor) * (b - a)).clamp_(0, 1)


_CONSTANTS: dict = {}


def _constant(key, make, device, dtype=torch.float32) -> torch.Tensor:
    """A small constant made once per device: no host-to-device copy inside a step."""
    k = (key, str(device), dtype)
    if k not in _CONSTANTS:
        _CONSTANTS[k] = torch.as_tensor(make(), dtype=dtype).to(device)
    return _CONSTANTS[k]


def _sharpen_base(x: torch.Tensor) -> torch.Tensor:
    k = _constant("sharpen", lambda: [[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]], x.device, x.dtype) / 13
    c = x.shape[1]
    blurred = F.conv2d(x, k.expand(c, 1, 3, 3), padding=1, groups=c)
    out = x.clone()  # PIL leaves the one-pixel border as it was
    out[:, :, 1:-1, 1:-1] = blurred[:, :, 1:-1, 1:-1]
    return out


def _autocontrast(x: torch.Tensor) -> torch.Tensor:
    lo = x.amin(dim=(2, 3), keepdim=True)
    hi = x.amax(dim=(2, 3), keepdim=True)
    scale = torch.where(hi > lo, 1.0 / (hi - lo).clamp_min(1e-8), torch.ones_like(hi))
    return torch.where(hi > lo, (x - lo) * scale, x).clamp_(0, 1)


def _equalize(x: torch.Tensor) -> torch.Tensor:
    """PIL's ImageOps.equalize per image and channel, vectorised with one scatter_add."""
    b, c, h, w = x.shape
    levels = (x * 255).round().long().clamp_(0, 255).view(b * c, h * w)
    hist = torch.zeros(b * c, 256, device=x.device, dtype=torch.float32)
    hist.scatter_add_(1, levels, torch.ones_like(levels, dtype=torch.float32))
    # PIL: step = (number of pixels minus the count of the last non-zero bin) // 255
    last_nonzero = (hist > 0).float().cumsum(1).argmax(1, keepdim=True)
    step = torch.div(hist.sum(1, keepdim=True) - hist.gather(1, last_nonzero), 255, rounding_mode="floor")
    cdf = hist.cumsum(1) - hist  # pixels strictly below each level
    lut = torch.div(cdf + torch.div(step, 2, rounding_mode="floor"), step.clamp_min(1), rounding_mode="floor")
    lut = lut.clamp_(0, 255)
    out = lut.gather(1, levels).view(b, c, h, w) / 255.0
    return torch.where((step > 0).view(b, c, 1, 1), out, x)


def _posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    shift = (8 - bits.round().clamp(1, 8)).view(-1, 1, 1, 1)
    q = torch.pow(2.0, shift)
    return torch.floor((x * 255).round() / q) * q / 255.0


def _solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= _b(threshold), 1.0 - x, x)


# -- geometry: one grid_sample for every geometric draw of a step ---------------------
def _warp(x: torch.Tensor, inv: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """Sample ``x`` at ``inv @ [u, v, 1]`` for each output pixel (PIL's AFFINE
    convention: continuous coordinates, pixel (i, j) covers [i, i+1) x [j, j+1));
    outside the image, ``fill`` (B,)."""
    b, c, h, w = x.shape
    # Continuous pixel coordinates <-> grid_sample's [-1, 1] (align_corners=False).
    to_px = _constant(("to_px", h, w), lambda: [[w / 2, 0, w / 2], [0, h / 2, h / 2], [0, 0, 1]], x.device, x.dtype)
    to_norm = _constant(("to_norm", h, w), lambda: [[2 / w, 0, -1], [0, 2 / h, -1], [0, 0, 1]], x.device, x.dtype)
    theta = (to_norm @ inv @ to_px)[:, :2]
    grid = F.affine_grid(theta, [b, c, h, w], align_corners=False)
    ones = torch.ones_like(x[:, :1])
    warped = F.grid_sample(torch.cat([x, ones], 1), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    img, inside = warped[:, :c], warped[:, c:]
    return img + (1 - inside) * _b(fill)


def _eye(b: int, device, dtype) -> torch.Tensor:
    return torch.eye(3, device=device, dtype=dtype).expand(b, 3, 3).clone()


def _geometric_inverse(name: str, v: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """PIL's inverse map (output pixel -> input pixel) for each sample's magnitude ``v``."""
    m = _eye(v.shape[0], v.device, v.dtype)
    if name == "ShearX":
        m[:, 0, 1] = v
    elif name == "ShearY":
        m[:, 1, 0] = v
    elif name in ("TranslateX", "TranslateXrel"):  # a fraction of the width
        m[:, 0, 2] = v * w
    elif name in ("TranslateY", "TranslateYrel"):
        m[:, 1, 2] = v * h
    elif name == "TranslateXabs":  # pixels
        m[:, 0, 2] = v
    elif name == "TranslateYabs":
        m[:, 1, 2] = v
    elif name == "Rotate":  # counter-clockwise by v degrees about the centre, as PIL's rotate
        a = v * (math.pi / 180)
        cos, sin = torch.cos(a), torch.sin(a)
        cx, cy = w / 2, h / 2
        # PIL: inverse map [cos, -sin; sin, cos] about the centre (it negates the angle).
        m[:, 0, 0], m[:, 0, 1] = cos, -sin
        m[:, 1, 0], m[:, 1, 1] = sin, cos
        m[:, 0, 2] = cx - cos * cx + sin * cy
        m[:, 1, 2] = cy - sin * cx - cos * cy
    return m


class RandAugmentBatch:
    """A RandAugment policy drawn per sample: ``n`` slots, each picks an
    operation uniformly, applies it with probability ``p``, at a magnitude
    from ``magnitude(name, lo, hi, u, sign)`` (``u`` uniform and ``sign`` +-1
    per sample). Areas a geometric operation uncovers are black, as PIL's."""

    def __init__(self, ops: List[Tuple[str, float, float]], n: int, p: float, magnitude: Callable) -> None:
        self.ops, self.n, self.p, self.magnitude = ops, n, p, magnitude
        self.geometric = [name in GEOMETRIC for name, _, _ in ops]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        dev = x.device
        for _ in range(self.n):
            pick = torch.randint(len(self.ops), (b,), device=dev)
            on = torch.rand(b, device=dev) < self.p
            u = torch.rand(b, device=dev)
            sign = torch.where(torch.rand(b, device=dev) < 0.5, -1.0, 1.0)
            inv = _eye(b, dev, x.dtype)
            colour = x
            for i, (name, lo, hi) in enumerate(self.ops):
                sel = on & (pick == i)
                v = self.magnitude(name, lo, hi, u, sign)
                if self.geometric[i]:
                    inv = torch.where(sel.view(-1, 1, 1), _geometric_inverse(name, v, h, w), inv)
                    continue
                out = _colour_op(name, x, v)
                if out is not None:
                    colour = torch.where(_b(sel), out, colour)
            geometric = on & _constant(("geometric", tuple(self.geometric)), lambda: self.geometric, dev, torch.bool)[pick]
            x = torch.where(_b(geometric), _warp(x, inv, torch.zeros(b, device=dev)), colour)
        return x


def _colour_op(name: str, x: torch.Tensor, v: torch.Tensor):
    if name == "Identity":
        return None
    if name == "AutoContrast":
        return _autocontrast(x)
    if name == "Equalize":
        return _equalize(x)
    if name == "Invert":
        return 1.0 - x
    if name == "Brightness":
        return _blend(torch.zeros_like(x), x, v)
    if name == "Color":
        return _blend(_gray(x).expand_as(x), x, v)
    if name == "Contrast":
        mean = _gray(x).mean(dim=(1, 2, 3), keepdim=True)
        return _blend(mean.expand_as(x), x, v)
    if name == "Sharpness":
        return _blend(_sharpen_base(x), x, v)
    if name == "Posterize":
        return _posterize(x, v)
    if name == "Solarize":
        return _solarize(x, v)
    if name == "SolarizeAdd":  # Dassl: add v (of 255), clip, solarize at 128
        y = (x + _b(v) / 255).clamp(0, 1)
        return torch.where(y >= 128 / 255, 1.0 - y, y)
    if name == "CutoutAbs":  # Dassl: a v-pixel square at a uniform centre, grey (125, 123, 114)
        return _cutout(x, 1, v, fill=(125 / 255, 123 / 255, 114 / 255))
    raise ValueError(f"unknown RandAugment operation {name!r}")


def _dassl_value(name, v, sign):
    """Dassl's operations: geometric ones flip their sign with p 0.5, posterize keeps int(v) bits,
    solarize's threshold is on 0..256."""
    if name in GEOMETRIC:
        return v * sign
    if name == "Posterize":
        return torch.floor(v)
    if name == "Solarize":
        return v / 255.0
    return v


def _dassl_uniform(name, lo, hi, u, sign):
    return _dassl_value(name, lo + u * (hi - lo), sign)


def _dassl_fixed(m: int):
    def magnitude(name, lo, hi, u, sign):
        return _dassl_value(name, torch.full_like(u, m / 30 * (hi - lo) + lo), sign)
    return magnitude


def _tv(m: int):
    def magnitude(name, top, signed, u, sign):
        if name == "Posterize":  # 8 - round(m / 7.5) bits
            return torch.full_like(u, 8 - round(m / ((31 - 1) / 4)))
        if name == "Solarize":  # threshold from 1.0 down to 0.0
            return torch.full_like(u, 1.0 - m / 30)
        v = torch.full_like(u, top * m / 30) * (sign if signed else 1.0)
        if name in ("Brightness", "Color", "Contrast", "Sharpness"):
            return 1.0 + v
        if name == "Rotate":
            return -v  # torchvision rotates by -angle in PIL's convention
        return v
    return magnitude


class DeviceViews:
    """``views(uint8 (B, C, H, W)) -> [weak, strong(, strong)]`` float views, normalised."""

    def __init__(self, weak: Sequence[str], strong: Sequence[str], num_views: int, inp, node) -> None:
        self.weak = self._pipeline(weak, inp, node)
        self.strong = self._pipeline(strong, inp, node)
        self.num_views = num_views
        self.mean = torch.tensor(inp.PIXEL_MEAN).view(1, -1, 1, 1)
        self.std = torch.tensor(inp.PIXEL_STD).view(1, -1, 1, 1)
        self.normalize = ("normalize" in weak, "normalize" in strong)
        self._stats_key = (tuple(inp.PIXEL_MEAN), tuple(inp.PIXEL_STD))  # made once, not per step

    @staticmethod
    def _pipeline(choices: Sequence[str], inp, node) -> List[Callable]:
        ops: List[Callable] = []
        if "random_translation" in choices:
            ops.append(_random_translation)
        if "random_crop" in choices:
            ops.append(lambda x: _random_crop(x, int(inp.CROP_PADDING)))
        if "random_flip" in choices:
            ops.append(_random_flip)
        n = int(inp.RANDAUGMENT_N)
        if "randaugment" in choices:
            ops.append(RandAugmentBatch(DASSL_LIST, n, 1.0, _dassl_fixed(int(inp.RANDAUGMENT_M))))
        if "randaugment_fixmatch" in choices:
            ops.append(RandAugmentBatch(FIXMATCH, n, 1.0, _dassl_uniform))
        if "randaugment2" in choices:
            ops.append(RandAugmentBatch(DASSL_LIST2, n, 0.6, _dassl_uniform))
        if "tv_randaugment" in choices:
            tv_n = int(node.get("TV_RANDAUGMENT_N", 2)) if node is not None else 2
            tv_m = int(node.get("TV_RANDAUGMENT_M", 9)) if node is not None else 9
            ops.append(RandAugmentBatch(TV_LIST, tv_n, 1.0, _tv(tv_m)))
        if "cutout" in choices:
            ops.append(lambda x: _cutout(x, int(inp.CUTOUT_N), int(inp.CUTOUT_LEN)))
        return ops

    def _run(self, ops, x: torch.Tensor, normalize: bool) -> torch.Tensor:
        for op in ops:
            x = op(x)
        if normalize:
            mean = _constant(("mean", self._stats_key), lambda: self.mean, x.device)
            std = _constant(("std", self._stats_key), lambda: self.std, x.device)
            x = (x - mean) / std
        return x

    def __call__(self, images: torch.Tensor) -> List[torch.Tensor]:
        if images.dtype != torch.uint8:
            raise ValueError(f"AUG_ON_DEVICE expects uint8 images from the loader, got {images.dtype}")
        x = images.float().div_(255)
        views = [self._run(self.weak, x, self.normalize[0])]
        views += [self._run(self.strong, x, self.normalize[1]) for _ in range(self.num_views - 1)]
        return views


def _random_flip(x: torch.Tensor) -> torch.Tensor:
    flip = torch.rand(x.shape[0], device=x.device) < 0.5
    return torch.where(_b(flip), x.flip(-1), x)


def _shift(x: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    b, _, h, w = x.shape
    inv = _eye(b, x.device, x.dtype)
    inv[:, 0, 0], inv[:, 1, 1] = 1 / scale, 1 / scale
    inv[:, 0, 2], inv[:, 1, 2] = dx, dy
    return _warp(x, inv, torch.zeros(b, device=x.device))


def _random_crop(x: torch.Tensor, pad: int) -> torch.Tensor:
    """Pad by ``pad`` (zeros) and crop back at a random place: a random integer shift."""
    b = x.shape[0]
    dx = torch.randint(-pad, pad + 1, (b,), device=x.device).to(x.dtype)
    dy = torch.randint(-pad, pad + 1, (b,), device=x.device).to(x.dtype)
    return _shift(x, dx, dy, torch.ones(b, device=x.device))


def _random_translation(x: torch.Tensor) -> torch.Tensor:
    """Dassl's Random2DTranslation: with p 0.5, enlarge by 1.125 and crop back at a random place."""
    b, _, h, w = x.shape
    on = torch.rand(b, device=x.device) < 0.5
    s = torch.where(on, torch.full((b,), 1.125, device=x.device), torch.ones(b, device=x.device))
    # Offset of the crop in the enlarged image, in enlarged pixels; map back to input pixels.
    ox = torch.floor(torch.rand(b, device=x.device) * (round(w * 1.125) - w + 1)) * on
    oy = torch.floor(torch.rand(b, device=x.device) * (round(h * 1.125) - h + 1)) * on
    return _shift(x, ox / s, oy / s, s)


def _cutout(x: torch.Tensor, n_holes: int, length, fill=None) -> torch.Tensor:
    """Dassl's Cutout: ``n_holes`` squares of side ``length`` (a number, or (B,) per
    sample) at uniform centres, clipped at the border, zeroed (or ``fill`` per channel)."""
    b, c, h, w = x.shape
    ys = torch.arange(h, device=x.device).view(1, h, 1)
    xs = torch.arange(w, device=x.device).view(1, 1, w)
    half = (torch.as_tensor(length, device=x.device, dtype=x.dtype) / 2).reshape(-1, 1, 1)
    hole = torch.zeros(b, h, w, dtype=torch.bool, device=x.device)
    for _ in range(n_holes):
        cy = torch.randint(h, (b, 1, 1), device=x.device)
        cx = torch.randint(w, (b, 1, 1), device=x.device)
        # Dassl: rows max(cy - L//2, 0) .. min(cy + L//2, h), likewise for columns.
        hole |= (ys >= cy - half.floor()) & (ys < cy + half.floor()) & (xs >= cx - half.floor()) & (xs < cx + half.floor())
    hole = hole.unsqueeze(1)
    if fill is None:
        return x.masked_fill(hole, 0.0)
    value = _constant(("fill", tuple(fill[:c])), lambda: fill[:c], x.device, x.dtype).view(1, c, 1, 1)
    return torch.where(hole, value, x)


def build_device_views(cfg, num_views: int, device: torch.device) -> DeviceViews:
    from .config import trainer_node

    node = trainer_node(cfg)
    prefix = f"TRAINER.{str(cfg.TRAINER.NAME).upper()}"
    check_device_names(cfg.INPUT.TRANSFORMS, "INPUT.TRANSFORMS")
    check_device_names(node.STRONG_TRANSFORMS, f"{prefix}.STRONG_TRANSFORMS")
    return DeviceViews(cfg.INPUT.TRANSFORMS, node.STRONG_TRANSFORMS, num_views, cfg.INPUT, node)
