"""Issue 49, item 3: a trial reports its selected metric's signed ``score`` (higher is better), and the
searcher, Optuna, racing, schedulers and the store rank by it — a metric's direction is read once.
A lower-is-better metric (a language model's NLL) must win by its smallest value; a searcher state
saved before the score (a real one, ``data/searcher_before_score.pkl``: written by the code of
8593d24 from a TPE search of ``test_nll`` with ``mode="min"``, four results in and two trials
running) is read and goes on choosing the smallest NLL."""
import math
from pathlib import Path

import pytest

from dptune.platform.store.records import epoch_rows, trial_row
from dptune.platform.sweep.dp_trial import epoch_report
from dptune.platform.sweep.searcher import SweepSearcher
from dptune.trainables.training import PrivacyPlan
from sweep_plans import plan_of
from test_bracketing import planted
from test_gp_and_starts import OPTIMUM, spec
from test_proxy import drive

OLD_STATE = Path(__file__).parent / "data" / "searcher_before_score.pkl"
PLAN = PrivacyPlan(sample_rate=0.1, steps=10, noise_multiplier=1.0)


def nll(config: dict) -> float:
    """Lower is better: smallest at the planted optimum (the generator of the saved state used it too)."""
    return 2.0 - planted(OPTIMUM)(config)


@pytest.mark.parametrize("metric,value,score", [("test_nll", 2.5, -2.5), ("test_accuracy", 0.75, 0.75),
                                                ("validation_accuracy", 0.5, 0.5)])
def test_a_trial_reports_its_metric_signed_and_the_store_keeps_accuracy_for_accuracies_only(metric, value, score):
    report = epoch_report({metric: value, "epoch": 1}, PLAN, 10, [], metric)
    assert report[metric] == value and report["score"] == score
    row = trial_row("t", {"metric": metric, "epsilon": 1.0}, {"history": [{metric: value, "epoch": 1}]},
                    status="finished")
    assert (row["score"], row[metric]) == (score, value)
    assert row["accuracy"] == (None if metric == "test_nll" else value)
    (epoch,) = epoch_rows([{metric: value, "epoch": 1}], metric)
    assert epoch["score"] == score and epoch["accuracy"] == row["accuracy"]
    private_selection = epoch_report({"epoch": 1}, PLAN, 10, [], "selection_score")   # nothing until the end
    assert math.isnan(private_selection["selection_score"]) and math.isnan(private_selection["score"])


def values(cell, indices) -> dict:
    """A configuration's trial config, as its cell hands it out (C, B and η)."""
    return cell.cell.trial_config(*cell.cell.values(indices), 0)


def test_a_searcher_of_the_score_finds_the_smallest_nll():
    searcher = SweepSearcher(plan_of(spec("grid")), metric="score")
    tried = drive(searcher, lambda c: -nll(c), metric="score")
    indices, best = searcher.best(0)
    assert len(tried) == 27 and best == pytest.approx(-min(map(nll, tried)))
    assert nll(values(searcher.cells[0], indices)) == pytest.approx(min(map(nll, tried)))   # (ties: C = 1 and 4)
    assert -best < sorted(map(nll, tried))[len(tried) // 2]   # not the largest, nor a middle one


def test_a_searcher_saved_before_the_score_is_read_and_still_minimises_the_nll():
    searcher = SweepSearcher(plan_of(spec("tpe", budget=12, startup_trials=3)), metric="score")
    searcher.restore(str(OLD_STATE))
    assert (searcher.metric, searcher.mode) == ("test_nll", "min")   # as Ray Tune restores it
    cell = searcher.cells[0]
    assert "mode" not in vars(cell) and "mode" not in vars(cell.strategy)
    assert len(cell.finished) == 4
    for indices, score in cell.finished.items():   # the old NLLs, signed: the planted function computes them
        assert score == pytest.approx(-nll(values(cell, indices)))
    study = cell.strategy.study
    assert study.direction.name == "MAXIMIZE"
    assert sorted(t.value for t in study.trials if t.value is not None) == pytest.approx(sorted(cell.finished.values()))
    running = [(trial_id, entries[0][2]) for trial_id, entries in searcher._trials.items()]
    assert len(running) == 2
    for trial_id, config in running:   # the two that were running report as trials did then: their NLL
        searcher.on_trial_complete(trial_id, {"test_nll": nll(config)})
    drive(searcher, nll, metric="test_nll")
    assert len(cell.finished) == 12
    smallest = min(cell.finished, key=lambda indices: nll(values(cell, indices)))   # brute force over all 12
    assert searcher.best(0) == (smallest, pytest.approx(-nll(values(cell, smallest))))
