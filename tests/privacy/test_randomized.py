"""Accounting for randomized clipping (issue 4): the envelope, its discretisation and the PRV bounds."""
import math

import numpy as np
import pytest
from scipy import special, stats

from dptune.privacy import calibrate_noise, epsilon_spent
from dptune.privacy.prv import SubsampledGaussianPRV, compose_epsilon
from dptune.privacy.randomized import (SATURATED_MASS, TAIL_FRACTION, EnvelopeAtoms, GaussianMixturePRV,
                                       envelope_atoms, envelope_sf, envelope_tail_end, randomized_clipping)

K = 32


def rounded_down(atoms: EnvelopeAtoms) -> EnvelopeAtoms:
    """The same cells with their mass at the *lower* end and the tail at z_max: a lower bound."""
    z = np.concatenate([[1.0], atoms.z[:-1]])
    w = atoms.weights.copy()
    w[-1] += atoms.tail_mass
    return EnvelopeAtoms(z, w, 0.0)


def mixture_epsilon(atoms: EnvelopeAtoms, sigma: float, q: float, steps: int, delta: float) -> float:
    return max(compose_epsilon(GaussianMixturePRV(q, sigma, atoms, d), steps, delta) for d in ("remove", "add"))


def test_envelope_dominates_z_for_random_spectra():
    """Monte Carlo: Z = (Σ_j λ_j X_j)^{-1/2}, X_j ~ χ²(k)/k, for spectra from rank 1 to flat and
    for the exact-norm parts of other layers (a constant in the sum), never exceeds Z_env."""
    rng = np.random.default_rng(0)
    z_grid = np.linspace(1.0, 1.8, 33)
    n = 100_000
    bound = envelope_sf(z_grid, K)
    spectra = [np.array([1.0]), np.array([0.97, 0.03]), np.full(50, 1 / 50)]
    spectra += [rng.dirichlet(np.full(r, a)) for r, a in ((3, 0.3), (10, 1.0), (40, 0.1), (200, 2.0))]
    for lam in spectra:
        for exact_part in (0.0, 0.3):
            x = rng.chisquare(K, size=(n, len(lam))) / K  # [n, r]
            z = ((1 - exact_part) * x @ lam + exact_part) ** -0.5  # [n]
            p = (z[:, None] > z_grid).mean(axis=0)
            assert np.all(p <= bound + 4 * np.sqrt(bound * (1 - bound) / n) + 1e-12)
    # the single probe direction is the worst case: the envelope is attained by rank 1
    z = (rng.chisquare(K, size=n) / K) ** -0.5
    assert np.abs((z[:, None] > z_grid).mean(axis=0) - bound).max() < 0.01


def test_two_term_spectra_never_beat_one_direction_below_one():
    """P(λX₁ + (1−λ)X₂ ≤ y) ≤ P(X ≤ y) for y < 1 (the envelope's claim), by exact integration."""
    X = stats.chi2(K, scale=1 / K)
    for lam in (0.5, 0.8, 0.95, 0.999):
        for y in (0.3, 0.7, 0.9, 0.99):
            upper = y / (1 - lam)
            p = stats.chi2.expect(lambda x2: X.cdf((y - (1 - lam) * x2) / lam), args=(K,), scale=1 / K,
                                  lb=0, ub=upper)
            assert p <= X.cdf(y) + 1e-12


def test_atoms_dominate_the_envelope():
    atoms = envelope_atoms(3.0, K, tail_mass=1e-12)
    z = np.concatenate([np.linspace(0.5, atoms.z[-1], 4000), atoms.z])
    above = np.array([atoms.weights[atoms.z > v].sum() for v in z]) + atoms.tail_mass  # P(Z_atoms > z)
    assert np.all(above >= envelope_sf(z, K) - 1e-15)
    assert atoms.z[-1] == pytest.approx(envelope_tail_end(K, 1e-12))
    assert atoms.weights.sum() + atoms.tail_mass == pytest.approx(1.0, abs=1e-13)


@pytest.mark.parametrize("direction", ["remove", "add"])
@pytest.mark.parametrize("sigma,q", [(4.0, 0.01), (0.8, 0.1)])
def test_mixture_cdf_is_a_tight_lower_bound(direction, sigma, q):
    """The tabulated CDF lies below the exact mixture of subsampled Gaussians (a larger loss) and
    within 1e-4 of it; its sf lies above (up to the saturated mass charged to δ)."""
    atoms = envelope_atoms(sigma, K, tail_mass=1e-12)
    prv = GaussianMixturePRV(q, sigma, atoms, direction)
    t = np.linspace(-4, 4, 40_001)
    exact = [SubsampledGaussianPRV(q, sigma / z, direction) for z in atoms.z]
    cdf = sum(w * p.cdf(t) for w, p in zip(atoms.weights, exact)) / atoms.weights.sum()
    sf = sum(w * p.sf(t) for w, p in zip(atoms.weights, exact)) / atoms.weights.sum()
    assert np.all(prv.cdf(t) <= cdf + 1e-14)
    assert np.all(prv.sf(t) >= sf - SATURATED_MASS - 1e-14)
    assert np.abs(prv.cdf(t) - cdf).max() < 1e-4
    assert np.all(np.diff(prv.cdf(t)) >= -1e-15)
    tail = sf > 1e-200  # the far tail keeps its relative precision
    assert np.all(prv.sf(t)[tail] <= sf[tail] * 1.01 + SATURATED_MASS)


