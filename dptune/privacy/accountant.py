"""ε spent by DP-SGD / DP-Adam: Poisson sampling, add/remove adjacency, PRV composition.

The PRV code (scipy, prv-accountant: about a second to import) is imported when a value is not in
the cache, so a trial whose ε curve the plan computed never loads it."""
from __future__ import annotations

import math
from typing import Sequence

from .cache import cached, make_key
from .mechanisms import step_prvs
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
    from .prv import compose_epsilon   # scipy and prv-accountant, only when a value is not cached

    worst = 0.0
    for prv in step_prvs(norm_estimator, sigma, q, sketch_k, delta=delta, steps=steps):
        worst = max(worst, compose_epsilon(prv, steps, delta))
        if worst > stop_above:
            break
    return worst


def epsilon_curve(noise_multiplier: float, delta: float, sample_rate: float, steps: Sequence[int], *,
                  norm_estimator: str = "exact", sketch_k: int | None = None) -> list[float]:
    """Upper bounds on ε after each step count in ``steps`` (e.g. a run's epoch ends), as
    :func:`epsilon_spent` gives them but from one discretisation on the mesh of the largest count
    (:func:`~dptune.privacy.prv.compose_epsilons`): a run's per-epoch ε costs about one evaluation
    instead of one per epoch. Each value is cached."""
    sigma = check_noise_multiplier(noise_multiplier)
    delta = check_delta(delta)
    q = check_sample_rate(sample_rate)
    counts = [check_steps(t) for t in steps]
    norm_estimator, sketch_k = check_estimator(norm_estimator, sketch_k)
    if sigma == 0.0:
        return [math.inf] * len(counts)
    top = max(counts)
    curve: list[float] = []

    def point(i: int) -> float:
        if not curve:   # the first value the cache lacks computes them all
            from .prv import compose_epsilons

            prvs = step_prvs(norm_estimator, sigma, q, sketch_k, delta=delta, steps=top)
            curve.extend(map(max, zip(*(compose_epsilons(prv, counts, delta) for prv in prvs))))
        return curve[i]

    return [cached(make_key("epsilon_curve", sigma=sigma, delta=delta, q=q, steps=t, mesh_steps=top,
                            estimator=norm_estimator, k=sketch_k), lambda i=i: point(i))
            for i, t in enumerate(counts)]
