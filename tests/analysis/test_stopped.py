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


def test_a_stopped_configuration_is_reported_apart_and_the_fixed_setting_keeps_it(tmp_path):
    """Issue 48, item 3: a configuration multi-fidelity stopped lost at a rung — it is no test at level
    α, so the closing lines name it apart from the indistinguishable set, at its rung; and a (C, B)
    stopped in one cell stays in the fixed-setting comparison, marked there, instead of dropping out."""
    import io

    from dptune.analysis.report import write_heatmaps

    store = ResultsStore(str(tmp_path / "store"))
    for eps, cell in ((1.0, "c1"), (8.0, "c8")):
        for seed in (0, 1):
            for i, (c, acc) in enumerate([(0.1, 0.6), (1.0, 0.7)]):
                store.write_trial({**row(f"{cell}-f{i}-{seed}", c, acc + 0.01 * seed), "epsilon": eps, "cell": cell,
                                   "seed": seed})
    # C = 10 finished in ε = 8 (the best there) but was stopped at its first rung (step 23) in ε = 1
    for seed in (0, 1):
        store.write_trial({**row(f"c8-s-{seed}", 10.0, 0.9 + 0.01 * seed), "epsilon": 8.0, "cell": "c8", "seed": seed})
    store.write_trial({**row("c1-s", 10.0, 0.2, status="stopped", epoch=1), "step": 23, "cell": "c1"})
    sweep = Sweep.from_store(store)
    stops = sweep.stopped_settings()
    assert len(stops) == 1 and (stops.iloc[0]["clip_bound"], stops.iloc[0]["rung"]) == (10.0, 1)
    assert sweep.fixed_setting_pool() == (3, 3)   # C = 0.1, 1 and 10 (stopped in ε = 1): all compared
    setting, cost = sweep.fixed_setting_cost()
    assert setting == (1.0, 64)   # C = 10 lost a cell to a stop: the best without one is chosen
    setting, cost = sweep.fixed_setting_cost(10.0, 64)
    marks = cost.set_index("cell_name")["fixed_stopped"].dropna()
    assert len(marks) == 1 and marks.iloc[0] == "stopped at rung 1"
    printed = io.StringIO()
    write_heatmaps(store, tmp_path / "out", out=printed)
    assert "1 other(s) stopped by multi-fidelity at rung 1 (they lost there" in printed.getvalue()
