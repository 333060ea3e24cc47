"""`dptune resume` trains nothing the results store holds as ended, whatever Ray Tune's snapshot says.

Ray Tune snapshots its experiment state on a timer, so after a driver kill the snapshot can lag the
store: a finished trial comes back as running or errored, or a configuration is handed out again
under a new trial id. Here the lag is made by hand: every trial first errors (so Ray's state says
"errored" for all), then the store is told that two configurations ended — one under the same
trial id, one under another id (as an earlier run would have written it) — and that a third ended
without its curve. A resume that restarts errored trials (Ray gives them new ids) must keep the two
whole rows exactly as they were, train the others, and leave one row per configuration.
"""
import sys

import pytest

import rigged  # tests/platform/rigged.py
from dptune.platform.sweep.launcher import RunSettings
from dptune.platform.sweep.spec_sections import Resources
from dptune.platform.store.results_store import ResultsStore
from dptune.platform.sweep.driver import resume_sweep, run_sweep
from dptune.search_spaces import Catalog, load_spec, plan_sweep
from sweep_plans import levers_off

N, EPOCHS = 200, 2
CLIPS = (0.1, 0.4, 1.6, 6.4)


def test_resume_keeps_what_the_store_holds_as_ended(rigged_ray, tmp_path, monkeypatch):
    catalog = Catalog(datasets=("toy",), backbones=("mlp",), dataset_size=lambda name: N)
    spec = {"axes": {"epsilon": [1], "backbone": "mlp", "dataset": "toy", "epochs": EPOCHS},
            "clip_bound": list(CLIPS), "batch_size": [20], "learning_rate": {"reference": 1.0, "reference_batch_size": 20},
            "pruning": {"min_steps": 5}, "search": levers_off({"algorithm": "grid"})}
    plan = plan_sweep(load_spec(spec, catalog), catalog, workers=1)
    settings = RunSettings(experiment="lag", storage=str(tmp_path), max_failures=0, verbose=0, resources=Resources(max_concurrent=1))
    monkeypatch.setattr(rigged, "FAIL_WITH", "lost before the snapshot")
    run_sweep(plan, settings, trainable=rigged.rigged_trainable)
    store = ResultsStore(settings.paths.store)
    errored = store.table("trials").set_index("clip_bound", drop=False)
    assert len(errored) == len(CLIPS) and (errored.status == "error").all() and errored.config_id.is_unique

    # the store says: C=0.4 finished under its Ray trial id, C=1.6 finished under an earlier run's id
    same, other = errored.loc[0.4], errored.loc[1.6]
    store.write_trial({**same.to_dict(), "trial_id": same.trial_id, "status": "finished", "error": None,
                       "accuracy": 0.987, "test_accuracy": 0.987, "step": same.steps, "epoch": EPOCHS})
    store.write_trial({**other.to_dict(), "trial_id": "earlier-run", "status": "finished", "error": None,
                       "accuracy": 0.654, "test_accuracy": 0.654, "step": other.steps, "epoch": EPOCHS})
    # … and C=0.1 finished, but its row was written without its curve (its checkpoint lost): it trains again
    lost = errored.loc[0.1]
    store.write_trial({**lost.to_dict(), "trial_id": lost.trial_id, "status": "finished", "accuracy": 0.5,
                       "error": "its per-epoch curve was not recorded: the trial's checkpoint could not be read"})
    ended = store.table("trials").set_index("trial_id")

    monkeypatch.setattr(rigged, "FAIL_WITH", None)
    resume_sweep(settings.paths.root, restart_errored=True, out=sys.stderr, trainable=rigged.rigged_trainable)
    rows = store.table("trials").set_index("trial_id")
    assert (rows.status == "finished").all(), rows[["status", "error"]]
    assert other.trial_id not in rows.index          # its error row superseded, not trained again …
    assert set(rows.clip_bound) == set(CLIPS) and len(rows) == len(CLIPS)   # … and not twice
    for kept in (same.trial_id, "earlier-run"):      # the stored rows, untouched
        for column in ("accuracy", "written_at", "epoch"):
            assert rows.loc[kept, column] == ended.loc[kept, column], (kept, column)
    trained = rows[~rows.index.isin([same.trial_id, "earlier-run"])]
    assert len(trained) == 2
    for r in trained.itertuples():                   # the others did train (the rigged accuracy)
        assert r.accuracy == pytest.approx(rigged.accuracy(r.clip_bound, 1.0, EPOCHS)) and r.epoch == EPOCHS
