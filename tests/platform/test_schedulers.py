"""Early stopping within a cell on real Ray Tune (issue 12, item 3), and the flat trial config.

A rigged trainable (tests/platform/rigged.py) reports a known accuracy per epoch, so the trials
ASHA must stop are known in advance: with one trial at a time in grid order (each cell's C grid
largest first, the searcher's clip-equivalence order), a trial reaching the
first rung (epoch 1) is stopped when its accuracy is below the (1 − 1/rf) quantile of the cell's
trials recorded there before it (asynchronous successive halving, Li et al. 2020).
"""
import math
import sys

import numpy as np
import pytest

from dptune.platform.sweep.launcher import RunSettings
from dptune.platform.sweep.spec_sections import Resources
from dptune.platform.store.results_store import ResultsStore
from dptune.platform.sweep.driver import resume_sweep, run_sweep
from dptune.privacy import epsilon_spent
from dptune.privacy.schedule import num_steps, sample_rate
from dptune.search_spaces import SpecError, load_spec, plan_sweep
from dptune.search_spaces.search_sections import Scheduler

import rigged  # tests/platform/rigged.py (pytest puts this folder on sys.path)
from sweep_plans import levers_off
from dptune.search_spaces import Catalog

N = 200
EPOCHS = 3
RF = 3


@pytest.fixture
def catalog() -> Catalog:
    return Catalog(datasets=("toy",), backbones=("mlp",), dataset_size=lambda name: N)


def spec_of(scheduler) -> dict:
    return {"axes": {"epsilon": [1, 4], "backbone": "mlp", "dataset": "toy", "epochs": EPOCHS},
            "clip_bound": sorted(rigged.ACCURACY), "batch_size": [20],
            "learning_rate": {"reference": 1.0, "reference_batch_size": 20},
            "pruning": {"min_steps": 5}, "search": levers_off({"scheduler": scheduler})}


def expected_stopped(rf: float = RF) -> set[tuple[float, float]]:
    """(ε, C) of the trials ASHA stops at its first rung, by the rule itself, cell by cell."""
    stopped = set()
    for eps in (1.0, 4.0):
        recorded = []
        for c in sorted(rigged.ACCURACY, reverse=True):     # the order the searcher hands them out
            acc = rigged.accuracy(c, eps, 1)
            if recorded and acc < np.nanpercentile(recorded, (1 - 1 / rf) * 100):
                stopped.add((eps, c))
            recorded.append(acc)
    return stopped


def test_the_rule_stops_a_known_set():
    # guards the test's own expectation: cells share the pattern, so pooling cells would differ
    assert expected_stopped() == {(e, c) for e in (1.0, 4.0) for c in (0.1, 0.2, 0.8, 6.4)}


def test_scheduler_section_is_validated(catalog):
    s = load_spec(spec_of({"name": "asha", "grace_epochs": 1, "reduction_factor": 3}), catalog)
    assert s["search"].scheduler == Scheduler("asha", 1, 3.0, within="batch_size")
    assert load_spec(spec_of({"name": "asha", "within": "cell"}), catalog)["search"].scheduler.within == "cell"
    assert load_spec(spec_of(None), catalog)["search"].scheduler.name == "none"
    for bad, message in [({"name": "hyperband"}, "search.scheduler.name: must be one of none, asha, median"),
                         ({"name": "median", "reduction_factor": 2}, "search.scheduler.reduction_factor: does not "
                                                                      "apply to scheduler median"),
                         ({"name": "asha", "grace_epochs": 3}, "search.scheduler.grace_epochs: must be < the "
                                                               "smallest axes.epochs (3)"),
                         ({"name": "asha", "reduction_factor": 1}, "reduction_factor: must be a finite number > 1"),
                         ({"name": "asha", "grace": 1}, "search.scheduler.grace: unknown key"),
                         ({"name": "asha", "within": "epoch"}, "search.scheduler.within: must be one of batch_size, "
                                                               "cell")]:
        with pytest.raises(SpecError, match=__import__("re").escape(message)):
            load_spec(spec_of(bad), catalog)


