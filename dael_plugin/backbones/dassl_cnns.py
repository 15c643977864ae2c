"""Dassl's own CNNs, built without Dassl.

Same layers, same names, same initialisation and same forward as Dassl's
``cnn_digit5_m3sda`` (Digit-5; Peng et al., M3SDA, ICCV 2019), ``cnn_digitsdg``
(Digits-DG; Zhou et al., DDAIG, AAAI 2020), ``cnn_digitsingle`` (Digit-Single;
Volpi et al., NeurIPS 2018), ``wide_resnet_28_2`` / ``wide_resnet_16_4``, ``preact_resnet18``
and ``alexnet`` / ``vgg16`` (torchvision's, without their last layer), so their state
dicts are equal key for key and a backbone trained on one engine loads on
the other. Under Dassl, Dassl's own builders keep these names.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from dael_plugin.errors import DAELConfigError


def _need_32(x: torch.Tensor, name: str) -> None:
    if x.shape[-2:] != (32, 32):  # a Python check on static shapes: no host sync
        raise DAELConfigError(f"{name} takes 32x32 images, got {tuple(x.shape[-2:])}; set INPUT.SIZE (32, 32)")


class M3SDADigitCNN(nn.Module):
    """``cnn_digit5_m3sda``: three 5x5 conv-BN-ReLU blocks (two max-pools), then two FC-BN-ReLU
    layers with dropout between them; 2048 features. PyTorch's default initialisation, as Dassl."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, kernel_size=5, stride=1, padding=2)
        self.bn1 = nn.BatchNorm2d(64)
        self.conv2 = nn.Conv2d(64, 64, kernel_size=5, stride=1, padding=2)
        self.bn2 = nn.BatchNorm2d(64)
        self.conv3 = nn.Conv2d(64, 128, kernel_size=5, stride=1, padding=2)
        self.bn3 = nn.BatchNorm2d(128)
        self.fc1 = nn.Linear(8192, 3072)
        self.bn1_fc = nn.BatchNorm1d(3072)
        self.fc2 = nn.Linear(3072, 2048)
        self.bn2_fc = nn.BatchNorm1d(2048)
        self.out_features = 2048

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _need_32(x, "cnn_digit5_m3sda")
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, stride=2, kernel_size=3, padding=1)
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.max_pool2d(x, stride=2, kernel_size=3, padding=1)
        x = F.relu(self.bn3(self.conv3(x)))
        x = F.relu(self.bn1_fc(self.fc1(x.flatten(1))))
        x = F.dropout(x, training=self.training)
        return F.relu(self.bn2_fc(self.fc2(x)))


class _Convolution(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, stride=1, padding=1)
        self.relu = nn.ReLU(True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.conv(x))


class DigitsDGConvNet(nn.Module):
    """``cnn_digitsdg``: four 3x3 conv-ReLU blocks, each followed by a 2x2 max-pool; the 2x2x64
    map flattened (256 features). Kaiming-normal (fan-in) weights and zero biases, as Dassl's
    ``init_network_weights(model, "kaiming")``."""

    def __init__(self, c_hidden: int = 64) -> None:
        super().__init__()
        self.conv1 = _Convolution(3, c_hidden)
        self.conv2 = _Convolution(c_hidden, c_hidden)
        self.conv3 = _Convolution(c_hidden, c_hidden)
        self.conv4 = _Convolution(c_hidden, c_hidden)
        self.out_features = 2**2 * c_hidden
        for m in self.modules():  # in Dassl's order (model.apply visits children first)
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, a=0, mode="fan_in")
                nn.init.constant_(m.bias, 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _need_32(x, "cnn_digitsdg")
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4):
            x = F.max_pool2d(conv(x), 2)
        return x.flatten(1)


class DigitSingleCNN(nn.Module):
    """``cnn_digitsingle``: two 5x5 conv-ReLU-max-pool blocks (no padding), then two FC-ReLU layers;
    1024 features. Kaiming-normal (fan-in) weights and zero biases for every layer, as Dassl's
    ``init_network_weights(model, "kaiming")``, after PyTorch's own (the same random stream)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 5)
        self.conv2 = nn.Conv2d(64, 128, 5)
        self.fc3 = nn.Linear(5 * 5 * 128, 1024)
        self.fc4 = nn.Linear(1024, 1024)
        self.out_features = 1024
        for m in (self.conv1, self.conv2, self.fc3, self.fc4):  # Dassl's order
            nn.init.kaiming_normal_(m.weight, a=0, mode="fan_in")
            nn.init.constant_(m.bias, 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _need_32(x, "cnn_digitsingle")
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.relu(self.fc4(F.relu(self.fc3(x.flatten(1)))))


class _WideBlock(nn.Module):
    """Dassl's ``wide_resnet`` ``BasicBlock``: pre-activation (BN, LeakyReLU 0.01); where the width or
    stride changes, the activated input feeds both the convolution and the 1x1 shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.relu1 = nn.LeakyReLU(0.01, inplace=True)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu2 = nn.LeakyReLU(0.01, inplace=True)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.equalInOut = c_in == c_out
        self.convShortcut = None if self.equalInOut else nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.equalInOut:
            out = self.conv1(self.relu1(self.bn1(x)))
            return x + self.conv2(self.relu2(self.bn2(out)))
        x = self.relu1(self.bn1(x))
        out = self.conv2(self.relu2(self.bn2(self.conv1(x))))
        return self.convShortcut(x) + out


