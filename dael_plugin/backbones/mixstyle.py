"""Dassl's MixStyle and EFDMix ResNets without Dassl: ``resnet{18,50,101}_{ms,efdmix}_l{1,12,123}``.

Dassl's ``ResNet`` with ``ms_layers`` (dassl/modeling/backbone/resnet.py) applies one MixStyle
(Zhou et al., ICLR 2021) or EFDMix (Zhang et al., CVPR 2022) layer after each of the named
stages, in training only. Here the stages are timm's ResNet, the architecture and the torchvision
ImageNet weights that Dassl's ``resnet*`` names also build (``resnet18.tv_in1k``, ...), and the two
layers are Dassl's operations with Dassl's draws: Python's ``random.random()`` against ``p``, a
Beta(``alpha``, ``alpha``) mixing weight per sample, ``torch.randperm`` for the partners, in that
order, so that the same random states give the same output (tested against Dassl's own). They mix
the samples of one call, so DAEL's fused pass takes per-chunk calls for them
(``core.chunk_norm.BATCH_MIXERS``), as Dassl's DAEL calls its backbone once per domain.

Under ``torch.compile`` the two layers run eagerly (``torch.compiler.disable``; the stages around
them compile): compiled with inductor, with their Python draw (``random.random()``, which dynamo
traces) and their torch draws inside the graph, they gave other mixes than eager from the same
random states (a compiled ResNet-18 with MixStyle was 2.3 off eager's output, measured; which of
the draws differed was not isolated; 1e-5 with the layers eager, as ``EXECUTION.COMPILE`` must be).
"""

from __future__ import annotations

import random
import re
from typing import Optional, Sequence

import torch
from torch import nn

from dael_plugin.backbones.timm_backbone import TimmBackbone

NAME = re.compile(r"resnet(18|50|101)_(ms|efdmix)_l(1|12|123)")


class _Mixer(nn.Module):
    """What MixStyle and EFDMix share: ``p``, the Beta draw, the partners, in Dassl's order."""

    def __init__(self, p: float = 0.5, alpha: float = 0.1, eps: float = 1e-6, mix: str = "random") -> None:
        super().__init__()
        self.p, self.alpha, self.eps, self.mix = p, alpha, eps, mix
        self.beta = torch.distributions.Beta(alpha, alpha)

    def extra_repr(self) -> str:
        return f"p={self.p}, alpha={self.alpha}, eps={self.eps}, mix={self.mix}"

    def partners(self, b: int) -> torch.Tensor:
        if self.mix == "random":
            return torch.randperm(b)
        perm_b, perm_a = torch.arange(b - 1, -1, -1).chunk(2)  # "crossdomain": the halves swapped
        return torch.cat([perm_b[torch.randperm(perm_b.shape[0])], perm_a[torch.randperm(perm_a.shape[0])]], 0)


class MixStyle(_Mixer):
    """Each sample's channel means and standard deviations mixed with another sample's."""

    @torch.compiler.disable  # eager's draws (module docstring)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or random.random() > self.p:
            return x
        b = x.size(0)
        mu = x.mean(dim=[2, 3], keepdim=True)
        sig = (x.var(dim=[2, 3], keepdim=True) + self.eps).sqrt()
        mu, sig = mu.detach(), sig.detach()
        x_normed = (x - mu) / sig
        lmda = self.beta.sample((b, 1, 1, 1)).to(x.device)
        perm = self.partners(b)
        mu_mix = mu * lmda + mu[perm] * (1 - lmda)
        sig_mix = sig * lmda + sig[perm] * (1 - lmda)
        return x_normed * sig_mix + mu_mix


class EFDMix(_Mixer):
    """Each sample's sorted channel values mixed with another sample's (exact feature distributions)."""

    @torch.compiler.disable  # eager's draws (module docstring)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or random.random() > self.p:
            return x
        b, c, h, w = x.shape
        x_view = x.reshape(b, c, -1)  # Dassl's view; a channels_last map is copied, the values alike
        value_x, index_x = torch.sort(x_view)
        lmda = self.beta.sample((b, 1, 1)).to(x.device)
        perm = self.partners(b)
        x_view_copy = value_x[perm].gather(-1, index_x.argsort(-1))
        return (x_view + (x_view_copy - x_view.detach()) * (1 - lmda)).view(b, c, h, w)


def timm_name(name: str) -> Optional[str]:
    """The timm ResNet (torchvision's weights) under a MixStyle or EFDMix name, or None."""
    m = NAME.fullmatch(name)
    return f"resnet{m.group(1)}.tv_in1k" if m else None


class MixingResNet(TimmBackbone):
    """timm's ResNet with Dassl's mixing layer after the named stages (one layer object, as Dassl's)."""

    def __init__(
        self, name: str, pretrained: bool = False, weights_file: str = "", img_size: Optional[Sequence[int]] = None
    ) -> None:
        depth, kind, stages = NAME.fullmatch(name).groups()
        super().__init__(f"resnet{depth}.tv_in1k", pretrained=pretrained, weights_file=weights_file, img_size=img_size)
        self.mixstyle = MixStyle() if kind == "ms" else EFDMix()
        self.ms_layers = tuple(f"layer{s}" for s in stages)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = m.maxpool(m.act1(m.bn1(m.conv1(x))))
        for stage in ("layer1", "layer2", "layer3", "layer4"):
            x = getattr(m, stage)(x)
            if stage in self.ms_layers:
                x = self.mixstyle(x)
        return m.forward_head(x)
