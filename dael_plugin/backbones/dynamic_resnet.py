"""Dassl's Dynamic ResNets without Dassl: ``resnet{18,50,101}_dynamic`` and ``..._dynamic_ms_l{1,12,123}``.

Dynamic Domain Generalization (Sun et al., IJCAI 2022; dassl/modeling/backbone/resnet_dynamic.py):
every 3x3 convolution of a torchvision ResNet is a :class:`Conv2dDynamic`, a static convolution
plus four kernel templates (depthwise 3x3, 1x1, 3x1, 1x3) weighted per sample by a small attention
head on the block's input. Rebuilt here module for module, so that the state dict is Dassl's key
for key and a seed gives Dassl's initial weights (the modules built, then re-initialised, in
Dassl's order: a stage's shortcut before its first block); the ``_ms_`` variants apply Dassl's
MixStyle after the named stages (:mod:`dael_plugin.backbones.mixstyle`, its draws). Pretrained
(``MODEL.BACKBONE.PRETRAINED``, Dassl's default), the weights are the DDG authors' ImageNet file
that Dassl reads, from the torch hub cache (``backbones.imagenet_file``, ``dassl_cnns.IMAGENET_URLS``).
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dael_plugin.backbones.mixstyle import MixStyle

NAME = re.compile(r"resnet(18|50|101)_dynamic(?:_ms_l(1|12|123))?")
BLOCKS = {"18": (2, 2, 2, 2), "50": (3, 4, 6, 3), "101": (3, 4, 23, 3)}


class Attention(nn.Module):
    """The templates' weights: global pooling, two linear layers, a softmax over the four."""

    def __init__(self, in_channels: int, out_features: int = 4) -> None:
        super().__init__()
        self.squeeze = in_channels // 16
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(in_channels, self.squeeze, bias=False)
        self.fc2 = nn.Linear(self.squeeze, out_features, bias=False)
        self.sf = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sf(self.fc2(F.relu(self.fc1(self.avg_pool(x).flatten(1)))))


class Conv2dDynamic(nn.Module):
    """A 3x3 convolution (no bias) plus its four templates, weighted by :class:`Attention` on ``attention_x``."""

    def __init__(self, c_in: int, c_out: int, stride: int, attention_in: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.kernel_templates = nn.ModuleDict(
            {
                "conv_nn": nn.Conv2d(c_in, c_out, 3, stride, 1, groups=min(c_in, c_out), bias=False),
                "conv_11": nn.Conv2d(c_in, c_out, 1, stride, 0, bias=False),
                "conv_n1": nn.Conv2d(c_in, c_out, (3, 1), stride, (1, 0), bias=False),
                "conv_1n": nn.Conv2d(c_in, c_out, (1, 3), stride, (0, 1), bias=False),
            }
        )
        self.attention = Attention(attention_in)

    def forward(self, x: torch.Tensor, attention_x: torch.Tensor) -> torch.Tensor:
        y = self.attention(attention_x)
        out = self.conv(x)
        for i, template in enumerate(self.kernel_templates.values()):
            out = out + template(x) * y[:, i].view(-1, 1, 1, 1)
        return out


class _Block(nn.Module):
    """Dassl's ``BasicBlockDynamic`` (``bottleneck`` False) or ``BottleneckDynamic``; ``shortcut`` is
    built by the caller first, as Dassl's ``_make_layer`` builds it."""

    def __init__(self, c_in: int, planes: int, stride: int, shortcut: Optional[nn.Module], bottleneck: bool) -> None:
        super().__init__()
        self.bottleneck = bottleneck
        if bottleneck:
            self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = Conv2dDynamic(planes, planes, stride, c_in)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
        else:
            self.conv1 = Conv2dDynamic(c_in, planes, stride, c_in)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = Conv2dDynamic(planes, planes, 1, c_in)
            self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bottleneck:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn3(self.conv3(self.relu(self.bn2(self.conv2(out, x)))))
        else:
            out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x, x))), x))
        return self.relu(out + (self.downsample(x) if self.downsample is not None else x))


class DynamicResNet(nn.Module):
    """Dassl's ``ResNet`` of dynamic blocks, without its classifier (``has_fc`` False); ``out_features``
    512 (18) or 2048 (50, 101)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        depth, stages = NAME.fullmatch(name).groups()
        bottleneck, expansion = depth != "18", 1 if depth == "18" else 4
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        c_in = 64
        for i, (planes, n) in enumerate(zip((64, 128, 256, 512), BLOCKS[depth])):
            stride = 1 if i == 0 else 2
            shortcut = None
            if stride != 1 or c_in != planes * expansion:
                shortcut = nn.Sequential(
                    nn.Conv2d(c_in, planes * expansion, 1, stride, bias=False), nn.BatchNorm2d(planes * expansion)
                )
            blocks = [_Block(c_in, planes, stride, shortcut, bottleneck)]
            c_in = planes * expansion
            blocks += [_Block(c_in, planes, 1, None, bottleneck) for _ in range(1, n)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.out_features = c_in
        self.ms_class = MixStyle() if stages else None  # Dassl's p 0.5, alpha 0.1
        self.ms_layers = tuple(f"layer{s}" for s in stages or "")
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in ("layer1", "layer2", "layer3", "layer4"):
            x = getattr(self, stage)(x)
            if stage in self.ms_layers:
                x = self.ms_class(x)
        return torch.flatten(self.avgpool(x), 1)


def names() -> Sequence[str]:
    """Every Dynamic ResNet name Dassl registers."""
    return [f"resnet{d}_dynamic{s}" for d in BLOCKS for s in ("", "_ms_l1", "_ms_l12", "_ms_l123")]
