"""The model catalog: ``create_model(name, num_classes=…, input_shape=…, **overrides)``.

Builders live in their own modules: models trained from scratch (``scratch_models``), pretrained
timm image backbones (``vision_models``) and BERT-family text backbones (``text_models``). Their
names, and the input spec of the pretrained ones saying how the data must be prepared for them
(``data_options``), are registered lazily in :mod:`dptune.trainables.registries`; open-ended families are addressed
as ``prefix:name`` (``timm:<any timm model>``, ``hf:<hub id or directory>``). No model uses
BatchNorm: batch statistics mix examples and break per-sample privacy.
"""
from __future__ import annotations

import torch
from torch import nn

from ...registry import check_options
from ..registries import CAUSAL_LMS, INPUT_SPECS, LM_INPUT_SPECS, MODELS


def create_model(name: str, *, num_classes: int, input_shape: tuple[int, ...], task: str = "classification",
                 **overrides: object) -> nn.Module:
    """Build a registered model (or ``family:name``) for ``task`` (a generation task builds a causal
    LM: ``hf:<name>`` is then ``AutoModelForCausalLM``); unknown names raise ValueError listing the
    registered ones, unknown options one listing the options the model takes. Its weights are never
    half precision: float32 master weights (mixed precision is ``precision``'s autocast)."""
    builder = (CAUSAL_LMS if task == "generation" else MODELS).get(name)
    check_options("model", name, builder, overrides, implicit=("num_classes", "input_shape"))
    model = builder(num_classes=num_classes, input_shape=tuple(input_shape), **overrides)
    if any(p.dtype in (torch.float16, torch.bfloat16) for p in model.parameters()):
        model = model.float()   # float32 master weights (``precision`` autocasts the forward only)
    return model


def data_options(name: str, task: str = "classification", **model_options: object) -> dict:
    """Options the dataset loader needs to prepare inputs for model ``name`` (image resolution and
    normalisation, or tokenizer); empty for models trained from scratch."""
    specs = LM_INPUT_SPECS if task == "generation" else INPUT_SPECS
    return specs.get(name)(**model_options) if name in specs else {}


def parameter_summary(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total
