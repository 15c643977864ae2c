"""The batched kernels of the views made on the device (:mod:`dael_plugin.transforms.device`).

Colour operations, affine maps as six coefficients per sample, RandAugment drawn per sample,
cutout, and the leading geometric operations as one map. Every function takes a batch and
draws per sample; none loops over samples or reads a device value on the host.

Why plain PyTorch (``affine_grid``/``grid_sample``, ``conv2d``,
``scatter_add``), measured with ``scripts/bench_device_aug.py`` (README "Speed"):

- torchvision v2 draws one set of parameters per call: per-sample draws need
  a Python loop over the images (on 2 CPU cores and 32x32 images that loop is
  as the batched version here, but on a GPU it launches every
  operation once per image);
- kornia's ``RandAugment`` draws its operations once per batch, not per
  sample; its per-sample functional operations time within 30% of the ones
  here (warp 1.1 against 1.4 ms, sharpness 4.1 against 5.7 ms, equalize 1.8
  against 1.7 ms), not enough to add a dependency;
- NVIDIA DALI runs only on a GPU, and the views must also work on CPU.

Long because it is the kernels of one batched pipeline (colour, affine, RandAugment, cutout), which
share their per-sample draws and parameter tables; each kernel is a short function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch.nn import functional as F

# Operation lists (name, min, max), as in Dassl's dassl/data/transforms/randaugment.py.
DASSL_LIST2 = [
    ("AutoContrast", 0, 1),
    ("Brightness", 0.1, 1.9),
    ("Color", 0.1, 1.9),
    ("Contrast", 0.1, 1.9),
    ("Equalize", 0, 1),
    ("Identity", 0, 1),
    ("Invert", 0, 1),
    ("Posterize", 4, 8),
    ("Rotate", -30, 30),
    ("Sharpness", 0.1, 1.9),
    ("ShearX", -0.3, 0.3),
    ("ShearY", -0.3, 0.3),
    ("Solarize", 0, 256),
    ("TranslateX", -0.3, 0.3),
    ("TranslateY", -0.3, 0.3),
]
FIXMATCH = [
    ("AutoContrast", 0, 1),
    ("Brightness", 0.05, 0.95),
    ("Color", 0.05, 0.95),
    ("Contrast", 0.05, 0.95),
    ("Equalize", 0, 1),
    ("Identity", 0, 1),
    ("Posterize", 4, 8),
    ("Rotate", -30, 30),
    ("Sharpness", 0.05, 0.95),
    ("ShearX", -0.3, 0.3),
    ("ShearY", -0.3, 0.3),
    ("Solarize", 0, 256),
    ("TranslateX", -0.3, 0.3),
    ("TranslateY", -0.3, 0.3),
]
DASSL_LIST = [
    ("AutoContrast", 0, 1),
    ("Equalize", 0, 1),
    ("Invert", 0, 1),
    ("Rotate", 0, 30),
    ("Posterize", 4, 8),
    ("Solarize", 0, 256),
    ("SolarizeAdd", 0, 110),
    ("Color", 0.1, 1.9),
    ("Contrast", 0.1, 1.9),
    ("Brightness", 0.1, 1.9),
    ("Sharpness", 0.1, 1.9),
    ("ShearX", 0.0, 0.3),
    ("ShearY", 0.0, 0.3),
    ("CutoutAbs", 0, 40),
    ("TranslateXabs", 0.0, 100),
    ("TranslateYabs", 0.0, 100),
]
# torchvision's RandAugment: (name, magnitude at bin 30 of 31, signed).
TV_LIST = [
    ("Identity", 0.0, False),
    ("ShearX", 0.3, True),
    ("ShearY", 0.3, True),
    ("TranslateXrel", 150 / 331, True),
    ("TranslateYrel", 150 / 331, True),
    ("Rotate", 30.0, True),
    ("Brightness", 0.9, True),
    ("Color", 0.9, True),
    ("Contrast", 0.9, True),
    ("Sharpness", 0.9, True),
    ("Posterize", 4, False),
    ("Solarize", 1.0, False),
    ("AutoContrast", 0.0, False),
    ("Equalize", 0.0, False),
]
GEOMETRIC = {
    "Rotate",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "TranslateXabs",
    "TranslateYabs",
    "TranslateXrel",
    "TranslateYrel",
}


# -- colour operations on float images in [0, 1], per-sample factors (B,) -------------
def _b(v: torch.Tensor) -> torch.Tensor:
    return v.view(-1, 1, 1, 1)


def _gray(x: torch.Tensor) -> torch.Tensor:
    # PIL's "L" conversion weights (ITU-R 601-2).
    if x.shape[1] != 3:
        return x
    return torch.add(x[:, 0:1] * 0.299, x[:, 1:2], alpha=0.587).add_(x[:, 2:3], alpha=0.114)


def _blend(a: torch.Tensor, b: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's ImageEnhance: ``a + factor * (b - a)``, clipped."""
    return torch.lerp(a, b, _b(factor)).clamp_(0, 1)


