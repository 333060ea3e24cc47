"""ε spent by DP-SGD / DP-Adam: Poisson sampling, add/remove adjacency, PRV composition."""
from __future__ import annotations

import math

from .cache import cached, make_key
from .mechanisms import step_prvs
from .prv import compose_epsilon
from .validation import check_delta, check_estimator, check_noise_multiplier, check_sample_rate, check_steps


def epsilon_spent(noise_multiplier: float, delta: float, sample_rate: float, steps: int, *,
                  norm_estimator: str = "exact", sketch_k: int | None = None) -> float:
    """An upper bound on ε after ``steps`` Poisson-sampled steps (PRV accountant).

    Noise std σ·C on sums of examples clipped to C; ``sample_rate`` q = B/N; add/remove adjacency
    (the worse direction). The bound includes the accountant's discretisation error, so the true
    ε is never larger. σ = 0 gives ε = ∞. Results are cached (see ``dptune.privacy.cache``).

    >>> round(epsilon_spent(1.5, 1e-5, 0.04, 2250), 2)  # Gopi et al. 2021, Table 1
    6.78
    """
    sigma = check_noise_multiplier(noise_multiplier)
    delta = check_delta(delta)
    q = check_sample_rate(sample_rate)
    steps = check_steps(steps)
    norm_estimator, sketch_k = check_estimator(norm_estimator, sketch_k)
    if sigma == 0.0:
        return math.inf
    key = make_key("epsilon", sigma=sigma, delta=delta, q=q, steps=steps, estimator=norm_estimator, k=sketch_k)
    return cached(key, lambda: worst_direction_epsilon(sigma, delta, q, steps, norm_estimator, sketch_k))


def worst_direction_epsilon(sigma: float, delta: float, q: float, steps: int, norm_estimator: str,
                            sketch_k: int | None, stop_above: float = math.inf) -> float:
    """ε of the worse adjacency direction; stops early once one direction exceeds ``stop_above``
    (then the value returned is only known to exceed it). Inputs must be validated already."""
    worst = 0.0
    for prv in step_prvs(norm_estimator, sigma, q, sketch_k, delta=delta, steps=steps):
        worst = max(worst, compose_epsilon(prv, steps, delta))
        if worst > stop_above:
            break
    return worst
