"""Per-step privacy random variables for each way of clipping, by ``norm_estimator``.

A registry (``MECHANISMS``; its names are the valid ``norm_estimator`` values): each entry maps
(σ, q, sketch_k) to the PRVs of one step, one per adjacency direction (add/remove adjacency is the
worse of the two). Randomised clipping adds its own entries (module ``randomized``). Builders also
receive the target ``delta`` and the number of ``steps`` (keywords), for mechanisms that charge a
small per-step tail to δ.

Importing this module is cheap (no scipy): the exact mechanism imports the PRV code when called,
and the randomised ones are lazy entries (their module is imported when first used), so validating
a ``norm_estimator`` (``dptune plan`` with a warm cache) loads no accountant.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from ..registry import Registry

if TYPE_CHECKING:
    from .prv import StepPRV

MechanismBuilder = Callable[..., Sequence["StepPRV"]]  # (σ, q, sketch_k, *, delta, steps)
MECHANISMS: Registry[MechanismBuilder] = Registry("norm_estimator")


def register_mechanism(norm_estimator: str) -> Callable[[MechanismBuilder], MechanismBuilder]:
    """Decorator: ``builder`` is the accountant of ``norm_estimator``."""
    return MECHANISMS.register(norm_estimator)


@register_mechanism("exact")
def exact_clipping(noise_multiplier: float, sample_rate: float, sketch_k: int | None, *, delta: float,
                   steps: int) -> Sequence[StepPRV]:
    """DP-SGD with exact per-sample norms: the Poisson-subsampled Gaussian, both directions."""
    from .prv import SubsampledGaussianPRV

    directions = ("remove",) if sample_rate == 1.0 else ("remove", "add")  # q = 1: the two coincide
    return [SubsampledGaussianPRV(sample_rate, noise_multiplier, d) for d in directions]


# Hutchinson and Hutch++ share one accountant: the Z_env envelope bounds both (privacy/randomized.py).
for _name in ("hutchinson", "hutchpp"):
    MECHANISMS.register_lazy(_name, "dptune.privacy.randomized:randomized_clipping")


def step_prvs(norm_estimator: str, noise_multiplier: float, sample_rate: float,
              sketch_k: int | None, *, delta: float, steps: int) -> Sequence[StepPRV]:
    """The per-step PRVs of a clipping method (ValueError naming the registered ones if unknown)."""
    return MECHANISMS.get(norm_estimator)(noise_multiplier, sample_rate, sketch_k, delta=delta, steps=steps)
