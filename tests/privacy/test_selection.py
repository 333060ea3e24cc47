"""Accounting of private selection (dptune.privacy.selection) against dp-accounting used directly,
the repeat-and-select theorems of Papernot & Steinke, "Hyperparameter Tuning with Renyi
Differential Privacy" (ICLR 2022), monotonicity, the calibration's inverse, and the law of K."""
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS, compute_epsilon
from scipy import optimize, stats

from dptune.privacy.calibration import REL_TOL
from dptune.privacy.selection import (TrialCount, calibrate_selection_noise, rdp_epsilon, score_noise_multiplier,
                                      selection_privacy)

DELTA = 1e-5
Q, T, SIGMA = 0.05, 200, 1.2
N_VAL, SCORE_STD = 200, 0.05


def _direct(event) -> float:
    accountant = RdpAccountant()
    accountant.compose(event)
    return accountant.get_epsilon(DELTA)


@pytest.mark.parametrize("distribution,mean,shape,dp_shape", [
    ("truncated_negative_binomial", 10, 1, 1.0), ("truncated_negative_binomial", 10, 0.5, 0.5),
    ("poisson", 10, None, math.inf), ("geometric", 5, None, 1.0)])
def test_totals_equal_dp_accounting_computed_directly(distribution, mean, shape, dp_shape):
    # the trial as the issue defines it, built here with dp-accounting's own events
    trial = dp_event.ComposedDpEvent([
        dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(Q, dp_event.GaussianDpEvent(SIGMA)), T),
        dp_event.GaussianDpEvent(SCORE_STD * N_VAL)])   # score std / sensitivity (1/n_val)
    ours = selection_privacy(SIGMA, Q, T, score_multiplier=score_noise_multiplier(SCORE_STD, N_VAL),
                             count=TrialCount.of(distribution, mean, shape), delta=DELTA)
    assert ours.trial_epsilon == pytest.approx(_direct(trial), rel=1e-12)
    assert ours.total_epsilon == pytest.approx(_direct(dp_event.RepeatAndSelectDpEvent(trial, mean, dp_shape)),
                                               rel=1e-12)
    # a single Gaussian mechanism too
    assert rdp_epsilon(dp_event.GaussianDpEvent(3.0), DELTA) == pytest.approx(
        _direct(dp_event.GaussianDpEvent(3.0)), rel=1e-12)


def _tnb_gamma(mean: float, eta: float) -> float:
    """γ of the truncated negative binomial with this mean, from scipy's negative binomial."""
    def mean_of(g):
        return stats.nbinom(eta, g).mean() / (1 - stats.nbinom(eta, g).pmf(0))
    return optimize.brentq(lambda g: mean_of(g) - mean, 1e-9, 1 - 1e-9, xtol=1e-14)


@pytest.mark.parametrize("eta,mean", [(1.0, 10.0), (0.5, 20.0), (2.0, 5.0)])
def test_theorem_2_of_papernot_and_steinke_for_gaussian_trials(eta, mean):
    """Papernot & Steinke (ICLR 2022), Theorem 2: if each run is (λ, ε(λ))-RDP and K is truncated
    negative binomial (η, γ), selection is (λ, ε')-RDP with
    ε' = ε(λ) + (1+η)(1 − 1/λ̂)ε(λ̂) + (1+η)·log(1/γ)/λ̂ + log E[K]/(λ − 1), for any λ̂.
    Computed here for a Gaussian run (ε(λ) = λ/(2σ²)), minimised over λ̂ on the same orders, and
    converted with dp-accounting's RDP→(ε, δ) conversion; ours must agree."""
    sigma = 4.0
    orders = np.array(DEFAULT_RDP_ORDERS, dtype=float)
    rdp = orders / (2 * sigma**2)
    gamma = _tnb_gamma(mean, eta)
    extra = (1 + eta) * np.min((1 - 1 / orders) * rdp + np.log(1 / gamma) / orders)
    theorem = np.where(orders > 1, rdp + math.log(mean) / (orders - 1) + extra, np.inf)
    theorem = np.array([theorem[orders >= o].min() for o in orders])   # RDP is monotone in the order
    expected = compute_epsilon(orders, theorem, DELTA)[0]
    count = TrialCount.of("truncated_negative_binomial", mean, eta)
    ours = rdp_epsilon(count.event(dp_event.GaussianDpEvent(sigma)), DELTA)
    assert ours == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("eta", [0.0, 1.0, 2.0])
