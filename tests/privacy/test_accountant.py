"""epsilon_spent against published values, independent implementations and closed forms."""
import math

import numpy as np
import pytest
from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant
from scipy import optimize, stats

from dptune.privacy import epsilon_spent
from dptune.privacy.prv import SubsampledGaussianPRV


def test_published_value():
    # Gopi, Lee, Wutschitz (2021): σ = 1.5, q = 0.04, 2,250 steps, δ = 1e-5 → ε ≈ 6.78 (PRV).
    assert epsilon_spent(1.5, 1e-5, 0.04, 2250) == pytest.approx(6.78, abs=0.01)


@pytest.mark.parametrize("sigma,q,steps", [(1.0, 0.02, 489), (0.8, 0.1, 100), (3.0, 0.005, 2000)])
def test_matches_prv_accountant(sigma, q, steps):
    reference = PRVAccountant(prvs=[PoissonSubsampledGaussianMechanism(q, sigma)], eps_error=0.01,
                              delta_error=1e-8, max_self_compositions=[steps])
    upper = reference.compute_epsilon(1e-5, [steps])[2]
    ours = epsilon_spent(sigma, 1e-5, q, steps)
    # Both are upper bounds with a 0.01 discretisation allowance; remove dominates add here.
    assert ours == pytest.approx(upper, abs=0.01)


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact ε of μ-GDP (the T-fold Gaussian mechanism without subsampling has μ = √T/σ)."""
    gap = lambda e: stats.norm.cdf(-e / mu + mu / 2) - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2) - delta
    return optimize.brentq(gap, 0.0, 500.0)


@pytest.mark.parametrize("sigma,steps", [(1.0, 10), (5.0, 200), (20.0, 1000)])
def test_full_batch_is_the_exact_gaussian_bound(sigma, steps):
    exact = _gaussian_epsilon(math.sqrt(steps) / sigma, 1e-5)
    ours = epsilon_spent(sigma, 1e-5, 1.0, steps)
    assert exact <= ours <= exact + 0.021  # an upper bound, within the accountant's 2·eps_error


@pytest.mark.parametrize("direction", ["remove", "add"])
@pytest.mark.parametrize("q,sigma", [(0.05, 1.0), (0.3, 0.7)])
def test_privacy_loss_distribution_matches_monte_carlo(direction, q, sigma):
    """The closed-form CDF of the privacy loss equals the empirical CDF of sampled losses."""
    rng = np.random.default_rng(0)
    n = 400_000
    if direction == "remove":  # x from the mixture, loss = log(mixture / N(0))
        x = rng.normal(size=n) * sigma + (rng.random(n) < q)
        loss = np.log(1 - q + q * np.exp((2 * x - 1) / (2 * sigma**2)))
    else:  # x from N(0), loss = log(N(0) / mixture)
        x = rng.normal(size=n) * sigma
        loss = -np.log(1 - q + q * np.exp((2 * x - 1) / (2 * sigma**2)))
    prv = SubsampledGaussianPRV(q, sigma, direction)
    ts = np.quantile(loss, np.linspace(0.01, 0.99, 50))
    empirical = (loss[None, :] <= ts[:, None]).mean(axis=1)
    assert np.abs(prv.cdf(ts) - empirical).max() < 0.004  # DKW: P(sup > 0.004) < 1e-5 at n = 4e5
    assert np.allclose(prv.cdf(ts) + prv.sf(ts), 1.0, atol=1e-12)


def test_more_noise_spends_less():
    eps = [epsilon_spent(s, 1e-5, 0.02, 500) for s in (0.7, 0.9, 1.2, 2.0, 4.0)]
    assert all(a > b for a, b in zip(eps, eps[1:]))


def test_no_noise_is_no_privacy():
    assert epsilon_spent(0.0, 1e-5, 0.1, 10) == math.inf


def test_tighter_than_rdp():
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    rdp = compute_rdp(q=0.02, noise_multiplier=1.0, steps=489, orders=orders)
    eps_rdp, _ = get_privacy_spent(orders=orders, rdp=rdp, delta=1e-5)
    assert epsilon_spent(1.0, 1e-5, 0.02, 489) < eps_rdp


@pytest.mark.parametrize("kwargs,field", [
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(delta=0.0), "delta"), (dict(delta=1.0), "delta"),
    (dict(sample_rate=0.0), "sample_rate"), (dict(sample_rate=1.5), "sample_rate"),
    (dict(steps=0), "steps"), (dict(steps=2.5), "steps"),
    (dict(norm_estimator="magic"), "norm_estimator"),
    (dict(norm_estimator="hutchinson"), "sketch_k"),
])
def test_bad_input_names_the_argument(kwargs, field):
    args = dict(noise_multiplier=1.0, delta=1e-5, sample_rate=0.1, steps=10) | kwargs
    with pytest.raises(ValueError, match=field):
        epsilon_spent(**args)


def test_a_registered_mechanism_is_a_valid_norm_estimator_and_others_are_listed(monkeypatch):
    """The names the accountant accepts are its registry of mechanisms, not a list kept beside it."""
    from dptune.privacy import mechanisms

    with pytest.raises(ValueError) as info:
        epsilon_spent(1.0, 1e-5, 0.1, 10, norm_estimator="magic")
    assert str(info.value) == f"norm_estimator must be one of {', '.join(mechanisms.MECHANISMS)}; got 'magic'"
    assert {"exact", "hutchinson", "hutchpp"} <= set(mechanisms.MECHANISMS)
    monkeypatch.setitem(mechanisms.MECHANISMS._entries, "magic", mechanisms.MECHANISMS.get("exact"))
    assert epsilon_spent(1.0, 1e-5, 0.1, 10, norm_estimator="magic", sketch_k=4) == epsilon_spent(1.0, 1e-5, 0.1, 10)


@pytest.mark.parametrize("sigma", [1.0, 5.0])
def test_epsilon_curve_bounds_the_exact_gaussian_at_every_count(sigma):
    """Every point of a curve computed on the mesh of its largest count is still an upper bound on
    the exact ε at its own count, within the accountant's allowance (q = 1: the T-fold Gaussian)."""
    from dptune.privacy.accountant import epsilon_curve

    counts = [1, 7, 25, 60, 200]
    curve = epsilon_curve(sigma, 1e-5, 1.0, counts)
    for t, ours in zip(counts, curve):
        exact = _gaussian_epsilon(math.sqrt(t) / sigma, 1e-5)
        assert exact <= ours <= exact + 0.021, t


@pytest.mark.parametrize("sigma,q,counts", [(1.0, 0.02, [49, 98, 245, 489]), (6.7, 0.356, [3, 6, 9, 12, 23])])
def test_epsilon_curve_matches_prv_accountant_at_every_count(sigma, q, counts):
    """Each point against prv-accountant composed for that count alone; the last point is
    epsilon_spent's own value (same mesh), so a run's final ε is what the planner calibrated."""
    from dptune.privacy.accountant import epsilon_curve

    curve = epsilon_curve(sigma, 1e-5, q, counts)
    for t, ours in zip(counts, curve):
        reference = PRVAccountant(prvs=[PoissonSubsampledGaussianMechanism(q, sigma)], eps_error=0.01,
                                  delta_error=1e-8, max_self_compositions=[t])
        assert ours == pytest.approx(reference.compute_epsilon(1e-5, [t])[2], abs=0.01), t
    assert curve[-1] == epsilon_spent(sigma, 1e-5, q, counts[-1])
    assert curve == sorted(curve)