def _sharpen_base(x: torch.Tensor) -> torch.Tensor:
    """PIL's SMOOTH filter (3x3, centre weight 5, sum 13); PIL leaves the one-pixel border as it was."""
    g = geometry(x.shape[2], x.shape[3], x.device)
    blurred = F.conv2d(x, g.smooth[: x.shape[1]], padding=1, groups=x.shape[1])
    return torch.where(g.border, x, blurred)


def _autocontrast(x: torch.Tensor) -> torch.Tensor:
    lo = x.amin(dim=(2, 3), keepdim=True)
    hi = x.amax(dim=(2, 3), keepdim=True)
    span = hi - lo
    return torch.where(span > 0, (x - lo) / span.clamp_min(1e-8), x).clamp_(0, 1)


def _equalize(x: torch.Tensor) -> torch.Tensor:
    """PIL's ImageOps.equalize per image and channel, vectorised with one scatter_add."""
    b, c, h, w = x.shape
    levels = (x * 255).round_().long().clamp_(0, 255).view(b * c, h * w)
    hist = torch.zeros(b * c, 256, device=x.device, dtype=torch.float32)
    hist.scatter_add_(1, levels, torch.ones_like(levels, dtype=torch.float32))
    # PIL: step = (number of pixels minus the count of the last non-zero bin) // 255
    last_nonzero = (hist > 0).float().cumsum(1).argmax(1, keepdim=True)
    step = torch.div(hist.sum(1, keepdim=True) - hist.gather(1, last_nonzero), 255, rounding_mode="floor")
    cdf = hist.cumsum(1) - hist  # pixels strictly below each level
    lut = torch.div(cdf + torch.div(step, 2, rounding_mode="floor"), step.clamp_min(1), rounding_mode="floor")
    out = lut.clamp_(0, 255).gather(1, levels).view(b, c, h, w) / 255.0
    return torch.where((step > 0).view(b, c, 1, 1), out, x)


def _posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """Keep ``floor(bits)`` bits (Dassl: ``int(v)``)."""
    q = torch.pow(2.0, 8 - _b(bits).floor().clamp(1, 8))
    return torch.floor((x * 255).round_() / q) * q / 255.0


def _solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= _b(threshold), 1.0 - x, x)


def _colour_op(name: str, x: torch.Tensor, v: torch.Tensor) -> Optional[torch.Tensor]:
    """A RandAugment colour operation with per-sample value ``v`` (Identity: None)."""
    if name == "Identity":
        return None
    if name == "AutoContrast":
        return _autocontrast(x)
    if name == "Equalize":
        return _equalize(x)
    if name == "Invert":
        return 1.0 - x
    if name == "Brightness":
        return (x * _b(v)).clamp_(0, 1)
    if name == "Color":
        return _blend(_gray(x).expand_as(x), x, v)
    if name == "Contrast":
        return _blend(_gray(x).mean(dim=(1, 2, 3), keepdim=True).expand_as(x), x, v)
    if name == "Sharpness":
        return _blend(_sharpen_base(x), x, v)
    if name == "Posterize":
        return _posterize(x, v)
    if name == "Solarize":
        return _solarize(x, v)
    if name == "SolarizeAdd":  # Dassl: add v (of 255), clip, solarize at 128
        y = (x + _b(v) / 255).clamp_(0, 1)
        return torch.where(y >= 128 / 255, 1.0 - y, y)
    if name == "CutoutAbs":  # Dassl: a v-pixel square at a uniform centre, grey (125, 123, 114)
        return _cutout(x, 1, v, fill=geometry(x.shape[2], x.shape[3], x.device).grey)
    raise ValueError(f"unknown RandAugment operation {name!r}")


