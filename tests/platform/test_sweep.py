"""A small sweep on real local Ray: one store row per trial with the right figures; errors recorded."""
import math

import pytest
import ray

from dptune.platform.launcher import RunSettings, run_trials
from dptune.platform.store import ResultsStore
from dptune.privacy import calibrate_noise

N_DIGITS_TRAIN = 1437


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    yield
    ray.shutdown()


def spec(**train):
    base = {"dataset": "digits", "model": "mlp", "epsilon": 4.0, "epochs": 2, "batch_size": 200,
            "learning_rate": 1.0, "clip_bound": 1.0, "seed": 0, "model_options": {"hidden": 32}}
    base.update(train)
    return {"train": base, "meta": {"cell": f"digits|mlp|eps={base['epsilon']}"}}


def test_sweep_writes_one_row_per_trial_with_the_right_figures(local_ray, tmp_path, capsys):
    trials = [spec(epsilon=2.0, clip_bound=0.5), spec(epsilon=8.0, batch_size=400), spec(epsilon=8.0, seed=3)]
    failing = [spec(model="no_such_model"), spec(learning_rate=1e38)]  # raises / loss becomes infinite
    settings = RunSettings(experiment="small", storage=str(tmp_path), max_failures=0, verbose=0)
    run_trials(trials + failing, settings)
    # the quiet log: one line per ended trial, none of Ray Tune's boxes and tables
    printed = capsys.readouterr().out
    assert "Configuration for experiment" not in printed and "9223372036854775807" not in printed
    lines = [l for l in printed.splitlines() if l.startswith("[")]
    assert len(lines) == 5 and sum(" finished " in l for l in lines) == 3 and sum(" ERRORED " in l for l in lines) == 2
    assert all("digits|mlp|eps=" in l for l in lines) and sum("acc " in l for l in lines) >= 3

    rows = ResultsStore(settings.paths.store).table("trials")
    assert len(rows) == 5 and rows.trial_id.is_unique
    done = rows[rows.status == "finished"].sort_values(["epsilon", "batch_size", "seed"])
    assert len(done) == 3
    for (_, row), t in zip(done.iterrows(), sorted(trials, key=lambda t: (t["train"]["epsilon"],
                                                                         t["train"]["batch_size"],
                                                                         t["train"]["seed"]))):
        cfg = t["train"]
        q = cfg["batch_size"] / N_DIGITS_TRAIN
        steps = math.ceil(cfg["epochs"] * N_DIGITS_TRAIN / cfg["batch_size"])
        assert (row.dataset, row.backbone, row.epsilon, row.clip_bound, row.batch_size, row.seed) == \
            ("digits", "mlp", cfg["epsilon"], cfg["clip_bound"], cfg["batch_size"], cfg["seed"])
        assert row.sample_rate == pytest.approx(q) and row.steps == steps
        assert row.noise_multiplier == pytest.approx(calibrate_noise(cfg["epsilon"], 1e-5, q, steps))
        assert row.noise_sqrt_steps == pytest.approx(row.noise_multiplier * math.sqrt(steps))
        assert row.epsilon_spent <= cfg["epsilon"] and row.accuracy > 0.15
        assert len(row.per_class_accuracy) == 10
    errors = rows[rows.status == "error"].set_index("backbone")
    assert "model must be one of" in errors.loc["no_such_model", "error"]
    assert "TrialDiverged" in errors.loc["mlp", "error"] or "loss became" in errors.loc["mlp", "error"]

    epochs = ResultsStore(settings.paths.store).table("epochs")
    finished_ids = set(done.trial_id)
    per_trial = epochs[epochs.trial_id.isin(finished_ids)].groupby("trial_id").epoch.apply(sorted)
    assert all(v == [1, 2] for v in per_trial)
    # the diverged trial keeps its curve up to the epoch whose loss was no longer finite
    diverged = errors.loc["mlp", "trial_id"]
    assert epochs[epochs.trial_id == diverged].loss.isna().tolist() == [True]
    gradnorms = ResultsStore(settings.paths.store).table("gradnorms")
    assert set(gradnorms.trial_id) == finished_ids | {diverged} and gradnorms.nonprivate.all()
    # the store is the record: none of Ray Tune's per-trial logger files (a TensorBoard writer and
    # three files per trial, about a third of the driver's time per trial in short sweeps)
    logged = [p.name for p in tmp_path.rglob("*") if p.name.startswith(("events.out.tfevents", "progress.csv",
                                                                           "result.json"))]
    assert not logged, logged
