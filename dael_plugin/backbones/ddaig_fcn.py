"""DDAIG's image generators (Zhou et al., AAAI 2020, "Deep Domain-Adversarial Image Generation for
Domain Generalisation"), built without Dassl: Dassl's ``fcn_3x32_gctx``, ``fcn_3x64_gctx`` and their
``_stn`` forms (``dassl/modeling/network/ddaig_fcn.py``), rebuilt key for key.

A fully convolutional net (reflection padding, 3x3 convolutions, instance norm without affine
parameters, ``n_blocks`` residual blocks), a global-context fusion (the feature map concatenated
with its spatial mean, a 1x1 convolution), and a 1x1 convolution with tanh: the perturbation
``p``. The output is ``x + lmda * p``. The ``_stn`` forms first warp the image with a spatial
transformer (a small localisation net whose last layer Dassl initialises to weights 0 and bias
(1, 0, 0, 1), which after its tanh is a zoom by tanh(1) = 0.76, not the identity: kept). The
localisation net trains with the generator: Dassl allocates ``theta`` from ``x.data`` but then
assigns ``theta[:, :, :2] = x``, which puts ``theta`` back in the graph. Initialisation as Dassl's:
PyTorch's defaults, then every convolution and linear weight from N(0, 0.02), biases 0, batch-norm
scales 1 (in that order of modules, so the same seed gives Dassl's weights)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def _init_weights(model: nn.Module, gain: float = 0.02) -> None:
    def init(m: nn.Module) -> None:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(m.weight.data, 0.0, gain)
            if m.bias is not None:
                nn.init.constant_(m.bias.data, 0.0)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.constant_(m.weight.data, 1.0)
            nn.init.constant_(m.bias.data, 0.0)

    model.apply(init)


def _instance_norm(dim: int) -> nn.Module:
    return nn.InstanceNorm2d(dim, affine=False, track_running_stats=False)


def _pad(padding: str) -> list:
    if padding == "reflect":
        return [nn.ReflectionPad2d(1)]
    if padding == "zero":
        return []
    raise ValueError(f"padding {padding!r}")


class ResnetBlock(nn.Module):
    """x + (pad, conv3x3, norm, ReLU, pad, conv3x3, norm)(x), Dassl's (CycleGAN's) layout."""

    def __init__(self, dim: int, padding: str, norm) -> None:
        super().__init__()
        p = 1 if padding == "zero" else 0
        self.conv_block = nn.Sequential(
            *_pad(padding),
            nn.Conv2d(dim, dim, kernel_size=3, padding=p, bias=False),
            norm(dim),
            nn.ReLU(True),
            *_pad(padding),
            nn.Conv2d(dim, dim, kernel_size=3, padding=p, bias=False),
            norm(dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv_block(x)


class LocNet(nn.Module):
    """The spatial transformer's localisation net: a 2x2 linear map per image (no translation)."""

    def __init__(self, input_nc: int, nc: int, n_blocks: int, image_size: int) -> None:
        super().__init__()
        layers = [
            nn.Conv2d(input_nc, nc, kernel_size=3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(nc),
            nn.ReLU(True),
        ]
        for _ in range(n_blocks):
            layers += [ResnetBlock(nc, "zero", nn.BatchNorm2d), nn.MaxPool2d(2, stride=2)]
        self.backbone = nn.Sequential(*layers)
        reduced = int(image_size * 0.5 ** (n_blocks + 1))
        self.fc_loc = nn.Linear(nc * reduced**2, 2 * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.fc_loc(self.backbone(x).flatten(1))).view(-1, 2, 2)
        # theta (B, 2, 3), its translation column 0; in the graph, as Dassl's slice assignment is
        return F.pad(x, (0, 1))


class FCN(nn.Module):
    def __init__(self, nc: int, stn: bool = False, image_size: int = 32, n_blocks: int = 3) -> None:
        super().__init__()
        norm = _instance_norm
        layers = [
            *_pad("reflect"),
            nn.Conv2d(3, nc, kernel_size=3, stride=1, padding=0, bias=False),
            norm(nc),
            nn.ReLU(True),
        ]
        layers += [ResnetBlock(nc, "reflect", norm) for _ in range(n_blocks)]
        self.backbone = nn.Sequential(*layers)
        self.gctx_fusion = nn.Sequential(
            nn.Conv2d(2 * nc, nc, kernel_size=1, stride=1, padding=0, bias=False), norm(nc), nn.ReLU(True)
        )
        self.regress = nn.Sequential(nn.Conv2d(nc, 3, kernel_size=1, stride=1, padding=0, bias=True), nn.Tanh())
        self.locnet = LocNet(3, nc, n_blocks, image_size) if stn else None

    def forward(self, x: torch.Tensor, lmda: float = 1.0) -> torch.Tensor:
        if self.locnet is not None:
            theta = self.locnet(x)
            x = F.grid_sample(x, F.affine_grid(theta, list(x.size()), align_corners=False), align_corners=False)
        h = self.backbone(x)
        h = self.gctx_fusion(torch.cat([h, F.adaptive_avg_pool2d(h, (1, 1)).expand_as(h)], 1))
        return x + lmda * self.regress(h)


def build_generator(name: str) -> nn.Module:
    """Dassl's ``TRAINER.DDAIG.G_ARCH`` names."""
    from dael_plugin.errors import DAELConfigError

    specs = {  # channels, spatial transformer, its image size (Dassl's defaults: 32 and 224)
        "fcn_3x32_gctx": (32, False, 32),
        "fcn_3x64_gctx": (64, False, 32),
        "fcn_3x32_gctx_stn": (32, True, 32),
        "fcn_3x64_gctx_stn": (64, True, 224),
    }
    if name not in specs:
        raise DAELConfigError(f"TRAINER.DDAIG.G_ARCH {name!r} is not one of Dassl's generators: {sorted(specs)}")
    nc, stn, size = specs[name]
    net = FCN(nc, stn=stn, image_size=size)
    _init_weights(net)
    if net.locnet is not None:  # Dassl's "identity" start (a zoom by tanh(1) after the tanh)
        net.locnet.fc_loc.weight.data.zero_()
        net.locnet.fc_loc.bias.data.copy_(torch.tensor([1, 0, 0, 1], dtype=torch.float))
    return net
