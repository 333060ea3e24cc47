"""The registries of the trainer's options: the names a trial option may take, and where each lives.

Lazy entries (``"module:attr"``, imported on first :meth:`~dptune.registry.Registry.get`), so the
schema knows every allowed name without importing torch or the trainer; the models' and datasets'
registries stay with the trainer (``dptune.trainables.registries``), which re-exports these.
Adding an optimizer, a clipping function, a norm estimator (with its accountant in ``privacy``), a
denoiser or a diagnostic is one line here and its implementation in its own module.
"""
from __future__ import annotations

from ..privacy.mechanisms import MECHANISMS
from ..privacy.randomness_modes import RANDOMNESS  # noqa: F401  (the randomness modes; the first is the default)
from ..registry import Registry

_T = "dptune.trainables."

OPTIMIZERS: Registry = Registry("optimizer")
for _name in ("sgd", "adam", "adamw"):
    OPTIMIZERS.register_lazy(_name, f"{_T}engine.optimizers:{_name}")

CLIP_FNS: Registry = Registry("clip_fn")
CLIP_FNS.register_lazy("flat", f"{_T}engine.clip_factors:flat_clip")
CLIP_FNS.register_lazy("auto_s", f"{_T}engine.clip_factors:auto_s_clip")

#: The per-sample engine of each ``norm_estimator``: the book-keeping hook engine with that estimator
#: (exact: ghost or materialised weight norms; or a randomised one). One entry per accountant
#: (``privacy.mechanisms.MECHANISMS``), under the same name: the names are declared once, there.
NORM_ENGINES: Registry = Registry("norm_estimator")
for _name in MECHANISMS:
    NORM_ENGINES.register_lazy(_name, f"{_T}engine.book_keeping:BookKeepingEngine", estimator=_name)

DENOISERS: Registry = Registry("denoise")
DENOISERS.register_lazy("rmt", f"{_T}engine.denoise:RMTDenoiser")

DENOISE_SCOPES: Registry = Registry("denoise_scope")
DENOISE_SCOPES.register_lazy("all", f"{_T}engine.denoise:every_matrix")
DENOISE_SCOPES.register_lazy("lora", f"{_T}engine.denoise:lora_factors")

DIAGNOSTICS: Registry = Registry("diagnostics")
DIAGNOSTICS.register_lazy("denoise_cosine", f"{_T}engine.denoise:CosineDiagnostic")

#: Mixed precision of training (``engine.precision``): float32 throughout, or the forward and backward
#: autocast to bf16 or fp16 (norms, clipping, sums and noise stay float32). The first is the default.
PRECISIONS = ("fp32", "bf16", "fp16")

#: What ``peft`` may train (``finetuning.apply_peft`` implements each).
PEFT_METHODS = ("film", "lora", "head", "full")
