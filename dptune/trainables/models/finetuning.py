"""Which parameters of a pretrained backbone DP fine-tuning trains (``peft``).

- ``film``: the normalisation layers' scale and bias plus the new head (the image setting of
  "On optimal hyperparameters for DP deep transfer learning", 0.5–1.5% of ViT parameters). Fewer
  trainable parameters means less noise in total, ‖ξ‖ ∝ √d.
- ``lora``: low-rank adapters ΔW = (α/r)·BA on the target linear layers (via ``peft``) plus the head
  (that paper's text setting).
- ``head``: the new classification head only (linear probing).
- ``full``: every parameter.

Modules that are newly initialised (the head, and whatever a checkpoint lacked) are always trained:
a frozen random layer would only add noise to the features.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterable, Sequence

from torch import nn

from ...errors import UserError
from ...schema.option_registries import PEFT_METHODS

#: Normalisation layers whose affine parameters FiLM trains. Library-specific norms that do not
#: subclass these (timm RmsNorm, Llama-style RMSNorm, …) are matched by class-name suffix.
NORM_TYPES = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)
NORM_NAME_SUFFIXES = ("LayerNorm", "RMSNorm", "RmsNorm", "GroupNorm")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA hyperparameters: rank r, scale α (ΔW = (α/r)·BA), dropout on the adapter input, and the
    names (suffixes) of the linear layers that get adapters; ``fan_in_fan_out`` for layers that store
    their weight transposed (GPT-2's ``Conv1D``)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ()
    fan_in_fan_out: bool = False


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a normalisation layer (BatchNorm excluded: DP refuses it anyway)."""
    return isinstance(module, NORM_TYPES) or type(module).__name__.endswith(NORM_NAME_SUFFIXES)


def _set_trainable(modules: Iterable[nn.Module]) -> None:
    for module in modules:
        for p in module.parameters():
            p.requires_grad_(True)


def _modules_named(model: nn.Module, names: Sequence[str]) -> list[nn.Module]:
    found = dict(model.named_modules())
    missing = [n for n in names if n not in found]
    if missing:
        raise UserError(f"head module(s) {', '.join(missing)} not found in {type(model).__name__}")
    return [found[n] for n in names]


def apply_peft(model: nn.Module, method: str, *, head: Sequence[str], lora: LoraSettings | None = None) -> nn.Module:
    """Freeze ``model`` except what ``method`` trains; returns the model to train (a ``peft``
    wrapper for LoRA). ``head`` names the newly initialised modules, always trained."""
    if method not in PEFT_METHODS:
        raise UserError(f"peft must be one of {', '.join(PEFT_METHODS)}; got {method!r}")
    if method == "full":
        model.requires_grad_(True)
        return model
    heads = _modules_named(model, head)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        lora = lora or LoraSettings()
        if not lora.target_modules:
            raise UserError(f"LoRA needs target modules for {type(model).__name__}; set lora_targets")
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        absent = [t for t in lora.target_modules if not any(n == t or n.endswith(f".{t}")
                                                            for n, _ in model.named_modules())]
        if absent:
            raise UserError(f"lora_targets: {', '.join(absent)} not found in {type(model).__name__}; its linear "
                            f"layers: {', '.join(linear)}")
        config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=list(lora.target_modules), bias="none", fan_in_fan_out=lora.fan_in_fan_out)
        with warnings.catch_warnings():  # peft calls a transformers method deprecated in v5
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            model = get_peft_model(model, config)  # freezes everything but the adapters
    else:
        model.requires_grad_(False)
        if method == "film":
            _set_trainable(m for m in model.modules() if is_norm(m))
    _set_trainable(heads)
    return model
