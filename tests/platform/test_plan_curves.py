"""A sweep's plan computes each trial's per-epoch ε with its σ (in the calibration tasks), so a
trial reads it from the cache: checked by forbidding the accountant in the trial, and against
epsilon_spent at each epoch end computed here."""
import pytest

import dptune.privacy.prv as prv
from dptune.privacy import cache, epsilon_spent
from dptune.privacy.schedule import epoch_end_steps
from dptune.trainables.training import Trainer
from dptune.platform.sweep.trial_config import train_config
from sweep_plans import digits_spec

from dptune.platform.sweep.catalog import trainables_catalog
from dptune.search_spaces import load_spec, plan_sweep


def test_a_sweeps_plan_puts_every_trials_epsilon_curve_in_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path))   # an empty cache: the plan computes everything
    cache.clear_memory()
    catalog = trainables_catalog()
    spec = load_spec(digits_spec(epsilon=[1.0, 4.0], batch_size=[300, 600], epochs=3, model_options={"hidden": 16}),
                     catalog)
    plan = plan_sweep(spec, catalog, workers=2, draw=True)   # the sweep's path, calibration in 2 processes
    cache.clear_memory()   # what the trial finds is what the calibration processes wrote to disk

    def forbidden(*args, **kwargs):
        raise AssertionError("the trial computed an ε the plan should have cached")

    monkeypatch.setattr(prv, "compose_epsilons", forbidden)
    monkeypatch.setattr(prv, "compose_epsilon", forbidden)
    curves = [(config, Trainer(train_config(config)).epoch_epsilons) for config in plan.trials()]
    monkeypatch.undo()   # the reference below computes
    for config, curve in curves:
        sigma, q = config["noise_multiplier"], config["sample_rate"]
        assert len(curve) == 3 and curve == sorted(curve) and curve[-1] <= config["epsilon"]
        for t, value in zip(epoch_end_steps(3, config["steps"]), curve):
            assert value == pytest.approx(epsilon_spent(sigma, 1e-5, q, t), abs=0.01)