def test_a_trial_config_is_flat_and_its_training_options_are_the_trainers(catalog):
    from dptune.platform.sweep.trial_config import plan_figures, train_config, train_options
    from dptune.search_spaces.planner import PLAN_FIELDS
    from dptune.trainables.config import FIELDS

    assert not set(PLAN_FIELDS) & set(FIELDS)   # a plan figure never shadows a training option
    plan = plan_sweep(load_spec(spec_of("none"), catalog), catalog, workers=1)
    trial = plan.cells[0].trials()[0]
    assert {"clip_bound", "batch_size", "learning_rate", "epsilon", "delta", "epochs", "model", "dataset",
            "cell", "steps", "sample_rate", "noise_multiplier"} <= set(trial)
    assert not any(isinstance(v, dict) for k, v in trial.items() if k != "model_options")
    assert train_config(trial).to_dict().items() >= train_options(trial).items()
    assert {**train_options(trial), **plan_figures(trial)} == trial


def run(tmp_path, catalog, scheduler, name="asha"):
    plan = plan_sweep(load_spec(spec_of(scheduler), catalog), catalog, workers=1)
    settings = RunSettings(experiment=name, storage=str(tmp_path), max_failures=0, verbose=0, resources=Resources(max_concurrent=1))
    run_sweep(plan, settings, trainable=rigged.rigged_trainable)
    return plan, settings, ResultsStore(settings.paths.store).table("trials")


def test_asha_stops_exactly_the_trials_it_should_within_each_cell(rigged_ray, tmp_path, catalog):
    plan, settings, rows = run(tmp_path, catalog, {"name": "asha", "grace_epochs": 1, "reduction_factor": RF})
    assert len(rows) == 2 * len(rigged.ACCURACY) and rows.trial_id.is_unique
    stopped = rows[rows.status == "stopped"]
    assert {(r.epsilon, round(r.clip_bound, 6)) for r in stopped.itertuples()} == expected_stopped()
    assert set(rows.status) == {"stopped", "finished"}
    q = sample_rate(20, N)
    steps = num_steps(EPOCHS, N, 20)
    for r in stopped.itertuples():           # stopped at the first rung: one epoch, less than the cell's ε
        assert r.epoch == 1
        sigma = plan.cells[0 if r.epsilon == 1 else 1].row(20)["noise_multiplier"]
        assert r.noise_multiplier == pytest.approx(sigma)
        spent = epsilon_spent(sigma, 1e-5, q, math.ceil(steps / EPOCHS))
        assert r.epsilon_spent == pytest.approx(spent, rel=1e-9) and r.epsilon_spent < r.epsilon
    for r in rows[rows.status == "finished"].itertuples():
        assert r.epoch == EPOCHS and r.epsilon_spent <= r.epsilon
    # the Ray Tune config is flat: the settings are top-level keys of every trial's config
    configs = [t for t in ResultsStore(settings.paths.store).table("trials").config_json]
    assert all('"clip_bound"' in c for c in configs)
    # resuming the finished experiment trains nothing again and keeps the stopped trials stopped
    resume_sweep(settings.paths.root, out=sys.stderr, trainable=rigged.rigged_trainable)
    again = ResultsStore(settings.paths.store).table("trials").set_index("trial_id")
    before = rows.set_index("trial_id")
    assert (again.loc[before.index, "status"] == before.status).all()
    assert (again.loc[before.index, "written_at"] == before.written_at).all()


def test_asha_with_rungs_in_steps_judges_a_trial_at_the_first_epoch_end_past_its_rung(rigged_ray, tmp_path, catalog):
    # B = 20 of N = 200: T = 30, 10 steps an epoch; grace_steps 15 puts the only rung (15; 45 > T) at
    # step 15, which a trial reaches at its second epoch end (step 20): the same trials as with
    # grace_epochs 1 are stopped (the rigged curves keep their order), but after 2 epochs, not 1
    plan, settings, rows = run(tmp_path, catalog, {"name": "asha", "grace_steps": 15, "reduction_factor": RF},
                               name="asha-steps")
    stopped = rows[rows.status == "stopped"]
    assert {(r.epsilon, round(r.clip_bound, 6)) for r in stopped.itertuples()} == expected_stopped()
    q, steps = sample_rate(20, N), num_steps(EPOCHS, N, 20)
    for r in stopped.itertuples():
        sigma = plan.cells[0 if r.epsilon == 1 else 1].row(20)["noise_multiplier"]
        assert (r.epoch, r.step) == (2, 20)
        assert r.epsilon_spent == pytest.approx(epsilon_spent(sigma, 1e-5, q, 20), rel=1e-9)
        assert r.epsilon_spent < r.epsilon
    assert (rows[rows.status == "finished"].step == steps).all()


