"""Argument checks shared by the accountant and the calibrator.

Every check raises ``ValueError`` naming the argument and the allowed range, before any
accountant work starts.
"""
from __future__ import annotations

import math

from ..errors import UserError
from .mechanisms import MECHANISMS

#: The valid ``norm_estimator`` values: those with an accountant (the registry of mechanisms).
NORM_ESTIMATORS = MECHANISMS


def check_delta(delta: float) -> float:
    """δ must lie strictly between 0 and 1."""
    delta = float(delta)
    if not (0.0 < delta < 1.0) or math.isnan(delta):
        raise UserError(f"delta must be in the open interval (0, 1); got {delta!r}")
    return delta


def check_sample_rate(sample_rate: float) -> float:
    """The Poisson sampling rate q must lie in (0, 1]."""
    sample_rate = float(sample_rate)
    if not (0.0 < sample_rate <= 1.0) or math.isnan(sample_rate):
        raise UserError(f"sample_rate must be in (0, 1]; got {sample_rate!r}")
    return sample_rate


def check_steps(steps: int) -> int:
    """The number of steps T must be a whole number ≥ 1."""
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
        raise UserError(f"steps must be a whole number >= 1; got {steps!r}")
    return int(steps)


def check_epsilon(epsilon: float) -> float:
    """A target ε must be finite and positive."""
    epsilon = float(epsilon)
    if not (0.0 < epsilon < math.inf):
        raise UserError(f"epsilon must be a finite number > 0; got {epsilon!r}")
    return epsilon


def check_noise_multiplier(noise_multiplier: float) -> float:
    """σ must be ≥ 0 and finite (σ = 0 means no privacy: ε = ∞)."""
    noise_multiplier = float(noise_multiplier)
    if not (0.0 <= noise_multiplier < math.inf):
        raise UserError(f"noise_multiplier must be a finite number >= 0; got {noise_multiplier!r}")
    return noise_multiplier


def check_estimator(norm_estimator: str, sketch_k: int | None) -> tuple[str, int | None]:
    """``norm_estimator`` is one of NORM_ESTIMATORS; ``sketch_k`` ≥ 1 is required unless exact."""
    if norm_estimator not in NORM_ESTIMATORS:
        NORM_ESTIMATORS.get(norm_estimator)  # ValueError: norm_estimator must be one of …
    if norm_estimator == "exact":
        if sketch_k is not None:
            raise UserError("sketch_k must be None when norm_estimator='exact'")
        return norm_estimator, None
    if sketch_k is None or isinstance(sketch_k, bool) or int(sketch_k) != sketch_k or sketch_k < 1:
        raise UserError(f"sketch_k must be a whole number >= 1 when norm_estimator={norm_estimator!r}; got {sketch_k!r}")
    return norm_estimator, int(sketch_k)
