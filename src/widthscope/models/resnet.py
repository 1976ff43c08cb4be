"""ResNet-20 for 32×32 images (He et al. 2016, CIFAR variant) with a width multiplier.

Three stages of three basic blocks with ``max(1, round(16·k·2^s))`` channels for width ``k``;
insertion points: the nine block outputs. Details: docs/models-data.md.

Example::

    >>> import torch
    >>> from widthscope.models import build
    >>> m = build("resnet20", 1, num_classes=10)
    >>> m(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from ..errors import WidthscopeError

_NORMS: dict[str, Callable[[int], nn.Module]] = {
    "batch": nn.BatchNorm2d,
    "group": lambda c: nn.GroupNorm(math.gcd(c, 8), c),
    "layer": lambda c: nn.GroupNorm(1, c),
    "none": lambda c: nn.Identity(),
}
NORMS = tuple(_NORMS)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, norm: str) -> None:
        super().__init__()
        bias = norm == "none"
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=bias)
        self.norm1 = _NORMS[norm](c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=bias)
        self.norm2 = _NORMS[norm](c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=bias), _NORMS[norm](c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    layer1: nn.Sequential  # the three stages, set with setattr in __init__
    layer2: nn.Sequential
    layer3: nn.Sequential

    def __init__(self, channels: tuple[int, int, int], in_channels: int, num_classes: int, norm: str) -> None:
        super().__init__()
        self.in_channels = in_channels
        c1 = channels[0]
        self.conv1 = nn.Conv2d(in_channels, c1, 3, 1, 1, bias=norm == "none")
        self.norm1 = _NORMS[norm](c1)
        c_prev = c1
        for s, c in enumerate(channels):
            blocks = [BasicBlock(c_prev if b == 0 else c, c, 2 if (s > 0 and b == 0) else 1, norm) for b in range(3)]
            setattr(self, f"layer{s + 1}", nn.Sequential(*blocks))
            c_prev = c
        self.fc = nn.Linear(channels[2], num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_floating_point():
            raise WidthscopeError(
                f"resnet20 expects float images, got {x.dtype} of shape {tuple(x.shape)}; "
                "convert with x.float() (widthscope.data gives normalised float images)"
            )
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise WidthscopeError(
                f"resnet20 expects images (B, {self.in_channels}, H, W), got shape "
                f"{tuple(x.shape)}; build with in_channels=... or load images unflattened"
            )
        x = torch.relu(self.norm1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(x.mean(dim=(2, 3)))


def channels_for(width: float) -> tuple[int, int, int]:
    return tuple(max(1, int(round(16 * width * 2**s))) for s in range(3))  # type: ignore[return-value]


def build_resnet20(
    width: int | float | None = 1, *, in_channels: int = 3, num_classes: int = 10, norm: str = "batch"
) -> tuple[nn.Module, dict, list[str]]:
    width = 1 if width is None else width
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not width > 0:
        raise WidthscopeError(f"resnet20 width (channel multiplier k) must be a positive number, got {width!r}")
    if norm not in NORMS:
        raise WidthscopeError(f"unknown norm {norm!r}; valid: {', '.join(NORMS)}")
    model = ResNet20(channels_for(width), in_channels, num_classes, norm)
    config = dict(family="resnet20", width=width, in_channels=in_channels, num_classes=num_classes, norm=norm)
    points = [f"layer{s}.{b}" for s in (1, 2, 3) for b in range(3)]
    return model, config, points
