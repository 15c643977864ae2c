"""A small CNN for 32x32 digit-style images, fast enough for 2 CPU cores."""

from __future__ import annotations

from torch import nn


class SmallCNN(nn.Module):
    """Four conv-BN-ReLU blocks with max-pooling, then the flattened 2x2 map.

    About 60k parameters and 3.5M multiply-adds per 32x32 image, so the demo
    and the CI accuracy test train in minutes on a laptop CPU. Batch norm
    makes it sensitive to per-domain statistics, as the reference models are.
    """

    def __init__(self, in_channels: int = 3, width: int = 16, norm: str = "bn") -> None:
        super().__init__()
        chans = [in_channels, width, 2 * width, 4 * width, 4 * width]
        layers = []
        for c_in, c_out in zip(chans[:-1], chans[1:]):
            layers += [
                nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                nn.BatchNorm2d(c_out) if norm == "bn" else nn.GroupNorm(4, c_out),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            ]
        self.features = nn.Sequential(*layers)
        # Keep the 2x2 spatial layout (digits are about shape), as Dassl's cnn_digitsdg does.
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.out_features = 4 * chans[-1]
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        return self.pool(self.features(x)).flatten(1)
