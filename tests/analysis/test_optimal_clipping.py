"""optimal_clip against brute force, its response to the norm distribution, and retention weights.

"The paper": "On optimal hyperparameters for DP deep transfer learning" (ICLR 2026), Theorem 5.2.
"""
import numpy as np
import pytest
import torch

from dptune.analysis import class_retention, clip_mse, optimal_clip
from dptune.analysis.optimal_clipping import HIST_EDGES, histogram_quantiles, histogram_retention


def brute_mse(grads: np.ndarray, sigma: float, c: np.ndarray) -> np.ndarray:
    """The paper's MSE(C) straight from the definition at each C: clip every example, compare the sums."""
    c = np.atleast_1d(c)
    norms = np.linalg.norm(grads, axis=1)
    scale = np.minimum(1.0, c[:, None] / np.where(norms > 0, norms, np.inf))  # [grid, n]
    clipped_sums = scale @ grads                                               # [grid, d]
    return np.sum((clipped_sums - grads.sum(0)) ** 2, axis=1) + sigma**2 * c**2 * grads.shape[1]


def random_grads(rng: np.random.Generator, n: int = 40, d: int = 12, shift: float = 0.0) -> np.ndarray:
    """Per-sample gradients sharing a signal direction, with log-normal norms (median e^shift)."""
    direction = rng.normal(size=d)
    raw = direction + 1.5 * rng.normal(size=(n, d))
    norms = np.exp(shift + rng.normal(scale=0.8, size=n))
    return raw / np.linalg.norm(raw, axis=1, keepdims=True) * norms[:, None]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("sigma", [0.0, 0.3, 1.0, 4.0])
def test_optimal_clip_is_the_brute_force_minimiser(seed, sigma):
    rng = np.random.default_rng(seed)
    grads = random_grads(rng)
    norms = np.linalg.norm(grads, axis=1)
    grid = np.linspace(0.0, 1.05 * norms.max(), 20001)
    brute = brute_mse(grads, sigma, grid)
    c_star = optimal_clip(grads, sigma)
    spacing = grid[1] - grid[0]
    assert abs(c_star - grid[brute.argmin()]) <= spacing
    assert brute_mse(grads, sigma, c_star)[0] <= brute.min() * (1 + 1e-9) + 1e-12
    # the exact curve agrees with the definition everywhere, not only at the optimum
    curve = clip_mse(grads, sigma)
    assert np.allclose(curve(grid[::500]), brute[::500], rtol=1e-9, atol=1e-9)


def test_optimal_clip_accepts_tensors_and_zero_gradients():
    rng = np.random.default_rng(7)
    grads = random_grads(rng, n=10)
    with_zero = np.vstack([grads, np.zeros((3, grads.shape[1]))])
    expected = optimal_clip(grads, 0.5)
    assert optimal_clip(torch.from_numpy(with_zero).float(), 0.5) == pytest.approx(expected, rel=1e-5)
    assert optimal_clip(np.zeros((4, 3)), 1.0) == 0.0
    with pytest.raises(ValueError, match=r"\[n, d\]"):
        optimal_clip(np.ones(5), 1.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        optimal_clip(grads, -1.0)


def test_optimal_clip_with_one_example_and_no_noise_keeps_it_whole():
    assert optimal_clip(np.array([[3.0, 4.0]]), 0.0) == pytest.approx(5.0)


@pytest.mark.parametrize("sigma", [0.5, 2.0])
def test_c_star_grows_when_the_norm_distribution_shifts_right(sigma):
    rng = np.random.default_rng(3)
    base = random_grads(rng, n=200, d=20)
    c_stars = [optimal_clip(base * scale, sigma) for scale in (0.5, 1.0, 2.0, 4.0)]
    assert all(b > a for a, b in zip(c_stars, c_stars[1:]))
    # more noise (same gradients) pulls C* down: the paper's direct effect of σ
    assert optimal_clip(base, 4 * sigma) < optimal_clip(base, sigma)


def test_class_retention_matches_the_formula_on_hand_made_norms():
    norms = [0.5, 1.0, 2.0, 4.0, 8.0, 0.0, 3.0]
    labels = [0, 0, 0, 1, 1, 2, 2]
    w = class_retention(norms, labels, 2.0)
    assert w == pytest.approx({0: (1 + 1 + 1) / 3, 1: (0.5 + 0.25) / 2, 2: (1 + 2 / 3) / 2})
    w = class_retention(np.array(norms), np.array(labels), 0.5)
    assert w == pytest.approx({0: (1 + 0.5 + 0.25) / 3, 1: (0.125 + 0.0625) / 2, 2: (1 + 0.5 / 3) / 2})
    assert set(class_retention(torch.tensor(norms), torch.tensor(labels), 1.0)) == {0, 1, 2}
    with pytest.raises(ValueError, match="same length"):
        class_retention([1.0, 2.0], [0], 1.0)


def test_histogram_retention_and_quantiles_match_samples_drawn_log_uniformly_in_bins():
    rng = np.random.default_rng(0)
    counts = np.zeros(len(HIST_EDGES) - 1)
    counts[[14, 16, 17, 20]] = [100, 300, 250, 50]
    log_edges = np.log(HIST_EDGES)
    samples = np.concatenate([np.exp(rng.uniform(log_edges[b], log_edges[b + 1], size=int(c) * 200))
                              for b, c in enumerate(counts) if c])
    for c in (0.05, 0.3, 1.0, 4.0, 50.0):
        direct = np.mean(np.minimum(1.0, c / samples))
        assert histogram_retention(counts, c) == pytest.approx(direct, abs=3e-3)
    assert np.allclose(histogram_retention(counts, [0.3, 1.0]), [histogram_retention(counts, 0.3),
                                                                 histogram_retention(counts, 1.0)])
    q = histogram_quantiles(counts, [0.1, 0.5, 0.9])
    assert np.allclose(np.log(q), np.log(np.quantile(samples, [0.1, 0.5, 0.9])), atol=0.02)


def test_hist_edges_match_the_trainer():
    from dptune.trainables.engine.norm_stats import HIST_EDGES as TRAINER_EDGES

    assert np.array_equal(HIST_EDGES, TRAINER_EDGES)


def test_chunked_accumulation_gives_the_same_curve(monkeypatch):
    from dptune.analysis import optimal_clipping as clipping

    grads = random_grads(np.random.default_rng(11), n=30, d=8)
    whole = clip_mse(grads, 0.7)
    monkeypatch.setattr(clipping, "_CHUNK_ELEMENTS", 3 * 8)  # three rows at a time
    chunked = clip_mse(grads, 0.7)
    assert np.allclose(chunked.nn, whole.nn) and np.allclose(chunked.ng, whole.ng)
    assert chunked.argmin() == pytest.approx(whole.argmin())