def test_rungs_in_steps_or_epochs_not_both(catalog):
    assert load_spec(spec_of({"name": "asha", "grace_steps": 20}), catalog)["search"].scheduler.grace_steps == 20
    for bad, message in [({"name": "asha", "grace_steps": 20, "grace_epochs": 1}, "give grace_epochs or grace_steps"),
                         ({"name": "asha", "grace_steps": 0}, "search.scheduler.grace_steps: must be"),
                         ({"name": "none", "grace_steps": 5}, "grace_steps: does not apply to scheduler none")]:
        with pytest.raises(SpecError, match=__import__("re").escape(message)):
            load_spec(spec_of(bad), catalog)


def test_asha_compares_trials_of_the_same_batch_size_only(rigged_ray, tmp_path, catalog):
    # two B with the same accuracy curves: compared within each B, each B's group stops exactly the
    # single-B set; compared across the cell, the second B's trials would meet the first B's rungs
    spec = {**spec_of({"name": "asha", "grace_epochs": 1, "reduction_factor": RF}),
            "axes": {"epsilon": [1], "backbone": "mlp", "dataset": "toy", "epochs": EPOCHS},
            "batch_size": [20, 40], "pruning": {"min_steps": 5, "plateau_tol": 10.0}}
    plan = plan_sweep(load_spec(spec, catalog), catalog, workers=1)
    assert plan.cells[0].searched_batch_sizes == (20, 40)
    settings = RunSettings(experiment="by-b", storage=str(tmp_path), max_failures=0, verbose=0, resources=Resources(max_concurrent=1))
    run_sweep(plan, settings, trainable=rigged.rigged_trainable)
    rows = ResultsStore(settings.paths.store).table("trials")
    assert len(rows) == 2 * len(rigged.ACCURACY)
    stopped = {(round(r.clip_bound, 6), r.batch_size) for r in rows[rows.status == "stopped"].itertuples()}
    assert stopped == {(c, b) for b in (20, 40) for e, c in expected_stopped() if e == 1.0}


def test_with_several_seeds_a_configuration_is_stopped_or_kept_on_all_its_seeds(rigged_ray, tmp_path, catalog):
    """Issue 33, item 2: with seeds 0–2 ASHA decides each configuration on its lead seed (seed 0) against
    the other configurations' lead runs, so it stops exactly the set one seed would; a stopped
    configuration ran its lead alone (one row, stopped at the rung), a kept one trains every seed to the
    end (the other seeds start once the lead passed every rung, and the scheduler leaves them alone)."""
    spec = {**spec_of({"name": "asha", "grace_epochs": 1, "reduction_factor": RF}), "seeds": [0, 1, 2]}
    plan = plan_sweep(load_spec(spec, catalog), catalog, workers=1)
    assert all(cell.lead_seed_first(20) for cell in plan.cells)
    settings = RunSettings(experiment="seeds", storage=str(tmp_path), max_failures=0, verbose=0,
                           resources=Resources(max_concurrent=2))
    run_sweep(plan, settings, trainable=rigged.rigged_trainable)
    rows = ResultsStore(settings.paths.store).table("trials")
    rows = rows.assign(C=rows.clip_bound.round(6))
    stopped = rows[rows.status == "stopped"]
    assert {(r.epsilon, r.C) for r in stopped.itertuples()} == expected_stopped()
    assert (stopped.seed == 0).all() and (stopped.epoch == 1).all()
    for (eps, c), group in rows.groupby(["epsilon", "C"]):
        if (eps, c) in expected_stopped():
            assert len(group) == 1                                    # the other seeds never ran
        else:
            assert sorted(group.seed) == [0, 1, 2] and (group.status == "finished").all()
            assert (group.epoch == EPOCHS).all()
            followers = group[group.seed != 0]
            assert all('"follower": true' in c for c in followers.config_json)
            assert not any('"follower"' in c for c in group[group.seed == 0].config_json)
    assert set(rows.status) == {"stopped", "finished"}
    # `dptune status` does not wait for the seeds of stopped configurations: the plan was an upper bound
    from dptune.platform.views.status import read_status

    status = read_status(settings.paths.root)
    assert status.done and status.pending == 0 and status.unrun == 0 and len(rows) < 3 * plan.num_trials // 3


