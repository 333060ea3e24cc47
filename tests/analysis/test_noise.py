"""σ√T-versus-B curves: the minimum-step floor, the plateau, and the cells of a store."""
import math

import pytest

from dptune.analysis.noise import cell_noise_curves, default_batch_grid, min_step_floor, noise_curve
from dptune.analysis.results import Sweep
from dptune.platform.store import ResultsStore
from dptune.privacy import calibrate_noise

N, EPOCHS, EPS = 1000, 1.0, 4.0
BATCHES = (25, 50, 100, 200)  # T = 40, 20, 10, 5


@pytest.fixture(scope="module")
def curve():
    return noise_curve(EPS, 1e-5, N, EPOCHS, BATCHES, min_steps=20, plateau_tol=0.05)


def test_noise_curve_applies_the_minimum_step_floor_and_the_plateau(curve):
    assert curve["steps"].tolist() == [40, 20, 10, 5]
    for _, r in curve.iterrows():
        sigma = calibrate_noise(EPS, 1e-5, r["batch_size"] / N, int(r["steps"]))
        assert r["noise_sqrt_steps"] == pytest.approx(sigma * math.sqrt(r["steps"]))
    eligible = curve[curve["steps"] >= 20]
    floor = eligible["noise_sqrt_steps"].min()
    expected = (curve["steps"] >= 20) & (curve["noise_sqrt_steps"] <= 1.05 * floor)
    assert curve["kept"].tolist() == expected.tolist() and curve["kept"].any()
    assert all("< 20 steps" in r for r in curve.loc[curve["steps"] < 20, "reason"])


@pytest.mark.parametrize("n, epochs, min_steps", [(1000, 1.0, 20), (1437, 2.0, 20), (950, 1.5, 7), (100, 1.0, 1)])
def test_min_step_floor_is_the_largest_batch_with_enough_steps(n, epochs, min_steps):
    ok = [b for b in range(1, n + 1) if math.ceil(epochs * n / b) >= min_steps]
    assert min_step_floor(n, epochs, min_steps) == max(ok)


def test_default_grid_spans_powers_of_two_up_to_the_dataset():
    assert default_batch_grid(1000, 200) == [64, 128, 256, 512, 1000]
    assert default_batch_grid(10, 1) == [1, 2, 4, 8, 10]


def test_cell_noise_curves_read_n_and_the_tried_batches_from_the_store(tmp_path):
    store = ResultsStore(str(tmp_path))
    rows = [("p1", EPS, 50, True), ("p2", EPS, 25, True), ("np", None, 50, False), ("x", 1.0, 50, True)]
    for trial_id, eps, b, private in rows:
        store.write_trial({"trial_id": trial_id, "status": "finished", "dataset": "toy", "backbone": "mlp",
                           "epsilon": eps, "epochs": EPOCHS, "clip_bound": 1.0, "batch_size": b, "learning_rate": 1.0,
                           "private": private, "accuracy": 0.5,
                           "sample_rate": b / N if trial_id != "x" else None})
    curves, notes = cell_noise_curves(Sweep.from_store(store), batch_sizes=[100])
    assert set(curves["cell_name"]) == {"toy · mlp · ε=4 · 1 epoch"}  # non-private: no curve
    assert curves["batch_size"].tolist() == [25, 50, 100] and (curves["dataset_size"] == N).all()
    assert curves["tried"].tolist() == [True, True, False]
    assert notes == ["toy · mlp · ε=1 · 1 epoch: no noise curve (no trial recorded its sample rate)"]
