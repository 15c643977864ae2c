"""Dassl's EfficientNets without Dassl: ``efficientnet_b0`` to ``efficientnet_b7``.

Dassl's (dassl/modeling/backbone/efficientnet/, Luke Melas-Kyriazi's EfficientNet-PyTorch 0.6.4)
rebuilt module for module: the same state dict key for key, PyTorch's default initialisation in
the same order (so a seed gives Dassl's initial weights), TensorFlow's "same" padding computed once
for the model's own image size (224 for b0 ... 600 for b7) whatever the input's size, as Dassl's
static padding, its swish with its written-out backward, drop connect and the dropout after the
pooling in training. The features are the pooled head's (1280 for b0). Pretrained
(``MODEL.BACKBONE.PRETRAINED``, Dassl's default), the weights are the file Dassl reads from the torch
hub cache (``dassl_cnns.IMAGENET_URLS``), its classifier ``_fc`` left out.
"""

from __future__ import annotations

import math
import re
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

NAME = re.compile(r"efficientnet_b([0-7])")
# (width, depth, image size, dropout) of b0 ... b7 (efficientnet_params)
PARAMS = {
    "0": (1.0, 1.0, 224, 0.2),
    "1": (1.0, 1.1, 240, 0.2),
    "2": (1.1, 1.2, 260, 0.3),
    "3": (1.2, 1.4, 300, 0.3),
    "4": (1.4, 1.8, 380, 0.4),
    "5": (1.6, 2.2, 456, 0.4),
    "6": (1.8, 2.6, 528, 0.5),
    "7": (2.0, 3.1, 600, 0.5),
}
# (kernel, repeats, stride, expansion, in, out) of the seven stages; squeeze-excitation 0.25 each
STAGES = ((3, 1, 1, 1, 32, 16), (3, 2, 2, 6, 16, 24), (5, 2, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80))
STAGES += ((5, 3, 1, 6, 80, 112), (5, 4, 2, 6, 112, 192), (3, 1, 1, 6, 192, 320))
BN = {"momentum": 1 - 0.99, "eps": 1e-3}  # Dassl's: 1 - its TensorFlow-style 0.99
DROP_CONNECT = 0.2


class _Swish(torch.autograd.Function):
    """x * sigmoid(x) with the gradient written out, as Dassl's ``MemoryEfficientSwish``."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s * (1 + x * (1 - s)))


class Swish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Swish.apply(x)


class SameConv2d(nn.Conv2d):
    """``Conv2dStaticSamePadding``: TensorFlow's "same" padding for ``image_size``, fixed at build."""

    def __init__(self, c_in: int, c_out: int, kernel: int, image_size: Sequence[int], stride: int = 1, **kw) -> None:
        super().__init__(c_in, c_out, kernel, stride=stride, **kw)
        pads = []
        for size in image_size:
            out = math.ceil(size / stride)
            pads.append(max((out - 1) * stride + kernel - size, 0))
        (ph, pw) = pads
        pad = (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2)
        self.static_padding = nn.ZeroPad2d(pad) if ph > 0 or pw > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(self.static_padding(x), self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


def _shrink(size: Sequence[int], stride: int) -> List[int]:
    return [int(math.ceil(s / stride)) for s in size]


class MBConvBlock(nn.Module):
    """Mobile inverted bottleneck: 1x1 expansion, depthwise convolution, squeeze-excitation, 1x1
    projection, the input added back (with drop connect) where the shapes allow."""

    def __init__(self, kernel: int, stride: int, expand: int, c_in: int, c_out: int, size: Sequence[int]) -> None:
        super().__init__()
        self.stride, self.c_in, self.c_out, self.expand = stride, c_in, c_out, expand
        mid = c_in * expand
        if expand != 1:
            self._expand_conv = SameConv2d(c_in, mid, 1, size, bias=False)
            self._bn0 = nn.BatchNorm2d(mid, **BN)
        self._depthwise_conv = SameConv2d(mid, mid, kernel, size, stride, groups=mid, bias=False)
        self._bn1 = nn.BatchNorm2d(mid, **BN)
        squeezed = max(1, int(c_in * 0.25))
        self._se_reduce = SameConv2d(mid, squeezed, 1, (1, 1))
        self._se_expand = SameConv2d(squeezed, mid, 1, (1, 1))
        self._project_conv = SameConv2d(mid, c_out, 1, _shrink(size, stride), bias=False)
        self._bn2 = nn.BatchNorm2d(c_out, **BN)
        self._swish = Swish()

    def forward(self, inputs: torch.Tensor, drop_connect: float) -> torch.Tensor:
        x = self._swish(self._bn0(self._expand_conv(inputs))) if self.expand != 1 else inputs
        x = self._swish(self._bn1(self._depthwise_conv(x)))
        x = torch.sigmoid(self._se_expand(self._swish(self._se_reduce(F.adaptive_avg_pool2d(x, 1))))) * x
        x = self._bn2(self._project_conv(x))
        if self.stride == 1 and self.c_in == self.c_out:
            if drop_connect and self.training:  # Dassl's drop_connect: a whole sample's branch
                keep = 1 - drop_connect
                mask = torch.floor(keep + torch.rand([x.shape[0], 1, 1, 1], dtype=x.dtype, device=x.device))
                x = x / keep * mask
            x = x + inputs
        return x


def _filters(n: int, width: float) -> int:
    """``round_filters``: scaled by the width, to a multiple of 8, never more than 10% down."""
    scaled = n * width
    out = max(8, int(scaled + 4) // 8 * 8)
    return int(out + 8 if out < 0.9 * scaled else out)


class EfficientNet(nn.Module):
    """Dassl's ``EfficientNet`` backbone: stem, the MBConv stages, 1x1 head, pooling, dropout."""

    def __init__(self, name: str) -> None:
        super().__init__()
        width, depth, image, dropout = PARAMS[NAME.fullmatch(name).group(1)]
        size: List[int] = [image, image]
        self._conv_stem = SameConv2d(3, _filters(32, width), 3, size, 2, bias=False)
        self._bn0 = nn.BatchNorm2d(_filters(32, width), **BN)
        size = _shrink(size, 2)
        blocks = []
        for kernel, repeats, stride, expand, c_in, c_out in STAGES:
            c_in, c_out = _filters(c_in, width), _filters(c_out, width)
            blocks.append(MBConvBlock(kernel, stride, expand, c_in, c_out, size))
            size = _shrink(size, stride)
            blocks += [
                MBConvBlock(kernel, 1, expand, c_out, c_out, size) for _ in range(int(math.ceil(depth * repeats)) - 1)
            ]
        self._blocks = nn.ModuleList(blocks)
        self.out_features = _filters(1280, width)
        self._conv_head = SameConv2d(c_out, self.out_features, 1, size, bias=False)
        self._bn1 = nn.BatchNorm2d(self.out_features, **BN)
        self._avg_pooling = nn.AdaptiveAvgPool2d(1)
        self._dropout = nn.Dropout(dropout)
        self._swish = Swish()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._swish(self._bn0(self._conv_stem(x)))
        for i, block in enumerate(self._blocks):
            x = block(x, DROP_CONNECT * float(i) / len(self._blocks))
        x = self._swish(self._bn1(self._conv_head(x)))
        return self._dropout(self._avg_pooling(x).flatten(1))


def names() -> Tuple[str, ...]:
    return tuple(f"efficientnet_b{k}" for k in PARAMS)
