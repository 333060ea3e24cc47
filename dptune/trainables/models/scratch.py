"""Models trained from scratch: small tanh MLP and CNN, a GroupNorm WideResNet, an LSTM over an
image's rows and torchvision's Vision Transformer.

Entry functions set architecture only (keyword arguments, ``num_classes`` and ``input_shape``
first); :mod:`.catalog` registers them by name. No model here uses BatchNorm (WideResNet uses GroupNorm):
batch statistics mix examples and break per-sample privacy.
"""
from __future__ import annotations

import torch
from torch import nn

from ...errors import UserError


def _flat_dim(features: nn.Module, input_shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        return features(torch.zeros(1, *input_shape)).flatten(1).shape[1]


def mlp(*, num_classes: int, input_shape: tuple[int, ...], hidden: int = 256, depth: int = 2) -> nn.Module:
    """Fully connected tanh network with ``depth`` hidden layers."""
    dims = [int(torch.tensor(input_shape).prod())] + [hidden] * depth
    layers: list[nn.Module] = [nn.Flatten()]
    for d_in, d_out in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(d_in, d_out), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(dims[-1], num_classes))


def cnn(*, num_classes: int, input_shape: tuple[int, ...], width: int = 16) -> nn.Module:
    """Small tanh CNN (Papernot et al. 2021 style: tanh works better than ReLU under DP)."""
    channels = input_shape[0]
    features = nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2),
        nn.Flatten(),
    )
    return nn.Sequential(features, nn.Linear(_flat_dim(features, input_shape), 64), nn.Tanh(),
                         nn.Linear(64, num_classes))


class _WideBlock(nn.Module):
    """Pre-activation wide residual block with GroupNorm."""

    def __init__(self, c_in: int, c_out: int, stride: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(min(groups, c_in), c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(min(groups, c_out), c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.shortcut = (nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)
                         if stride != 1 or c_in != c_out else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm1(x))
        out = self.conv1(h)
        out = self.conv2(torch.relu(self.norm2(out)))
        return out + (self.shortcut(h) if not isinstance(self.shortcut, nn.Identity) else x)


def wide_resnet(*, num_classes: int, input_shape: tuple[int, ...], depth: int = 16, width: int = 4,
                groups: int = 16) -> nn.Module:
    """WideResNet-depth-width (Zagoruyko & Komodakis 2016) with GroupNorm (De et al. 2022)."""
    if (depth - 4) % 6:
        raise UserError(f"depth must be 6n + 4; got {depth}")
    n = (depth - 4) // 6
    widths = [16, 16 * width, 32 * width, 64 * width]
    layers: list[nn.Module] = [nn.Conv2d(input_shape[0], widths[0], 3, padding=1, bias=False)]
    c_in = widths[0]
    for stage, c_out in enumerate(widths[1:]):
        for i in range(n):
            layers.append(_WideBlock(c_in, c_out, stride=2 if stage > 0 and i == 0 else 1, groups=groups))
            c_in = c_out
    layers += [nn.GroupNorm(groups, c_in), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes)]
    return nn.Sequential(*layers)


class RowLSTM(nn.Module):
    """An LSTM reading an image one row per step ([b, C, H, W] → H steps of C·W features), the
    classifier on its final hidden states (Opacus's DPLSTM examples classify this way)."""

    def __init__(self, num_classes: int, input_shape: tuple[int, ...], hidden: int, layers: int,
                 bidirectional: bool) -> None:
        super().__init__()
        features = int(torch.tensor(input_shape[:-2]).prod()) * input_shape[-1] if len(input_shape) > 1 else 1
        self.lstm = nn.LSTM(features, hidden, num_layers=layers, bidirectional=bidirectional, batch_first=True)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = x.reshape(x.shape[0], -1, x.shape[-2], x.shape[-1]).permute(0, 2, 1, 3).flatten(2)  # [b, H, C·W]
        _, (h, _) = self.lstm(steps)
        return self.head(torch.cat(list(h[-(2 if self.lstm.bidirectional else 1):]), dim=1))


def lstm(*, num_classes: int, input_shape: tuple[int, ...], hidden: int = 64, layers: int = 1,
         bidirectional: bool = False) -> nn.Module:
    """An LSTM classifier over the rows of an image (``RowLSTM``)."""
    if len(input_shape) < 2:
        raise UserError(f"model lstm reads images row by row; input shape {tuple(input_shape)} has no rows")
    return RowLSTM(num_classes, input_shape, hidden, layers, bidirectional)


def vit(*, num_classes: int, input_shape: tuple[int, ...], patch_size: int = 4, depth: int = 2,
        embed_dim: int = 64, num_heads: int = 4, mlp_dim: int | None = None) -> nn.Module:
    """torchvision's ``VisionTransformer`` (random weights) for square images of any channel count.
    Its attention is ``nn.MultiheadAttention``; its class token and position embedding are per-example
    broadcasts (``rules.broadcast.Broadcast``)."""
    from torchvision.models import VisionTransformer

    channels, height, width = input_shape
    if height != width or height % patch_size:
        raise UserError(f"model vit needs square images whose side divides by patch_size; got {height}x{width} "
                        f"with patch_size {patch_size}")
    model = VisionTransformer(image_size=height, patch_size=patch_size, num_layers=depth, num_heads=num_heads,
                              hidden_dim=embed_dim, mlp_dim=mlp_dim or 4 * embed_dim, num_classes=num_classes)
    model.conv_proj = nn.Conv2d(channels, embed_dim, kernel_size=patch_size, stride=patch_size)
    return model
