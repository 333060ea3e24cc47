"""Noise calibration: the smallest σ whose ε (upper bound) does not exceed the target.

Few accountant evaluations: a μ-GDP central-limit guess (Bu et al. 2020) starts the search,
secant steps in log–log space bracket the root, and Illinois regula falsi narrows the bracket to
``rel_tol``. Only σ values whose ε was *evaluated* to be ≤ target are ever returned.

A caller that knows a better starting point (the planner: the CLT guess corrected by the ratio a
neighbouring batch size needed, see :func:`clt_noise_guess`) passes ``guess``; the search then
starts with small steps and often brackets the root with two evaluations. The result satisfies
the same guarantee either way: ε(σ) ≤ target and σ at most ``REL_TOL`` above the smallest such σ.
"""
from __future__ import annotations

import math
from typing import Sequence

from ..errors import UserError
from .cache import cached, make_key
from .validation import check_delta, check_epsilon, check_estimator, check_sample_rate, check_steps

#: Relative width (0.1%) of the final bracket [σ_lo, σ_hi]: the σ_hi returned is at most 0.1% above the
#: smallest σ whose ε meets the target.
REL_TOL = 1e-3
SIGMA_MIN, SIGMA_MAX = 0.05, 1e4


def gdp_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of μ-GDP (Dong, Roth, Su 2019, Cor. 2.13)."""
    from scipy import stats

    return float(stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon + stats.norm.logcdf(-epsilon / mu - mu / 2)))


def clt_noise_guess(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """σ from the CLT: T Poisson-subsampled Gaussian steps ≈ μ-GDP, μ = q√(T(e^{1/σ²} − 1)).

    Exact for q = 1 (composition of Gaussians); optimistic (too small σ) otherwise, so it is
    only a starting point.
    """
    from scipy import optimize

    gap = lambda m: gdp_delta(epsilon, m) - delta  # noqa: E731
    if gap(500.0) < 0:   # an ε so large that μ-GDP needs μ > 500: the least noise there is (the search says so)
        return SIGMA_MIN
    mu = optimize.brentq(gap, 1e-6, 500.0)
    ratio = mu**2 / (sample_rate**2 * steps)
    return float(min(max(1.0 / math.sqrt(math.log1p(ratio)), SIGMA_MIN), SIGMA_MAX))


def calibrate_noise(epsilon: float, delta: float, sample_rate: float, steps: int, *,
                    norm_estimator: str = "exact", sketch_k: int | None = None,
                    guess: float | None = None) -> float:
    """Smallest noise multiplier σ (to 0.1% relative) with ``epsilon_spent(σ, …) <= epsilon``.

    Raises ValueError for invalid arguments or a target that no σ in [0.05, 10⁴] reaches.
    Cached in memory and on disk. ``guess`` (optional) is where the search starts: it changes the
    cost, not the guarantee (the cached value serves callers with or without one).

    >>> from dptune.privacy import epsilon_spent
    >>> sigma = calibrate_noise(3.0, 1e-5, 0.02, 489)
    >>> epsilon_spent(sigma, 1e-5, 0.02, 489) <= 3.0
    True
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    q = check_sample_rate(sample_rate)
    steps = check_steps(steps)
    norm_estimator, sketch_k = check_estimator(norm_estimator, sketch_k)
    return cached(sigma_key(epsilon, delta, q, steps, norm_estimator, sketch_k),
                  lambda: _search(epsilon, delta, q, steps, norm_estimator, sketch_k, guess=guess))


def sigma_key(epsilon: float, delta: float, sample_rate: float, steps: int, norm_estimator: str = "exact",
              sketch_k: int | None = None) -> str:
    """The cache key of ``calibrate_noise``'s result for validated inputs (the planner reads the
    cache with it before importing the accountant)."""
    return make_key("sigma", epsilon=float(epsilon), delta=float(delta), q=float(sample_rate), steps=int(steps),
                    estimator=norm_estimator, k=sketch_k, rel_tol=REL_TOL)


