"""σ√T-versus-B curves: the minimum-step floor, the plateau, and the cells of a store."""
import json
import math

import pytest

from dptune.analysis.cumulative_noise import cell_noise_curves, default_batch_grid, min_step_floor, noise_curve
from dptune.analysis.results import Sweep
from dptune.platform.store.results_store import ResultsStore
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


def test_the_report_draws_the_rules_and_batch_sizes_of_the_plan_the_sweep_saved(tmp_path):
    from dptune.analysis.report import analyse
    from dptune.platform.store.layout import ExperimentPaths

    paths = ExperimentPaths(str(tmp_path / "exp"))
    store = ResultsStore(paths.store)
    for trial_id, b in (("a", 50), ("b", 100)):
        store.write_trial({"trial_id": trial_id, "status": "finished", "dataset": "toy", "backbone": "mlp",
                           "epsilon": EPS, "epochs": EPOCHS, "clip_bound": 1.0, "batch_size": b, "learning_rate": 1.0,
                           "private": True, "accuracy": 0.5, "sample_rate": b / N, "cell": "toy/mlp/eps=4"})
    # no saved plan: the rules' defaults and a grid of powers of two
    plain = analyse(store, gradnorms=False)
    assert (plain.min_steps, plain.plateau_tol) == (20, 0.05) and "defaults" in plain.rules
    # the plan as the sweep saves it (platform.sweep.driver.plan_record): a 60% plateau, a 4-step floor
    plan = {"pruning": {"min_steps": 4, "plateau_tol": 0.6, "max_batch_sizes": None},
            "cells": {"toy/mlp/eps=4": {"dataset_size": N, "batch_sizes": [20, 50, 100, 200, 300],
                                        "kept": [], "searched": [50, 100]}}}
    (tmp_path / "exp" / "dptune_plan.json").write_text(json.dumps(plan))
    a = analyse(store, gradnorms=False)
    assert (a.min_steps, a.plateau_tol) == (4, 0.6) and "saved plan" in a.rules
    curve = a.noise_curves
    assert curve["batch_size"].tolist() == [20, 50, 100, 200, 300] and curve["planned"].all()
    sqrt_t = {b: calibrate_noise(EPS, 1e-5, b / N, math.ceil(EPOCHS * N / b)) * math.sqrt(math.ceil(EPOCHS * N / b))
              for b in curve["batch_size"]}
    floor = min(v for b, v in sqrt_t.items() if math.ceil(EPOCHS * N / b) >= 4)
    expected = [math.ceil(EPOCHS * N / b) >= 4 and sqrt_t[b] <= 1.6 * floor for b in curve["batch_size"]]
    assert curve["kept"].tolist() == expected and sum(expected) >= 2
    default = noise_curve(EPS, 1e-5, N, EPOCHS, curve["batch_size"], min_steps=20, plateau_tol=0.05)
    assert default["kept"].tolist() != expected   # the defaults would draw another plateau
    given = analyse(store, gradnorms=False, plateau_tol=0.05)   # rules given to the report win
    assert (given.min_steps, given.plateau_tol) == (4, 0.05) and "given" in given.rules
