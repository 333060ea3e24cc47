"""The flat, typed configuration of one training run (a trial), validated before any work."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ..privacy import NORM_ESTIMATORS
from .clip_factors import CLIP_FNS
from .denoise import DEFAULT_KAPPA
from .engine import DENOISERS
from .finetuning import PEFT_METHODS
from .optimizers import OPTIMIZERS


@dataclass
class TrainConfig:
    dataset: str = "digits"            # a name registered in trainables.data
    model: str = "cnn"                 # a name registered in trainables.models
    epsilon: float = 8.0               # target ε; math.inf trains without privacy
    delta: float = 1e-5
    clip_bound: float = 1.0            # C
    batch_size: int = 128              # expected (Poisson) batch size B
    learning_rate: float = 2.0         # η (ĝ is normalised by B·C, so η does not move with C)
    epochs: float = 10.0               # E: the run takes T = ⌈E·N/B⌉ steps
    optimizer: str = "sgd"             # sgd | adam | adamw
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_fn: str = "flat"              # flat | auto_s
    norm_estimator: str = "exact"
    sketch_k: int | None = None
    denoise: str | None = None         # None | rmt: spectral denoising of 2-D gradients (no privacy cost)
    denoise_kappa: float = DEFAULT_KAPPA  # RMT gate κ: denoise a layer only if λ̃₁ > κ·s(√m+√n)
    max_physical_batch_size: int | None = None
    seed: int = 0
    device: str = "auto"               # auto | cpu | cuda | cuda:N
    noise_multiplier: float | None = None  # σ precomputed by a planner; None: calibrate here
    model_options: dict = field(default_factory=dict)
    peft: str | None = None            # pretrained backbones: film | lora | head | full (None: the backbone's default)
    weights: str | None = None         # pretrained backbones: None (hub, or HF cache) | local file/dir | "random"
    data_dir: str | None = None        # local copy of an HF dataset: save_to_disk dir, Parquet files or image folder
    max_length: int | None = None      # text: tokens per example (None: the dataset's default, 128)

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
        need(self.optimizer in OPTIMIZERS, "optimizer", f"one of {', '.join(OPTIMIZERS)}")
        need(self.momentum >= 0, "momentum", ">= 0")
        need(self.clip_fn in CLIP_FNS, "clip_fn", f"one of {', '.join(CLIP_FNS)}")
        need(self.norm_estimator in NORM_ESTIMATORS, "norm_estimator", f"one of {', '.join(NORM_ESTIMATORS)}")
        need(self.denoise is None or self.denoise in DENOISERS, "denoise", f"None or one of {', '.join(DENOISERS)}")
        need(math.isfinite(self.denoise_kappa) and self.denoise_kappa >= 1, "denoise_kappa",
             ">= 1 (the gate sits at κ times the noise bulk edge)")
        need(self.max_physical_batch_size is None or self.max_physical_batch_size >= 1,
             "max_physical_batch_size", "None or >= 1")
        need(self.noise_multiplier is None or self.noise_multiplier >= 0, "noise_multiplier", "None or >= 0")
        need(self.peft is None or self.peft in PEFT_METHODS, "peft", f"None or one of {', '.join(PEFT_METHODS)}")
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
