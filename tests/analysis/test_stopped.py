"""Trials stopped early by a scheduler: counted and shown, never an optimum (issue 12, item 3)."""
import math

import pytest

from dptune.analysis.results import Sweep
from dptune.platform.store.results_store import ResultsStore


def row(trial_id, c, acc, status="finished", epoch=4):
    return {"trial_id": trial_id, "experiment": "x", "status": status, "error": None, "cell": "c",
            "backbone": "mlp", "dataset": "digits", "model": "mlp", "epsilon": 1.0, "delta": 1e-5, "epochs": 4,
            "clip_bound": c, "batch_size": 64, "learning_rate": 1.0, "seed": 0, "private": True,
            "noise_multiplier": 1.0, "sample_rate": 64 / 1437, "steps": math.ceil(4 * 1437 / 64),
            "epsilon_spent": 0.5 if status == "stopped" else 1.0, "accuracy": acc, "epoch": epoch}


def test_a_stopped_trial_is_counted_but_never_the_optimum(tmp_path):
    store = ResultsStore(str(tmp_path / "store"))
    for i, (c, acc) in enumerate([(0.1, 0.6), (1.0, 0.7)]):
        store.write_trial(row(f"f{i}", c, acc))
    store.write_trial(row("s", 10.0, 0.95, status="stopped", epoch=1))   # its partial accuracy must not win
    sweep = Sweep.from_store(store)
    best = sweep.optima().iloc[0]
    assert best["clip_bound"] == 1.0 and best["accuracy"] == pytest.approx(0.7)
    table = sweep.heatmap_table().set_index("clip_bound")
    assert table.loc[10.0, "stopped"] == 1 and math.isnan(table.loc[10.0, "accuracy"])
    assert table.loc[1.0, "stopped"] == 0
    summary = sweep.summary().iloc[0]
    assert (summary["finished"], summary["stopped"], summary["trials"]) == (2, 1, 3)
