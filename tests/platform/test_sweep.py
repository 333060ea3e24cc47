"""A small sweep on real local Ray through the production path (spec → plan → run_sweep): one store
row per trial with the right figures; diverged trials recorded with their message and curve."""
import math

import pytest

from dptune.platform.sweep.launcher import RunSettings
from dptune.platform.store.results_store import ResultsStore
from dptune.platform.sweep.driver import run_sweep
from accounting_checks import assert_calibrated
from sweep_plans import digits_spec, plan_of

N_DIGITS_TRAIN = 1437


def test_sweep_writes_one_row_per_trial_with_the_right_figures(local_ray, tmp_path, capsys):
    # two ε × two B; η multiplier 1e38 makes the loss infinite in its first epoch: 4 finished, 4 diverged
    plan = plan_of(digits_spec(epsilon=[2.0, 8.0], batch_size=[200, 400], multipliers=[1.0, 1e38], epochs=2,
                               model_options={"hidden": 32}))
    settings = RunSettings(experiment="small", storage=str(tmp_path), max_failures=0, verbose=0)
    outcome = run_sweep(plan, settings)
    assert (outcome.finished, outcome.errored) == (4, 4)
    # the quiet log: one line per ended trial, none of Ray Tune's boxes and tables
    printed = capsys.readouterr().out
    assert "Configuration for experiment" not in printed and "9223372036854775807" not in printed
    # trial lines (a live "running" line is printed too when no trial ends for a minute, as under load)
    lines = [line for line in printed.splitlines() if line.startswith("[") and line.split()[1] != "running"]
    assert len(lines) == 8 and sum(" finished " in line for line in lines) == 4
    assert sum(" ERRORED " in line for line in lines) == 4
    assert all("digits/mlp[hidden=32]/E=2/" in line for line in lines) and sum("acc " in line for line in lines) >= 4

    rows = ResultsStore(settings.paths.store).table("trials")
    assert len(rows) == 8 and rows.trial_id.is_unique
    done = rows[rows.status == "finished"].sort_values(["epsilon", "batch_size"])
    assert [(r.epsilon, r.batch_size) for r in done.itertuples()] == [(2.0, 200), (2.0, 400), (8.0, 200), (8.0, 400)]
    for row in done.itertuples():
        q = row.batch_size / N_DIGITS_TRAIN
        steps = math.ceil(2 * N_DIGITS_TRAIN / row.batch_size)
        assert (row.dataset, row.backbone, row.clip_bound, row.seed) == ("digits", "mlp[hidden=32]", 1.0, 0)
        assert row.sample_rate == pytest.approx(q) and row.steps == steps
        assert_calibrated(row.noise_multiplier, row.epsilon, 1e-5, q, steps)
        assert row.noise_sqrt_steps == pytest.approx(row.noise_multiplier * math.sqrt(steps))
        assert row.epsilon_spent <= row.epsilon and row.accuracy > 0.15
        assert row.learning_rate == pytest.approx(math.sqrt(row.batch_size / 200))
        assert len(row.per_class_accuracy) == 10
    errors = rows[rows.status == "error"]
    assert len(errors) == 4 and (errors.learning_rate > 1e37).all()
    assert all("TrialDiverged" in e and "loss became" in e for e in errors.error)

    epochs = ResultsStore(settings.paths.store).table("epochs")
    finished_ids = set(done.trial_id)
    per_trial = epochs[epochs.trial_id.isin(finished_ids)].groupby("trial_id").epoch.apply(sorted)
    assert all(v == [1, 2] for v in per_trial)
    # a diverged trial keeps its curve up to the epoch whose loss was no longer finite
    diverged = epochs[epochs.trial_id.isin(set(errors.trial_id))]
    assert len(diverged) == 4 and diverged.loss.isna().all() and (diverged.epoch == 1).all()
    gradnorms = ResultsStore(settings.paths.store).table("gradnorms")
    assert set(gradnorms.trial_id) == set(rows.trial_id) and gradnorms.nonprivate.all()
    # the store is the record: none of Ray Tune's per-trial logger files (a TensorBoard writer and
    # three files per trial, about a third of the driver's time per trial in short sweeps)
    logged = [p.name for p in tmp_path.rglob("*") if p.name.startswith(("events.out.tfevents", "progress.csv",
                                                                           "result.json"))]
    assert not logged, logged