class _WideStage(nn.Module):
    def __init__(self, n: int, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.layer = nn.Sequential(
            *[_WideBlock(c_in if i == 0 else c_out, c_out, stride if i == 0 else 1) for i in range(n)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class WideResNet(nn.Module):
    """``wide_resnet_28_2`` / ``wide_resnet_16_4``: Dassl's WideResNet (after xternalz's), three stages of
    (depth - 4) / 6 pre-activation blocks, a last BN and LeakyReLU, global average pooling; 64 x widen
    features. Kaiming-normal (fan-out) convolutions, BN weights 1 and biases 0, as Dassl's."""

    def __init__(self, depth: int, widen: int) -> None:
        super().__init__()
        n, widths = (depth - 4) // 6, [16, 16 * widen, 32 * widen, 64 * widen]
        self.conv1 = nn.Conv2d(3, widths[0], 3, stride=1, padding=1, bias=False)
        self.block1 = _WideStage(n, widths[0], widths[1], 1)
        self.block2 = _WideStage(n, widths[1], widths[2], 2)
        self.block3 = _WideStage(n, widths[2], widths[3], 2)
        self.bn1 = nn.BatchNorm2d(widths[3])
        self.relu = nn.LeakyReLU(0.01, inplace=True)
        self.out_features = widths[3]
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block3(self.block2(self.block1(self.conv1(x))))
        return F.adaptive_avg_pool2d(self.relu(self.bn1(x)), 1).flatten(1)


class _PreActBlock(nn.Module):
    """Dassl's ``preact_resnet18`` ``PreActBlock``: BN-ReLU before each 3x3 convolution; where the width
    or stride changes, a 1x1 convolution of the activated input is the shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(x))
        shortcut = self.shortcut(out) if "shortcut" in self._modules else x
        return self.conv2(F.relu(self.bn2(self.conv1(out)))) + shortcut


class PreActResNet18(nn.Module):
    """``preact_resnet18`` (He et al., 2016, as Dassl builds it for CIFAR-sized images): a 3x3 stem,
    four stages of two pre-activation blocks (64-512 channels), no last BN, a 4x4 average pool; 512
    features. PyTorch's default initialisation, as Dassl's."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
        c_in, stages = 64, []
        for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(_PreActBlock(c_in, c_out, stride), _PreActBlock(c_out, c_out, 1)))
            c_in = c_out
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.out_features = 512

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _need_32(x, "preact_resnet18")  # Dassl's 4x4 pool takes the 4x4 map of a 32x32 image
        x = self.layer4(self.layer3(self.layer2(self.layer1(self.conv1(x)))))
        return F.avg_pool2d(x, 4).flatten(1)


def alexnet() -> nn.Module:
    """``alexnet``: torchvision's AlexNet without its last linear layer (4096 features: dropout,
    linear, ReLU, twice). torchvision builds that layer last, so the others start as Dassl's."""
    from torchvision.models import alexnet as tv_alexnet

    net = tv_alexnet(weights=None)
    net.classifier = net.classifier[:6]
    net.out_features = 4096
    return net


class VGG16(nn.Module):
    """``vgg16``: torchvision's VGG-16 layers (configuration D, no batch norm) and a classifier
    without its last linear layer (4096 features). Dassl initialises it after building it (fan-out
    Kaiming convolutions, N(0, 0.01) linear layers, zero biases), and not where pretrained weights
    will replace it (``init_weights``): the random stream then moves as Dassl's."""

    def __init__(self, init_weights: bool = True) -> None:
        super().__init__()
        from torchvision.models.vgg import cfgs, make_layers

        self.features = make_layers(cfgs["D"], batch_norm=False)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(True),
            nn.Dropout(),
            nn.Linear(4096, 4096),
            nn.ReLU(True),
            nn.Dropout(),
        )
        self.out_features = 4096
        for m in self.modules() if init_weights else ():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# Dassl's backbones whose pretrained weights are torchvision's ImageNet files, read from the torch
# hub cache as Dassl's ``load_url`` reads them (Dassl's model_urls; loaded non-strictly there, here
# every key of the backbone filled and the file's last layer left out)
IMAGENET_URLS = {
    "alexnet": "https://download.pytorch.org/models/alexnet-owt-4df8aa71.pth",
    "vgg16": "https://download.pytorch.org/models/vgg16-397923af.pth",
    **{  # Dassl's Dynamic ResNets (backbones/dynamic_resnet.py): the DDG authors' ImageNet files, by depth
        f"resnet{d}_dynamic{ms}": f"https://csip.fzu.edu.cn/files/models/resnet{d}_dynamic-{h}.pth"
        for d, h in (("18", "074db766"), ("50", "2c3b0201"), ("101", "c5f15780"))
        for ms in ("", "_ms_l1", "_ms_l12", "_ms_l123")
    },
    **{  # Dassl's EfficientNets (backbones/efficientnet.py): EfficientNet-PyTorch's release files
        f"efficientnet_b{k}": f"https://github.com/lukemelas/EfficientNet-PyTorch/releases/download/1.0/efficientnet-b{k}-{h}.pth"
        for k, h in enumerate("355c32eb f1951068 8bb594d6 5fb5a3c3 6ed6700e b6417697 c76e70fd dcc49843".split())
    },
}


def dassl_cache_file(url: str) -> str:
    """Where Dassl's ``load_url`` keeps ``url``'s file: the torch hub cache."""
    import os

    return os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(url))


def weights_unreachable(name: str, url: str, fix: str) -> DAELConfigError:
    """The one line of Dassl's pretrained ``name`` offline: its ``url``'s file neither in the torch hub
    cache nor downloadable (both engines: backbones.imagenet_file, record.check_dassl_pretrained_reachable)."""
    import os

    path = dassl_cache_file(url)
    return DAELConfigError(
        f"pretrained weights for Dassl's {name} ({os.path.basename(url)}) are not in the torch hub cache "
        f"{os.path.dirname(path)} and {url} cannot be reached; {fix}"
    )