def test_pure_dp_runs_cost_two_plus_eta_times_epsilon(eta):
    """Papernot & Steinke (ICLR 2022), corollary of Theorem 2: with ε-DP runs, truncated negative
    binomial selection is ((2 + η)ε)-DP — 3ε for the geometric law (η = 1), Liu & Talwar (STOC 2019).
    Laplace runs (pure ε = 1) at large Rényi orders reach it up to the (ε, δ) conversion's
    log(1/δ)/(λ − 1) and the log E[K]/(λ − 1) term."""
    eps0 = 1.0
    count = TrialCount.of("truncated_negative_binomial", 10, eta)
    orders = [1e3, 1e4, 1e5]
    accountant = RdpAccountant(orders)
    accountant.compose(count.event(dp_event.LaplaceDpEvent(1 / eps0)))
    total = accountant.get_epsilon(DELTA)
    assert (2 + eta) * eps0 - 0.02 <= total <= (2 + eta) * eps0 + 0.02


def test_total_grows_with_mean_trials_and_with_less_noise():
    score = score_noise_multiplier(SCORE_STD, N_VAL)
    law = TrialCount.of("truncated_negative_binomial", 10, 1)

    def total(sigma, mean):
        return selection_privacy(sigma, Q, T, score_multiplier=score, count=TrialCount.of(
            "truncated_negative_binomial", mean, 1), delta=DELTA).total_epsilon

    by_mean = [total(SIGMA, m) for m in (2, 5, 10, 50)]
    assert all(a < b for a, b in zip(by_mean, by_mean[1:]))
    by_sigma = [total(s, 10) for s in (3.0, 2.0, 1.2, 0.9)]
    assert all(a < b for a, b in zip(by_sigma, by_sigma[1:]))
    one = selection_privacy(SIGMA, Q, T, score_multiplier=score, count=law, delta=DELTA)
    assert one.total_epsilon > one.trial_epsilon


@pytest.mark.parametrize("distribution,shape", [("truncated_negative_binomial", 1), ("poisson", None)])
def test_calibration_meets_the_total_and_is_tight(distribution, shape):
    count = TrialCount.of(distribution, 8, shape)
    score = score_noise_multiplier(SCORE_STD, N_VAL)
    sigma = calibrate_selection_noise(3.0, DELTA, Q, T, score_multiplier=score, count=count)

    def total(s):
        return selection_privacy(s, Q, T, score_multiplier=score, count=count, delta=DELTA).total_epsilon

    assert total(sigma) <= 3.0
    assert total(sigma / (1 + 2 * REL_TOL)) > 3.0
    with pytest.raises(ValueError, match="score_noise too small"):
        calibrate_selection_noise(0.5, DELTA, Q, T, score_multiplier=score_noise_multiplier(0.005, N_VAL),
                                  count=count)


def _pmf(distribution: str, mean: float, shape: float | None):
    """The law of K, from scipy (independent of dptune's sampler)."""
    if distribution == "poisson":
        return stats.poisson(mean).pmf
    if distribution == "geometric":
        return stats.geom(1 / mean).pmf
    if shape == 0:
        g = optimize.brentq(lambda g: stats.logser(1 - g).mean() - mean, 1e-9, 1 - 1e-9, xtol=1e-14)
        return stats.logser(1 - g).pmf
    g = _tnb_gamma(mean, shape)
    law = stats.nbinom(shape, g)
    return lambda k: np.where(np.asarray(k) >= 1, law.pmf(k) / (1 - law.pmf(0)), 0.0)


@pytest.mark.parametrize("distribution,mean,shape", [
    ("truncated_negative_binomial", 10, 1), ("truncated_negative_binomial", 6, 2.5),
    ("truncated_negative_binomial", 6, 0), ("poisson", 7, None), ("geometric", 4, None)])
def test_k_follows_its_law(distribution, mean, shape):
    count = TrialCount.of(distribution, mean, shape)
    rng = np.random.default_rng(12345)
    draws = np.array([count.sample(u) for u in rng.random(20_000)])
    pmf = _pmf(distribution, mean, shape)
    top = int(np.quantile(draws, 0.99))
    lo = 0 if distribution == "poisson" else 1
    ks = np.arange(lo, top + 1)
    expected = pmf(ks) * len(draws)
    observed = np.array([(draws == k).sum() for k in ks])
    observed = np.append(observed, (draws > top).sum())           # the tail as one bin
    expected = np.append(expected, len(draws) - expected.sum())
    assert draws.min() >= lo
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    assert draws.mean() == pytest.approx(mean, rel=0.05)


def test_bad_laws_are_refused():
    with pytest.raises(ValueError, match="distribution must be one of"):
        TrialCount.of("uniform", 5)
    with pytest.raises(ValueError, match="shape only applies"):
        TrialCount.of("poisson", 5, 1)
    with pytest.raises(ValueError, match="mean_trials must be > 1"):
        TrialCount.of("geometric", 1)