# -- geometry: inverse affine maps as six coefficients per sample ---------------------
# An inverse map (output pixel -> input pixel, PIL's AFFINE convention: continuous
# coordinates, pixel (i, j) covers [i, i+1) x [j, j+1)) is [[a, b, c], [d, e, f]], held as
# (B, 6) rows (a, b, c, d, e, f). A geometric operation with per-sample magnitude v is
#     I + v * LINEAR + (cos(v deg) - 1) * COS + sin(v deg) * SIN
# with per-operation rows (rotation uses COS and SIN about the centre, the others LINEAR).
IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)


def _basis(name: str, h: int, w: int) -> Tuple[Tuple[float, ...], Tuple[float, ...], Tuple[float, ...]]:
    zero = (0.0,) * 6
    cx, cy = w / 2, h / 2
    linear = {
        "ShearX": (0, 1, 0, 0, 0, 0),
        "ShearY": (0, 0, 0, 1, 0, 0),
        "TranslateX": (0, 0, w, 0, 0, 0),
        "TranslateXrel": (0, 0, w, 0, 0, 0),  # a fraction of the width
        "TranslateY": (0, 0, 0, 0, 0, h),
        "TranslateYrel": (0, 0, 0, 0, 0, h),
        "TranslateXabs": (0, 0, 1, 0, 0, 0),
        "TranslateYabs": (0, 0, 0, 0, 0, 1),  # pixels
    }
    if name == "Rotate":  # counter-clockwise by v degrees about the centre, as PIL's rotate
        return zero, (1.0, 0.0, -cx, 0.0, 1.0, -cy), (0.0, -1.0, cy, 1.0, 0.0, -cx)
    return tuple(float(t) for t in linear.get(name, zero)), zero, zero


