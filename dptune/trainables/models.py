"""The model catalog: ``create_model(name, num_classes=…, input_shape=…, **overrides)``.

Builders live in their own modules and import nothing from here: models trained from scratch
(``scratch_models``), pretrained timm image backbones (``vision_models``) and BERT-family text
backbones (``text_models``). This module registers them by name, with an input spec for the
pretrained ones saying how the data must be prepared for them (``data_options``); open-ended
families are addressed as ``prefix:name`` (``timm:<any timm model>``, ``hf:<hub id or directory>``).
No model uses BatchNorm: batch statistics mix examples and break per-sample privacy.
"""
from __future__ import annotations

import functools
from typing import Callable

from torch import nn

from ..registry import Registry, check_options
from . import scratch_models, text_models, vision_models

MODELS: Registry[Callable[..., nn.Module]] = Registry("model")
#: How a pretrained backbone's inputs must be prepared (resolution and normalisation, or the
#: tokenizer), by model name and family: fn(**model options) -> options for the dataset loader.
#: Models trained from scratch have no entry.
INPUT_SPECS: Registry[Callable[..., dict]] = Registry("model input spec")


def register_model(name: str, builder: Callable[..., nn.Module], *,
                   inputs: Callable[..., dict] | None = None) -> None:
    """Register a model builder under ``name``, with its input spec if it is pretrained."""
    MODELS.register(name, builder)
    if inputs is not None:
        INPUT_SPECS.register(name, inputs)


def register_family(prefix: str, builder: Callable[..., nn.Module], *,
                    inputs: Callable[..., dict] | None = None) -> None:
    """Register a builder for every model named ``prefix:<rest>`` (called as builder(rest, …))."""
    MODELS.register_family(prefix, builder)
    if inputs is not None:
        INPUT_SPECS.register_family(prefix, inputs)


def create_model(name: str, *, num_classes: int, input_shape: tuple[int, ...], **overrides: object) -> nn.Module:
    """Build a registered model (or ``family:name``); unknown names raise ValueError listing the
    registered ones, unknown options one listing the options the model takes."""
    builder = MODELS.get(name)
    check_options("model", name, builder, overrides, implicit=("num_classes", "input_shape"))
    return builder(num_classes=num_classes, input_shape=tuple(input_shape), **overrides)


def data_options(name: str, **model_options: object) -> dict:
    """Options the dataset loader needs to prepare inputs for model ``name`` (image resolution and
    normalisation, or tokenizer); empty for models trained from scratch."""
    return INPUT_SPECS.get(name)(**model_options) if name in INPUT_SPECS else {}


def parameter_summary(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total


# --- the catalog -----------------------------------------------------------------------------

register_model("mlp", scratch_models.mlp)
register_model("cnn", scratch_models.cnn)
register_model("wrn16_4", scratch_models.wide_resnet)

for _name in vision_models.PAPER_VITS:
    register_model(_name, functools.partial(vision_models.create_timm_model, _name),
                   inputs=functools.partial(vision_models.vision_data_options, _name))
register_family("timm", vision_models.create_timm_model, inputs=vision_models.vision_data_options)

for _name in text_models.TEXT_BACKBONES:
    register_model(_name, functools.partial(text_models.create_text_model, _name),
                   inputs=functools.partial(text_models.text_data_options, _name))
register_family("hf", text_models.create_text_model, inputs=text_models.text_data_options)
