"""Accounting of private hyperparameter selection ("Hyperparameter Tuning with Renyi Differential
Privacy", Papernot & Steinke, ICLR 2022; Liu & Talwar, STOC 2019 for the geometric case).

A **trial** is one DP mechanism: DP training (T Poisson-subsampled Gaussian steps, noise
multiplier σ, sample rate q) composed with the release of its validation score plus Gaussian noise
(accuracy has sensitivity 1/n_val, so a score noise of std s is a Gaussian mechanism with noise
multiplier s·n_val). Selection runs K trials, K drawn from a :class:`TrialCount` (truncated
negative binomial, Poisson or geometric), each with hyperparameters drawn independently of the
data, and releases only the best noisy score's trial. Its RDP comes from Google's ``dp-accounting``
(``RepeatAndSelectDpEvent`` in ``RdpAccountant``): this module builds the events, converts RDP to
(ε, δ) and solves the inverse (the per-trial σ whose repeat-and-select total meets a budget).

The guarantee holds only if K is drawn from exactly this law, every drawn trial runs to its end
and only the winner (its model, hyperparameters and noisy score) leaves the selection: trials
chosen adaptively (a grid, TPE), early stopping on validation scores, or a second look at the
validation or test data void it. ``dp_accounting`` is imported on first use (it takes seconds).
"""
from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Iterator

from ..errors import UserError
from .cache import cached, make_key
from .calibration import REL_TOL, SIGMA_MAX
from .validation import check_delta, check_epsilon, check_sample_rate, check_steps

#: Law of K by name: dp-accounting's ``shape`` (None: the spec's ``shape``, η of the truncated
#: negative binomial; 1: geometric; inf: Poisson).
DISTRIBUTIONS: dict[str, float | None] = {"truncated_negative_binomial": None, "geometric": 1.0,
                                          "poisson": math.inf}


@contextmanager
def _quiet_absl() -> Iterator[None]:
    """dp-accounting logs a warning for every Rényi order it cannot bound (it drops that order, a
    conservative choice); keep those out of a plan's output."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _tnb_mean(gamma: float, shape: float) -> float:
    """E[K] of the truncated negative binomial (η = ``shape``; η = 0 is the logarithmic law)."""
    if shape == 0:
        return (1 - gamma) / (gamma * math.log(1 / gamma))
    return shape * (1 - gamma) / (gamma * (1 - gamma ** shape))


@dataclass(frozen=True)
class TrialCount:
    """The law of the number of trials K (``selection.distribution``, ``mean_trials``, ``shape``).

    ``shape`` is dp-accounting's: η > 0 for the truncated negative binomial (P(K = k) ∝
    C(k+η−1, k)(1−γ)^k for k ≥ 1), 0 its logarithmic limit, 1 the geometric law, inf Poisson
    (K = 0 possible: nothing is released).
    """

    distribution: str
    mean: float
    shape: float

    @classmethod
    def of(cls, distribution: str, mean: float, shape: float | None = None) -> "TrialCount":
        """Validate and build; ``shape`` only for the truncated negative binomial (default 1)."""
        if distribution not in DISTRIBUTIONS:
            raise UserError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}; got {distribution!r}")
        fixed = DISTRIBUTIONS[distribution]
        if fixed is not None and shape is not None:
            raise UserError(f"shape only applies to truncated_negative_binomial ({distribution} fixes it)")
        shape = fixed if fixed is not None else (1.0 if shape is None else float(shape))
        if not (math.isfinite(shape) or fixed is not None) or shape < 0:
            raise UserError(f"shape must be a finite number >= 0; got {shape!r}")
        least = 1.0 if distribution == "poisson" else 1.0 + 1e-9
        if not math.isfinite(mean) or mean < least:
            raise UserError(f"mean_trials must be {'>= 1' if distribution == 'poisson' else '> 1'}; got {mean!r}")
        return cls(distribution, float(mean), shape)

    @property
    def gamma(self) -> float:
        """γ of the truncated negative binomial whose mean is ``mean`` (not for Poisson)."""
        from scipy import optimize

        if math.isinf(self.shape):
            raise ValueError("the Poisson law has no γ")
        return float(optimize.brentq(lambda g: _tnb_mean(g, self.shape) - self.mean, 1e-15, 1 - 1e-12,
                                     xtol=1e-15, rtol=1e-14))

    def sample(self, uniform: float) -> int:
        """K at ``uniform`` ∈ (0, 1) by the inverse CDF (the smallest k with P(K ≤ k) ≥ uniform): K
        is as random, and as secret, as the uniform the caller draws (a CSPRNG's, for a release)."""
        from scipy import stats

        if not 0 < uniform < 1:
            raise ValueError(f"uniform must be in (0, 1); got {uniform!r}")
        if math.isinf(self.shape):
            return int(stats.poisson.ppf(uniform, self.mean))
        gamma = self.gamma
        if self.shape == 0:
            return int(stats.logser.ppf(uniform, 1 - gamma))
        empty = stats.nbinom.pmf(0, self.shape, gamma)   # conditioned on K >= 1
        return int(stats.nbinom.ppf(empty + uniform * (1 - empty), self.shape, gamma))

    def event(self, trial: Any) -> Any:
        """dp-accounting's repeat-and-select event of ``trial``."""
        from dp_accounting import dp_event

        return dp_event.RepeatAndSelectDpEvent(trial, self.mean, self.shape)


def score_noise_multiplier(score_noise: float, validation_size: int) -> float:
    """Noise multiplier of the score release: std ``score_noise`` over sensitivity 1/n_val."""
    if not score_noise > 0:
        raise UserError(f"score_noise must be > 0; got {score_noise!r}")
    if validation_size < 1:
        raise UserError(f"validation_size must be >= 1; got {validation_size!r}")
    return float(score_noise) * int(validation_size)


def trial_event(noise_multiplier: float, sample_rate: float, steps: int, score_multiplier: float) -> Any:
    """One trial: T Poisson-subsampled Gaussian steps, then the Gaussian release of its score."""
    from dp_accounting import dp_event

    training = dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier)), steps)
    return dp_event.ComposedDpEvent([training, dp_event.GaussianDpEvent(score_multiplier)])