def _mean_by_parts(cdf: np.ndarray, sf: np.ndarray, grid: np.ndarray) -> float:
    lo, hi = grid <= 0, grid >= 0
    total = (-grid[0] * cdf[0] - np.trapezoid(cdf[lo], grid[lo]) - grid[-1] * sf[-1] + np.trapezoid(sf[hi], grid[hi]))
    return total / (1 - cdf[0] - sf[-1])


@pytest.mark.parametrize("direction", ["remove", "add"])
def test_truncated_mean_is_exact_for_the_bound(direction):
    """The cell-wise mean matches a fine trapezoid rule on the same CDF, and lies just above the
    exact mixture's mean (the bound is a larger loss)."""
    atoms = envelope_atoms(2.0, K, tail_mass=1e-12)
    prv = GaussianMixturePRV(0.05, 2.0, atoms, direction)
    grid = np.linspace(-2.0, 3.0, 100_001)
    mean = prv.truncated_mean(-2.0, 3.0)
    assert mean == pytest.approx(_mean_by_parts(prv.cdf(grid), prv.sf(grid), grid), rel=1e-5)
    exact = [SubsampledGaussianPRV(0.05, 2.0 / z, direction) for z in atoms.z]
    cdf = sum(w * p.cdf(grid) for w, p in zip(atoms.weights, exact)) / atoms.weights.sum()
    sf = sum(w * p.sf(grid) for w, p in zip(atoms.weights, exact)) / atoms.weights.sum()
    exact_mean = _mean_by_parts(cdf, sf, grid)
    assert 0 <= mean - exact_mean < 1e-3 * abs(exact_mean)


def test_tail_is_charged_to_delta():
    prvs = randomized_clipping(1.5, 0.02, K, delta=1e-6, steps=500)
    assert [p.direction for p in prvs] == ["remove", "add"]
    for p in prvs:
        assert p.pm_inf == pytest.approx(TAIL_FRACTION * 1e-6 / 500 + SATURATED_MASS)
    assert len(randomized_clipping(1.5, 1.0, K, delta=1e-6, steps=500)) == 1  # q = 1: one direction


@pytest.mark.parametrize("sigma,q,steps", [(4.0, 0.01, 1000), (1.0, 0.05, 200), (0.7, 0.2, 30)])
def test_rc_epsilon_exceeds_exact_and_its_discretisation_error_is_small(sigma, q, steps):
    delta = 1e-5
    exact = epsilon_spent(sigma, delta, q, steps)
    rc = epsilon_spent(sigma, delta, q, steps, norm_estimator="hutchinson", sketch_k=K)
    assert rc > exact
    assert epsilon_spent(sigma, delta, q, steps, norm_estimator="hutchpp", sketch_k=K) == rc  # same worst case
    # the true envelope ε lies between the rounded-down and the rounded-up (used) atoms
    atoms = envelope_atoms(sigma, K, tail_mass=TAIL_FRACTION * delta / steps)
    lower = mixture_epsilon(rounded_down(atoms), sigma, q, steps, delta)
    assert lower <= rc <= lower * 1.015


def test_more_probes_cost_less_privacy():
    eps = [epsilon_spent(2.0, 1e-5, 0.02, 300, norm_estimator="hutchinson", sketch_k=k) for k in (16, 32, 128)]
    assert eps[0] > eps[1] > eps[2] > epsilon_spent(2.0, 1e-5, 0.02, 300)


def test_sigma_inflation_at_the_paper_anchor():
    """ε = 0.7, δ = 1e-5, k = 32: "Efficient DP-SGD for LLMs with randomized clipping" (ICML 2026)
    reports σ 4.073 → 4.354 (×1.069). Ten epochs at q = 0.0553 (T = 181) give exact σ = 4.073;
    the RC σ must be a few percent larger, and be a calibrated σ (ε ≤ 0.7 at σ, > 0.7 just below)."""
    q, steps = 0.0553, 181
    exact = calibrate_noise(0.7, 1e-5, q, steps)
    assert exact == pytest.approx(4.073, abs=0.002)
    rc = calibrate_noise(0.7, 1e-5, q, steps, norm_estimator="hutchinson", sketch_k=K)
    assert 1.04 < rc / exact < 1.10
    assert epsilon_spent(rc, 1e-5, q, steps, norm_estimator="hutchinson", sketch_k=K) <= 0.7
    assert epsilon_spent(rc * 0.995, 1e-5, q, steps, norm_estimator="hutchinson", sketch_k=K) > 0.7


def test_sketch_k_is_required():
    with pytest.raises(ValueError, match="sketch_k"):
        epsilon_spent(1.0, 1e-5, 0.01, 100, norm_estimator="hutchinson")
    with pytest.raises(ValueError, match="sketch_k"):
        randomized_clipping(1.0, 0.01, None, delta=1e-5, steps=100)


def test_rdp_bounds_the_mixture_at_every_order():
    """The merged-atom RDP (domain size, RDP fallback) is at least the exact mixture RDP."""
    atoms = envelope_atoms(1.2, K, tail_mass=1e-12)
    prv = GaussianMixturePRV(0.03, 1.2, atoms, "remove")
    orders = np.array([2.0, 4.0, 8.0, 32.0])
    w = atoms.weights / atoms.weights.sum()
    per_atom = np.stack([SubsampledGaussianPRV(0.03, 1.2 / z).rdp(orders) for z in atoms.z])
    exact = special.logsumexp((orders - 1) * per_atom, b=w[:, None], axis=0) / (orders - 1)
    assert np.all(prv.rdp(orders) >= exact - 1e-12)
    assert np.all(prv.rdp(orders) <= exact * 1.5)
    assert math.isfinite(float(prv.rdp(orders)[-1]))
