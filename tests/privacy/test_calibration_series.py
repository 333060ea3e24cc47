"""Warm-started calibration (issue 17, item 3): the planner calibrates the batch sizes of a cell
one after the other, each search starting from its neighbours' answer. The σ it returns must meet
ε (never below the exact requirement) and equal a from-scratch calibration within 0.1%."""
from __future__ import annotations

import math

import pytest

from dptune.privacy import calibration, epsilon_spent
from dptune.privacy.calibration import REL_TOL, calibrate_noise_series
from dptune.privacy.schedule import num_steps, sample_rate
from dptune.search_spaces.noise_table import NoiseRequest, calibrate_many, series_of

N, DELTA = 5000, 1e-5
BATCHES = (32, 64, 128, 256, 512, 1024)


def schedules(epochs: float) -> list[tuple[float, int]]:
    return [(sample_rate(b, N), num_steps(epochs, N, b)) for b in BATCHES]


def count_evaluations(monkeypatch) -> list[float]:
    from dptune.privacy import accountant

    calls: list[float] = []
    original = accountant.worst_direction_epsilon

    def counted(sigma, *args, **kwargs):
        calls.append(sigma)
        return original(sigma, *args, **kwargs)

    monkeypatch.setattr(accountant, "worst_direction_epsilon", counted)
    return calls


@pytest.mark.parametrize("epsilon, epochs", [(1.0, 3), (4.0, 2)])
def test_series_meets_epsilon_and_matches_from_scratch(epsilon, epochs, monkeypatch):
    monkeypatch.setenv("DPTUNE_CACHE_DIR", "off")
    calibration_cache_clear()
    calls = count_evaluations(monkeypatch)
    series = calibrate_noise_series(epsilon, DELTA, schedules(epochs))
    warm_evaluations = len(calls)
    calls.clear()
    for sigma, (q, steps) in zip(series, schedules(epochs)):
        scratch = calibration._search(epsilon, DELTA, q, steps, "exact", None)  # today's search, no guess
        assert abs(sigma / scratch - 1) <= REL_TOL, (q, steps, sigma, scratch)
        assert epsilon_spent(sigma, DELTA, q, steps) <= epsilon  # never below the exact requirement
        # and tight: 0.1% less noise spends more than ε
        assert epsilon_spent(sigma / (1 + REL_TOL), DELTA, q, steps) > epsilon
    assert warm_evaluations < len(BATCHES) * 5  # a cold search needs 5-7 per σ


def calibration_cache_clear() -> None:
    from dptune.privacy import cache

    cache.clear_memory()


def test_series_shares_calibrate_noises_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path))
    calibration_cache_clear()
    series = calibrate_noise_series(2.0, DELTA, schedules(2))
    calls = count_evaluations(monkeypatch)
    assert [calibration.calibrate_noise(2.0, DELTA, q, t) for q, t in schedules(2)] == series
    assert calls == []  # served from the cache the series wrote


def test_planner_groups_a_cells_batch_sizes_into_one_series(monkeypatch, tmp_path):
    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path))
    calibration_cache_clear()
    requests = [NoiseRequest(eps, DELTA, q, t) for eps in (1.0, 4.0) for q, t in reversed(schedules(2))]
    groups = series_of(requests)
    assert len(groups) == 2 and all(len(g) == len(BATCHES) for g in groups)
    assert all([r.sample_rate for r in g] == sorted(r.sample_rate for r in g) for g in groups)
    sigmas = calibrate_many(requests, workers=1)
    for r in requests:
        assert epsilon_spent(sigmas[r], r.delta, r.sample_rate, r.steps) <= r.epsilon
        assert math.isclose(sigmas[r], calibration._search(r.epsilon, DELTA, r.sample_rate, r.steps, "exact", None),
                            rel_tol=REL_TOL)