def rdp_epsilon(event: Any, delta: float) -> float:
    """ε at δ of an event, from dp-accounting's RDP accountant (add/remove adjacency)."""
    from dp_accounting.rdp import RdpAccountant

    with _quiet_absl():
        accountant = RdpAccountant()
        accountant.compose(event)
        return float(accountant.get_epsilon(delta))


@dataclass(frozen=True)
class SelectionPrivacy:
    """The privacy of one cell's selection: per-trial and total ε at the cell's δ."""

    noise_multiplier: float
    score_multiplier: float
    trial_epsilon: float
    total_epsilon: float


def _key(kind: str, count: TrialCount, **inputs: object) -> str:
    """Cache key of a selection figure: its inputs, the law of K and dp-accounting's version."""
    return make_key(kind, distribution=count.distribution, mean=count.mean, shape=count.shape,
                    dp_accounting=metadata.version("dp-accounting"), **inputs)


def selection_privacy(noise_multiplier: float, sample_rate: float, steps: int, *, score_multiplier: float,
                      count: TrialCount, delta: float) -> SelectionPrivacy:
    """Per-trial ε (training + score release) and the repeat-and-select total, both at ``delta``
    (cached like σ, :mod:`.cache`)."""
    trial = trial_event(noise_multiplier, sample_rate, steps, score_multiplier)
    inputs = dict(sigma=float(noise_multiplier), q=float(sample_rate), steps=int(steps),
                  score=float(score_multiplier), delta=float(delta))
    return SelectionPrivacy(noise_multiplier, score_multiplier,
                            cached(_key("selection_trial_eps", count, **inputs), lambda: rdp_epsilon(trial, delta)),
                            cached(_key("selection_total_eps", count, **inputs),
                                   lambda: rdp_epsilon(count.event(trial), delta)))


def calibrate_selection_noise(epsilon: float, delta: float, sample_rate: float, steps: int, *,
                              score_multiplier: float, count: TrialCount) -> float:
    """The smallest training σ (to ``REL_TOL`` relative) whose repeat-and-select total ε at δ does not
    exceed ``epsilon``; a ValueError when the score release alone already spends it."""
    check_epsilon(epsilon)
    check_delta(delta)
    check_sample_rate(sample_rate)
    check_steps(steps)
    inputs = dict(epsilon=float(epsilon), delta=float(delta), q=float(sample_rate), steps=int(steps),
                  score=float(score_multiplier))
    return cached(_key("selection_sigma", count, **inputs), lambda: _calibrate(*inputs.values(), count))


def _calibrate(epsilon: float, delta: float, q: float, steps: int, score: float, count: TrialCount) -> float:
    def total(sigma: float) -> float:
        return rdp_epsilon(count.event(trial_event(sigma, q, steps, score)), delta)

    from dp_accounting import dp_event

    floor = rdp_epsilon(count.event(dp_event.GaussianDpEvent(score)), delta)   # σ → ∞: the score release alone
    if floor >= epsilon:
        raise UserError(f"score_noise too small for ε={epsilon:g}: {count.distribution} selection of the score "
                         f"release alone spends ε={floor:.3g} (raise selection.score_noise or the cell's ε)")
    lo, hi = 0.0, 1.0
    while total(hi) > epsilon:
        lo, hi = hi, hi * 2
        if hi > SIGMA_MAX:
            raise UserError(f"no σ <= {SIGMA_MAX:g} meets ε={epsilon:g} after selection (the score release "
                             f"spends ε={floor:.3g} alone; raise selection.score_noise)")
    if lo == 0.0:
        lo = hi / 2
        while lo > 1e-3 and total(lo) <= epsilon:
            lo, hi = lo / 2, lo
    while hi / lo > 1 + REL_TOL:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if total(mid) <= epsilon else (mid, hi)
    return hi
