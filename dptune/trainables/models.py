"""Model registry: ``create_model(name, num_classes=…, input_shape=…, **overrides)``.

Entry functions set architecture only. Every model here uses GroupNorm, never BatchNorm: batch
statistics mix examples and break per-sample privacy. Pretrained backbones (``vision_models``,
``text_models``) register here too, with an input spec saying how the data must be prepared for
them (``data_options``); open-ended families are addressed as ``prefix:name``.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .registry import check_options, lookup

MODELS: dict[str, Callable[..., nn.Module]] = {}
#: Factories of open-ended families by name prefix (``timm:<any timm name>``): fn(rest, **kwargs).
MODEL_FAMILIES: dict[str, Callable[..., nn.Module]] = {}
#: How a pretrained backbone's inputs must be prepared (resolution and normalisation, or the
#: tokenizer), by model name and by family prefix: fn([rest,] **model options) -> options for the
#: dataset loader. Models trained from scratch have no entry.
INPUT_SPECS: dict[str, Callable[..., dict]] = {}
FAMILY_INPUT_SPECS: dict[str, Callable[..., dict]] = {}


def register_model(name: str, *, inputs: Callable[..., dict] | None = None) -> Callable:
    """Register a model factory under ``name``, with its input spec if it is pretrained."""
    def decorate(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        MODELS[name] = fn
        if inputs is not None:
            INPUT_SPECS[name] = inputs
        return fn

    return decorate


def register_family(prefix: str, *, inputs: Callable[..., dict] | None = None) -> Callable:
    """Register a factory for every model named ``prefix:<rest>`` (called as fn(rest, …))."""
    def decorate(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        MODEL_FAMILIES[prefix] = fn
        if inputs is not None:
            FAMILY_INPUT_SPECS[prefix] = inputs
        return fn

    return decorate


def create_model(name: str, *, num_classes: int, input_shape: tuple[int, ...], **overrides: object) -> nn.Module:
    """Build a registered model (or ``family:name``); unknown names raise ValueError listing the
    registered ones, unknown options one listing the options the model takes."""
    fn = lookup(name, MODELS, MODEL_FAMILIES)
    if fn is None:
        families = "".join(f", {p}:<name>" for p in sorted(MODEL_FAMILIES))
        raise ValueError(f"model must be one of {', '.join(sorted(MODELS))}{families}; got {name!r}")
    check_options("model", name, fn, overrides, implicit=("num_classes", "input_shape"))
    return fn(num_classes=num_classes, input_shape=tuple(input_shape), **overrides)


def data_options(name: str, **model_options: object) -> dict:
    """Options the dataset loader needs to prepare inputs for model ``name`` (image resolution and
    normalisation, or tokenizer); empty for models trained from scratch."""
    spec = lookup(name, INPUT_SPECS, FAMILY_INPUT_SPECS)
    return {} if spec is None else spec(**model_options)


def parameter_summary(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total


def _flat_dim(features: nn.Module, input_shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        return features(torch.zeros(1, *input_shape)).flatten(1).shape[1]


@register_model("mlp")
def mlp(*, num_classes: int, input_shape: tuple[int, ...], hidden: int = 256, depth: int = 2) -> nn.Module:
    """Fully connected tanh network with ``depth`` hidden layers."""
    dims = [int(torch.tensor(input_shape).prod())] + [hidden] * depth
    layers: list[nn.Module] = [nn.Flatten()]
    for d_in, d_out in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(d_in, d_out), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(dims[-1], num_classes))


@register_model("cnn")
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


@register_model("wrn16_4")
def wide_resnet(*, num_classes: int, input_shape: tuple[int, ...], depth: int = 16, width: int = 4,
                groups: int = 16) -> nn.Module:
    """WideResNet-depth-width (Zagoruyko & Komodakis 2016) with GroupNorm (De et al. 2022)."""
    if (depth - 4) % 6:
        raise ValueError(f"depth must be 6n + 4; got {depth}")
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


# Pretrained backbones register themselves here (imported last: they use the registry above).
from . import text_models, vision_models  # noqa: E402,F401