def _theta_map(h: int, w: int, device, dtype=torch.float32) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(T, offset)`` with ``theta = offset + coeffs @ T``: pixel maps to grid_sample's [-1, 1]
    frame (align_corners=False), one ``addmm`` for the whole batch."""
    t = torch.zeros(6, 6, dtype=dtype)
    t[0, 0] = 1.0
    t[1, 1] = h / w
    t[0, 2], t[1, 2], t[2, 2] = 1.0, h / w, 2.0 / w
    t[3, 3] = w / h
    t[4, 4] = 1.0
    t[3, 5], t[4, 5], t[5, 5] = w / h, 1.0, 2.0 / h
    offset = torch.tensor([0.0, 0.0, -1.0, 0.0, 0.0, -1.0], dtype=dtype)
    return t.to(device), offset.to(device)


def _base_grid(h: int, w: int, device, dtype=torch.float32) -> torch.Tensor:
    """``(3, H*W)`` homogeneous [-1, 1] pixel-centre coordinates, as ``affine_grid`` makes them."""
    xs = (torch.arange(w, dtype=dtype) * 2 + 1) / w - 1
    ys = (torch.arange(h, dtype=dtype) * 2 + 1) / h - 1
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([gx.reshape(-1), gy.reshape(-1), torch.ones(h * w, dtype=dtype)]).to(device)


class Geometry:
    """The device constants of one image size: the theta map, the sampling grid, PIL's smoothing
    kernel and the border it leaves alone, Dassl's cutout grey, the cutout rows and columns."""

    def __init__(self, h: int, w: int, device) -> None:
        self.h, self.w = h, w
        self.t, self.offset = _theta_map(h, w, device)
        self.grid = _base_grid(h, w, device)
        smooth = torch.ones(3, 1, 3, 3)
        smooth[:, :, 1, 1] = 5.0
        self.smooth = (smooth / 13).to(device)
        border = torch.ones(h, w, dtype=torch.bool)
        border[1:-1, 1:-1] = False
        self.border = border.to(device)
        self.grey = torch.tensor([125 / 255, 123 / 255, 114 / 255]).view(1, 3, 1, 1).to(device)
        self.rows = torch.arange(h).view(1, h).to(device)
        self.cols = torch.arange(w).view(1, w).to(device)

    def warp(self, x: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
        """Sample ``x`` through each sample's inverse map; uncovered areas are black."""
        b, _, h, w = x.shape
        theta = torch.addmm(self.offset, coeffs, self.t).view(b, 2, 3)
        grid = torch.matmul(theta, self.grid).view(b, 2, h, w).permute(0, 2, 3, 1)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


_GEOMETRY: Dict[tuple, Geometry] = {}


def device_key(device) -> str:
    """``device`` as its tensors report it: ``"cuda"`` is ``"cuda:0"`` (the current device) once a
    tensor is on it. Tables made for ``"cuda"`` when the views are built must be found by a step
    whose images say ``cuda:0``; a miss would make them inside the step (inside a CUDA graph under
    ``COMPILE reduce-overhead``, where the next replay overwrites them)."""
    d = torch.device(device)
    if d.index is None and d.type not in ("cpu", "meta"):
        d = torch.empty(0, device=d).device  # no kernel: the device's own notion of "current"
    return str(d)


def geometry(h: int, w: int, device) -> Geometry:
    """The constants for ``(h, w)`` on ``device``, made once (the views make theirs when built)."""
    key = (h, w, device_key(device))
    if key not in _GEOMETRY:
        _GEOMETRY[key] = Geometry(h, w, device)
    return _GEOMETRY[key]


def _geometric_inverse(name: str, v: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """PIL's inverse map for each sample's magnitude ``v``, as ``(B, 6)`` coefficients."""
    lin, cos_row, sin_row = (torch.tensor(r, dtype=v.dtype, device=v.device) for r in _basis(name, h, w))
    a = v * (math.pi / 180)
    ident = torch.tensor(IDENTITY, dtype=v.dtype, device=v.device)
    return ident + v[:, None] * lin + (torch.cos(a) - 1)[:, None] * cos_row + torch.sin(a)[:, None] * sin_row


def _warp(x: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
    """Sample ``x`` through the inverse maps ``coeffs`` ``(B, 6)``; uncovered areas are black."""
    return geometry(x.shape[2], x.shape[3], x.device).warp(x, coeffs)


# -- magnitude rules: per-operation rows (offset, base, span, signed) --------------------
# A sample's value is  offset + s * (base + u * span),  u ~ U[0, 1), s = +-1 where signed.
Rule = Callable[[str, float, float], Tuple[float, float, float, bool]]


def _dassl_uniform(name: str, lo: float, hi: float) -> Tuple[float, float, float, bool]:
    """Dassl's RandAugment2/FixMatch: uniform in [lo, hi]; geometric ones flip sign with p 0.5;
    solarize's threshold is on 0..256."""
    scale = 1 / 255.0 if name == "Solarize" else 1.0
    return 0.0, lo * scale, (hi - lo) * scale, name in GEOMETRIC


def _dassl_fixed(m: int) -> Rule:
    """Dassl's RandAugment: magnitude m of 30 for every operation."""

    def rule(name: str, lo: float, hi: float) -> Tuple[float, float, float, bool]:
        scale = 1 / 255.0 if name == "Solarize" else 1.0
        return 0.0, (m / 30 * (hi - lo) + lo) * scale, 0.0, name in GEOMETRIC

    return rule


def _tv(m: int) -> Rule:
    """torchvision's RandAugment at magnitude m of 30 (``(name, top, signed)`` lists)."""

    def rule(name: str, top: float, signed: bool) -> Tuple[float, float, float, bool]:
        if name == "Posterize":  # 8 - round(m / 7.5) bits
            return float(8 - round(m / ((31 - 1) / 4))), 0.0, 0.0, False
        if name == "Solarize":  # threshold from 1.0 down to 0.0
            return 1.0 - m / 30, 0.0, 0.0, False
        v = top * m / 30
        if name in ("Brightness", "Color", "Contrast", "Sharpness"):
            return 1.0, v, 0.0, bool(signed)
        if name == "Rotate":
            return 0.0, -v, 0.0, bool(signed)  # torchvision rotates by -angle in PIL's convention
        return 0.0, v, 0.0, bool(signed)

    return rule


class RandAugmentBatch:
    """A RandAugment policy drawn per sample: ``n`` slots, each picks an operation uniformly,
    applies it with probability ``p``, at a magnitude from ``rule`` (module docstring). All
    geometric draws of a slot are one warp; areas it uncovers are black, as PIL's."""

    def __init__(self, ops: List[Tuple[str, float, float]], n: int, p: float, rule: Rule) -> None:
        self.ops, self.n, self.p, self.rule = ops, n, p, rule
        self.names = [name for name, _, _ in ops]
        self.colour = [(i, name) for i, name in enumerate(self.names) if name not in GEOMETRIC and name != "Identity"]
        self._tables: Dict[tuple, Dict[str, torch.Tensor]] = {}

    def prepare(self, h: int, w: int, device) -> None:
        """Make this policy's tables for ``(h, w)`` on ``device`` (no copy inside a step)."""
        key = (h, w, device_key(device))
        if key in self._tables:
            return
        rows = [self.rule(*op) for op in self.ops]
        bases = [_basis(name, h, w) for name in self.names]
        t = {
            "magnitude": torch.tensor([r[:3] for r in rows], dtype=torch.float32),  # offset, base, span
            "signed": torch.tensor([r[3] for r in rows], dtype=torch.bool),
            "geometric": torch.tensor([name in GEOMETRIC for name in self.names], dtype=torch.bool),
            "basis": torch.tensor([lin + cos + sin for lin, cos, sin in bases], dtype=torch.float32),  # (ops, 18)
            "identity": torch.tensor(IDENTITY, dtype=torch.float32),
            "ids": torch.arange(len(self.ops)),
        }
        self._tables[key] = {k: v.to(device) for k, v in t.items()}
        geometry(h, w, device)

    def _draw(self, t: Dict[str, torch.Tensor], b: int, dev) -> Tuple[torch.Tensor, torch.Tensor]:
        """One slot's draws for ``b`` samples: the operation's index (-1 where the slot skips) and
        its signed value, as Dassl's policies draw them per image."""
        pick = torch.randint(len(self.ops), (b,), device=dev)
        pick = torch.where(torch.rand(b, device=dev) < self.p, pick, -1)  # -1: this slot skips
        u = torch.rand(b, device=dev)
        sign = torch.where(torch.rand(b, device=dev) < 0.5, -1.0, 1.0)
        offset, base, span = t["magnitude"].index_select(0, pick.clamp(min=0)).unbind(1)
        return pick, offset + torch.where(t["signed"][pick.clamp(min=0)], sign, 1.0) * torch.addcmul(base, u, span)

    def draws(self, b: int, h: int = 32, w: int = 32, device="cpu") -> Tuple[torch.Tensor, torch.Tensor]:
        """The draws of one slot for ``b`` samples (what :meth:`__call__` draws per slot), for tests."""
        self.prepare(h, w, device)
        return self._draw(self._tables[(h, w, device_key(device))], b, device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        dev = x.device
        self.prepare(h, w, dev)
        t = self._tables[(h, w, device_key(dev))]
        geo = geometry(h, w, dev)
        for _ in range(self.n):
            pick, v = self._draw(t, b, dev)
            row = pick.clamp(min=0)
            # Every geometric draw of the slot in one warp.
            lin, cos_row, sin_row = t["basis"].index_select(0, row).view(b, 3, 6).unbind(1)
            angle = v * (math.pi / 180)
            coeffs = torch.addcmul(t["identity"], v.unsqueeze(1), lin)
            coeffs.addcmul_((torch.cos(angle) - 1).unsqueeze(1), cos_row)
            coeffs.addcmul_(torch.sin(angle).unsqueeze(1), sin_row)
            out = torch.where(_b(t["geometric"][row] & (pick >= 0)), geo.warp(x, coeffs), x)
            chosen = pick.unsqueeze(1) == t["ids"]  # (B, ops): one comparison for every colour operation
            for i, name in self.colour:
                out = torch.where(_b(chosen[:, i]), _colour_op(name, x, v), out)
            x = out
        return x


# -- the leading geometric operations: translation, pad-and-crop, flip as one map ------
def _leading_coeffs(
    b: int, h: int, w: int, device, translation: bool, crop_pad: Optional[int], flip: bool
) -> torch.Tensor:
    """The inverse map of Dassl's order translation -> crop -> flip, for each sample:
    ``[[sf/s, 0, (cf + dx)/s + tx], [0, 1/s, dy/s + ty]]``."""
    ones = torch.ones(b, device=device)
    zeros = torch.zeros(b, device=device)
    inv_s, tx, ty = ones, zeros, zeros
    if translation:  # Dassl's Random2DTranslation: p 0.5, enlarge 1.125x, crop back at a random place
        on = torch.rand(b, device=device) < 0.5
        inv_s = torch.where(on, 1 / 1.125, 1.0)
        tx = torch.floor(torch.rand(b, device=device) * (round(w * 1.125) - w + 1)) * on * inv_s
        ty = torch.floor(torch.rand(b, device=device) * (round(h * 1.125) - h + 1)) * on * inv_s
    dx = dy = zeros
    if crop_pad:  # pad by crop_pad (zeros), crop back at a random place: an integer shift
        dx = torch.randint(-crop_pad, crop_pad + 1, (b,), device=device).float()
        dy = torch.randint(-crop_pad, crop_pad + 1, (b,), device=device).float()
    sf, cf = ones, zeros
    if flip:
        flipped = torch.rand(b, device=device) < 0.5
        sf = torch.where(flipped, -1.0, 1.0)
        cf = torch.where(flipped, float(w), 0.0)
    a = sf * inv_s
    c = torch.addcmul(tx, cf + dx, inv_s)
    f = torch.addcmul(ty, dy, inv_s)
    return torch.stack([a, zeros, c, zeros, inv_s, f], dim=1)


def _random_flip(x: torch.Tensor) -> torch.Tensor:
    flip = torch.rand(x.shape[0], device=x.device) < 0.5
    return torch.where(_b(flip), x.flip(-1), x)


def _random_crop(x: torch.Tensor, pad: int) -> torch.Tensor:
    """Pad by ``pad`` (zeros) and crop back at a random place: a random integer shift."""
    b, _, h, w = x.shape
    return _warp(x, _leading_coeffs(b, h, w, x.device, False, pad, False))


def _cutout(x: torch.Tensor, n_holes: int, length, fill: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Dassl's Cutout: ``n_holes`` squares of side ``length`` (a Python number, or a (B,) tensor
    per sample) at uniform centres, clipped at the border, zeroed (or ``fill`` (1, C, 1, 1))."""
    b, c, h, w = x.shape
    g = geometry(h, w, x.device)
    half = length // 2 if not torch.is_tensor(length) else torch.div(length, 2, rounding_mode="floor").view(-1, 1)
    hole = None
    for _ in range(n_holes):
        # Dassl: rows max(cy - L//2, 0) .. min(cy + L//2, h), likewise for columns.
        dy = g.rows - torch.randint(h, (b, 1), device=x.device)
        dx = g.cols - torch.randint(w, (b, 1), device=x.device)
        square = ((dy >= -half) & (dy < half)).unsqueeze(2) & ((dx >= -half) & (dx < half)).unsqueeze(1)
        hole = square if hole is None else hole | square
    hole = hole.unsqueeze(1)
    if fill is None:
        return x.masked_fill(hole, 0.0)
    return torch.where(hole, fill[:, :c], x)


@dataclass(frozen=True)
class Leading:
    """One of the leading geometric operations (Dassl's order: translation, crop, flip);
    :func:`leading_op` makes consecutive ones a single map and a single warp."""

    translation: bool = False
    crop_pad: Optional[int] = None
    flip: bool = False


def leading_op(parts: List[Leading]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The batched operation of consecutive :class:`Leading` parts: one warp, or a flip alone."""
    translation = any(p.translation for p in parts)
    crop_pad = next((p.crop_pad for p in parts if p.crop_pad), None)
    flip = any(p.flip for p in parts)
    if not (translation or crop_pad):
        return _random_flip

    def op(x: torch.Tensor) -> torch.Tensor:
        return _warp(x, _leading_coeffs(x.shape[0], x.shape[2], x.shape[3], x.device, translation, crop_pad, flip))

    return op