def test_without_a_scheduler_every_trial_finishes(rigged_ray, tmp_path, catalog):
    _, _, rows = run(tmp_path, catalog, "none", name="plain")
    assert len(rows) == 2 * len(rigged.ACCURACY) and (rows.status == "finished").all()
    assert (rows.epoch == EPOCHS).all()


DRIVER = """
import os, sys
sys.path[:0] = [{here!r}, os.path.dirname({here!r})]
import rigged, test_schedulers as t
from ray import cloudpickle
cloudpickle.register_pickle_by_value(rigged)
from dptune.platform.sweep.launcher import RunSettings
from dptune.platform.sweep.spec_sections import Resources
from dptune.platform.sweep.driver import run_sweep
from dptune.search_spaces import Catalog, load_spec, plan_sweep
catalog = Catalog(datasets=("toy",), backbones=("mlp",), dataset_size=lambda name: t.N)
plan = plan_sweep(load_spec(t.spec_of({{"name": "asha", "grace_epochs": 1, "reduction_factor": t.RF}}), catalog),
                  catalog, workers=1)
run_sweep(plan, RunSettings(experiment="killed", storage={storage!r}, max_failures=1, verbose=0, resources=Resources(max_concurrent=1)),
          trainable=rigged.rigged_trainable)
"""


def test_resume_after_a_driver_kill_keeps_the_scheduler_state(rigged_ray, tmp_path, catalog):
    """Kill the sweep's driver mid-sweep, resume: the stopped set is exactly the uninterrupted one
    (the rungs recorded before the kill still count), every row is there once, and every stopped
    trial's ε is the accountant's for the epochs it took."""
    import os
    import signal
    import subprocess
    import tempfile
    from pathlib import Path

    import psutil

    here = str(Path(__file__).parent)
    ray_dir = tempfile.mkdtemp(prefix="rs")
    store = tmp_path / "killed" / "store"
    # experiment state saved at every step: with epochs this short and one checkpoint kept per trial,
    # Ray's default (throttled) state could name a checkpoint already rotated away when the driver dies;
    # the driver kills itself right after it recorded its sixth trial
    env = {**os.environ, "RAY_TMPDIR": ray_dir, "TUNE_GLOBAL_CHECKPOINT_S": "0",
           "DPTUNE_FAULTS": "trial_recorded@6=kill"}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER.format(here=here, storage=str(tmp_path))], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert proc.wait(timeout=300) == -signal.SIGKILL, "the sweep was not killed at its sixth recorded trial"
    finally:
        for p in psutil.process_iter(["cmdline"]):
            try:
                if ray_dir in " ".join(p.info["cmdline"] or []):
                    p.kill()
            except psutil.Error:
                pass
    before = ResultsStore(str(store)).table("trials")
    assert len(before) == 6
    resume_sweep(str(tmp_path / "killed"), out=sys.stderr, trainable=rigged.rigged_trainable)
    rows = ResultsStore(str(store)).table("trials")
    assert len(rows) == 2 * len(rigged.ACCURACY) and rows.trial_id.is_unique
    assert {(r.epsilon, round(r.clip_bound, 6)) for r in rows[rows.status == "stopped"].itertuples()} \
        == expected_stopped()
    steps = num_steps(EPOCHS, N, 20)
    for r in rows[rows.status == "stopped"].itertuples():
        spent = epsilon_spent(r.noise_multiplier, 1e-5, sample_rate(20, N), rigged.epoch_step(r.epoch, steps, EPOCHS))
        assert r.epoch < EPOCHS and r.epsilon_spent == pytest.approx(spent, rel=1e-9) and r.epsilon_spent < r.epsilon
    kept = before[before.status == "stopped"].set_index("trial_id")
    assert (rows.set_index("trial_id").loc[kept.index, "status"] == "stopped").all()
