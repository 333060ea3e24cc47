"""The flat, typed configuration of one training run (a trial), validated before any work.

Each field carries its help text and, where its values come from a registry, that registry's
names (``metadata["choices"]``, from the torch-free :mod:`.names`, which a test keeps equal to the
registries): ``dptune train`` builds one flag per field from them, so a new option is one edit
here, and ``dptune train --help`` imports no torch.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Collection

from .names import (CLIP_FN_NAMES, DEFAULT_KAPPA, DENOISE_SCOPE_NAMES, DENOISER_NAMES, DIAGNOSTIC_NAMES,
                    NORM_ENGINE_NAMES, OPTIMIZER_NAMES, PEFT_METHOD_NAMES)


def option(default: Any, help: str, *, choices: Collection[str] | None = None) -> Any:
    """A config field: its default, its help text, and the registry (or names) its values come from
    (``None`` is allowed besides them when the default is ``None``)."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class TrainConfig:
    dataset: str = option("digits", "registered dataset (digits, mnist5k, bbc_news, cifar100, …)")
    model: str = option("cnn", "registered model (mlp, cnn, wrn16_4, all-MiniLM-L6-v2, "
                               "vit_tiny_patch16_224.augreg_in21k, timm:<name>, hf:<hub id or dir>, …)")
    epsilon: float = option(8.0, "privacy budget ε; 'inf' trains the non-private baseline")
    delta: float = option(1e-5, "δ")
    clip_bound: float = option(1.0, "clipping bound C")
    batch_size: int = option(128, "expected (Poisson) batch size B")
    learning_rate: float = option(2.0, "learning rate η (ĝ is normalised by B·C, so η does not move with C)")
    epochs: float = option(10.0, "epochs E: the run takes T = ⌈E·N/B⌉ steps")
    optimizer: str = option("sgd", "optimizer of the privatised gradient", choices=OPTIMIZER_NAMES)
    momentum: float = option(0.0, "SGD momentum")
    weight_decay: float = option(0.0, "weight decay")
    clip_fn: str = option("flat", "per-sample clipping: flat min(1, C/n_i), or auto_s C/(n_i + γ) (AUTO-S)",
                          choices=CLIP_FN_NAMES)
    norm_estimator: str = option("exact", "per-sample norms: exact, or randomized clipping (Hutchinson / Hutch++ "
                                          "with --sketch-k probes; σ is calibrated with its accountant)",
                                 choices=NORM_ENGINE_NAMES)
    sketch_k: int | None = option(None, "probes k of hutchinson / hutchpp (e.g. 32)")
    denoise: str | None = option(None, "denoise the privatised gradient of 2-D parameters (rmt: RMT spectral "
                                       "shrinkage; post-processing, no privacy cost)", choices=DENOISER_NAMES)
    denoise_kappa: float = option(DEFAULT_KAPPA, "RMT gate κ: a layer is denoised only if its top singular value "
                                                 "exceeds κ times the noise bulk edge s(√m+√n)")
    denoise_norm_correction: bool = option(True, "RMT: rescale the denoised matrix to ‖ĝ‖_F (the paper's norm "
                                                 "correction); false keeps the shrunk matrix (an ablation)")
    denoise_scope: str = option("all", "which 2-D parameters are denoised: all, or lora (LoRA factors only)",
                                choices=DENOISE_SCOPE_NAMES)
    diagnostics: list = field(default_factory=list, metadata={
        "help": "non-private diagnostics (denoise_cosine: per step and 2-D layer, cosine of ĝ and of its "
                "denoised version to the clipped mean before noise; NOT private; nothing to measure without "
                "noise, so a non-private run (ε = inf) ignores it)", "choices": DIAGNOSTIC_NAMES})
    max_physical_batch_size: int | None = option(None, "split logical batches into micro-batches of this size "
                                                       "(memory only; same result)")
    seed: int = option(0, "seed of the data split, the model, the batches and the noise")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    noise_multiplier: float | None = option(None, "σ precomputed by a planner [calibrated here from ε, δ, q, T]")
    model_options: dict = field(default_factory=dict, metadata={
        "help": "architecture overrides for the model, as a JSON object (e.g. '{\"hidden\": 64}')", "choices": None})
    peft: str | None = option(None, "pretrained backbones: what is trained (film: norm scale/bias + head; lora: "
                                    "adapters + head; head; full) [the backbone's default: film for ViT, lora for "
                                    "text]", choices=PEFT_METHOD_NAMES)
    weights: str | None = option(None, "pretrained backbones: a local checkpoint file or directory, or 'random' "
                                       "[hub, or the HF cache when the hub is unreachable]")
    data_dir: str | None = option(None, "local copy of an HF dataset: a save_to_disk directory, Parquet files or an "
                                        "image folder")
    max_length: int | None = option(None, "text: tokens per example [the dataset's default, 128]")
    validation_fraction: float = option(0.0, "hold out this seeded, stratified fraction of the training data for "
                                             "selection: 'accuracy' is then validation accuracy, test accuracy is "
                                             "reported beside it (selection on it is NOT private); σ is calibrated "
                                             "for the examples actually trained on [0: no validation split]")
    split_seed: int | None = option(None, "seed of the train/test and validation splits [seed]; private selection "
                                          "fixes it per cell so every trial sees the same split")
    score_noise: float | None = option(None, "private selection: evaluate nothing during training, then release the "
                                             "validation accuracy once with Gaussian noise of this std (no test "
                                             "evaluation: only the selected trial is tested, after selection)")

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)

    def validate(self) -> "TrainConfig":
        """Raise ValueError naming the first bad field and what is allowed."""
        def need(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise ValueError(f"{name} must be {allowed}; got {getattr(self, name)!r}")

        need(self.epsilon > 0, "epsilon", "> 0 (or inf for non-private training)")
        need(0 < self.delta < 1, "delta", "in (0, 1)")
        need(self.clip_bound > 0, "clip_bound", "> 0")
        need(isinstance(self.batch_size, int) and self.batch_size >= 1, "batch_size", "a whole number >= 1")
        need(self.learning_rate > 0, "learning_rate", "> 0")
        need(self.epochs > 0, "epochs", "> 0")
        need(self.momentum >= 0, "momentum", ">= 0")
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices is not None and f.name != "diagnostics":
                value = getattr(self, f.name)
                optional = f.default is None
                need((optional and value is None) or value in choices, f.name,
                     ("None or " if optional else "") + f"one of {', '.join(choices)}")
        from ..privacy import NORM_ESTIMATORS  # the accountant (scipy): only when validating

        need(self.norm_estimator in NORM_ESTIMATORS, "norm_estimator",
             f"one with an accountant: {', '.join(NORM_ESTIMATORS)}")
        need(math.isfinite(self.denoise_kappa) and self.denoise_kappa >= 1, "denoise_kappa",
             ">= 1 (the gate sits at κ times the noise bulk edge)")
        need(isinstance(self.denoise_norm_correction, bool), "denoise_norm_correction", "true or false")
        need(isinstance(self.diagnostics, (list, tuple)) and all(d in DIAGNOSTIC_NAMES for d in self.diagnostics),
             "diagnostics", f"a list of names from: {', '.join(DIAGNOSTIC_NAMES)}")
        need(self.max_physical_batch_size is None or self.max_physical_batch_size >= 1,
             "max_physical_batch_size", "None or >= 1")
        need(self.noise_multiplier is None or self.noise_multiplier >= 0, "noise_multiplier", "None or >= 0")
        need(0 <= self.validation_fraction < 1, "validation_fraction", "in [0, 1)")
        need(self.score_noise is None or (self.score_noise > 0 and self.validation_fraction > 0 and self.private),
             "score_noise", "None, or > 0 for a private run with a validation split (validation_fraction > 0)")
        need(self.max_length is None or (isinstance(self.max_length, int) and self.max_length >= 2), "max_length",
             "None or a whole number >= 2")
        return self

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """Build from a mapping; unknown keys are errors (typos must not be silently ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown training option(s): {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