def calibrate_noise_series(epsilon: float, delta: float, schedules: Sequence[tuple[float, int]], *,
                           norm_estimator: str = "exact", sketch_k: int | None = None) -> list[float]:
    """``calibrate_noise`` for each (sample_rate, steps) of ``schedules``, in the order given, each
    search warm-started (its ``guess``) from those before it: the CLT guess times the ratio
    σ/σ_CLT that its neighbours needed (extrapolated linearly in log q from the last two). Give the
    batch sizes of one cell in increasing order (σ/σ_CLT varies smoothly along them). The same
    calls, so the same guarantee and the same cache entries, as ``calibrate_noise``."""
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    seen: list[tuple[float, float]] = []  # (log q, log σ/σ_CLT) of the schedules done
    sigmas = []
    for sample_rate, steps in schedules:
        q, steps = check_sample_rate(sample_rate), check_steps(steps)
        clt = clt_noise_guess(epsilon, delta, q, steps)
        if len(seen) >= 2 and seen[-1][0] != seen[-2][0]:
            (x0, r0), (x1, r1) = seen[-2:]
            log_ratio = r1 + (r1 - r0) * (math.log(q) - x1) / (x1 - x0)
        else:
            log_ratio = seen[-1][1] if seen else 0.0
        guess = clt * math.exp(log_ratio) if seen else None
        sigma = calibrate_noise(epsilon, delta, q, steps, norm_estimator=norm_estimator, sketch_k=sketch_k,
                                guess=guess)
        seen.append((math.log(q), math.log(sigma / clt)))
        sigmas.append(sigma)
    return sigmas


def _search(target: float, delta: float, q: float, steps: int, estimator: str, k: int | None, *,
            guess: float | None = None) -> float:
    from .accountant import worst_direction_epsilon

    def log_gap(sigma: float) -> float:
        eps = worst_direction_epsilon(sigma, delta, q, steps, estimator, k, stop_above=target)
        return math.log(eps / target) if math.isfinite(eps) else math.inf

    # Bracket in x = log σ: f(x) > 0 (too little noise) at lo, f(x) <= 0 at hi.
    if guess is not None and SIGMA_MIN <= guess <= SIGMA_MAX:  # a close start: steps as small as the tolerance
        x, min_step = math.log(guess), REL_TOL / 3
    else:
        x, min_step = math.log(clt_noise_guess(target, delta, q, steps)), 0.01
    fx = log_gap(math.exp(x))
    slope = -1.0  # d log ε / d log σ, refined by secant steps
    lo = hi = None
    while lo is None or hi is None:
        if fx > 0:
            lo = (x, fx)
        else:
            hi = (x, fx)
        if lo is not None and hi is not None:
            break
        step = -fx / slope if math.isfinite(fx) else 0.5
        step = math.copysign(min(max(abs(step) * 1.05, min_step), 2.0), step if step else 1.0)
        min_step = min(4 * min_step, 0.01)  # a start that was not close after all: widen the steps
        x_new = x + step
        if x_new > math.log(SIGMA_MAX):
            raise UserError(f"epsilon={target} is not reachable at delta={delta}, sample_rate={q}, "
                             f"steps={steps} with any noise_multiplier <= {SIGMA_MAX:g}")
        if x_new < math.log(SIGMA_MIN):
            raise UserError(f"epsilon={target} is so large that it needs noise_multiplier < {SIGMA_MIN}; "
                             "use epsilon=inf for non-private training")
        f_new = log_gap(math.exp(x_new))
        if math.isfinite(fx) and math.isfinite(f_new) and f_new != fx:
            slope = min((f_new - fx) / (x_new - x), -0.05)
        x, fx = x_new, f_new

    # Illinois regula falsi on [lo, hi].
    (xl, fl), (xh, fh) = lo, hi
    side = 0
    while math.exp(xh - xl) - 1 > REL_TOL:
        if math.isfinite(fl):
            xm = xh - fh * (xh - xl) / (fh - fl)
            xm = min(max(xm, xl + 0.05 * (xh - xl)), xh - 0.05 * (xh - xl))
        else:
            xm = 0.5 * (xl + xh)
        fm = log_gap(math.exp(xm))
        if fm > 0:
            xl, fl = xm, fm
            if side == -1:
                fh /= 2
            side = -1
        else:
            xh, fh = xm, fm
            if side == 1:
                fl /= 2
            side = 1
    return math.exp(xh)
