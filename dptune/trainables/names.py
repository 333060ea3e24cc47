"""The names of the trainer's registered options, without importing torch.

``dptune train --help`` and ``TrainConfig`` list and check these names; the registries that hold
the implementations (``optimizers.OPTIMIZERS``, ``clip_factors.CLIP_FNS``, ``engine.NORM_ENGINES``,
``engine.DENOISERS``, ``finetuning.PEFT_METHODS``) import torch. A test checks that every list
here equals its registry, so a new entry is added in both places or the test fails.
"""
from __future__ import annotations

OPTIMIZER_NAMES = ("sgd", "adam", "adamw")
CLIP_FN_NAMES = ("flat", "auto_s")
NORM_ENGINE_NAMES = ("exact", "hutchinson", "hutchpp")
DENOISER_NAMES = ("rmt",)
PEFT_METHOD_NAMES = ("film", "lora", "head", "full")
#: Which 2-D gradients a denoiser sees (``engine.DENOISE_SCOPES``): every 2-D parameter, or LoRA factors only.
DENOISE_SCOPE_NAMES = ("all", "lora")
#: Non-private diagnostics a run may compute (``engine.DIAGNOSTICS``).
DIAGNOSTIC_NAMES = ("denoise_cosine",)
#: RMT gate κ (``denoise.DEFAULT_KAPPA``).
DEFAULT_KAPPA = 1.02
