"""End-to-end training on embedded digits, privacy plan arithmetic, and exact resume."""
import math

import pytest
import torch

from dptune.privacy import calibrate_noise, epsilon_spent
from dptune.trainables.config import TrainConfig
from dptune.trainables.training import Trainer, plan_privacy, train


def test_non_private_cnn_reaches_95_percent_on_digits():
    history = train(TrainConfig(dataset="digits", model="cnn", epsilon=math.inf, epochs=15, batch_size=128,
                                learning_rate=0.1, momentum=0.9), progress=False)
    assert history[-1]["accuracy"] >= 0.95
    assert history[-1]["epsilon_spent"] == math.inf


def test_dp_training_at_epsilon_8_learns_and_spends_its_budget():
    cfg = TrainConfig(dataset="digits", model="cnn", epsilon=8.0, epochs=10, batch_size=128, learning_rate=2.0)
    history = train(cfg, progress=False)
    assert history[-1]["accuracy"] > 0.5  # chance is 0.1; the measured figure is in the README
    spent = [h["epsilon_spent"] for h in history]
    assert all(a < b for a, b in zip(spent, spent[1:]))
    assert 7.9 <= spent[-1] <= 8.0
    assert history[-1]["step"] == math.ceil(10 * 1437 / 128)
    gradnorms = history[-1]["nonprivate_gradnorms"]
    assert set(gradnorms) == set(range(10)) and sum(len(v["histogram"]) for v in gradnorms.values()) == 320


def test_plan_follows_the_design_formulas():
    cfg = TrainConfig(epsilon=3.0, batch_size=100, epochs=2.5)
    plan = plan_privacy(cfg, 1437)
    assert plan.sample_rate == 100 / 1437 and plan.steps == math.ceil(2.5 * 1437 / 100)
    assert plan.noise_multiplier == calibrate_noise(3.0, 1e-5, 100 / 1437, plan.steps)
    with pytest.raises(ValueError, match="batch_size"):
        plan_privacy(TrainConfig(batch_size=2000), 1437)


def test_resumed_run_ends_exactly_like_an_uninterrupted_one():
    cfg = TrainConfig(dataset="digits", model="mlp", epsilon=4.0, epochs=3, batch_size=256, learning_rate=1.0,
                      optimizer="adam", model_options={"hidden": 32})
    straight = Trainer(cfg)
    while not straight.done:
        straight.run_epoch()

    first = Trainer(cfg)
    first.run_epoch()
    saved = first.state_dict()
    torch.manual_seed(1234)  # disturb the global RNG: the checkpoint must restore it
    resumed = Trainer(cfg)
    resumed.load_state_dict(saved)
    while not resumed.done:
        last = resumed.run_epoch()
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    assert last["epsilon_spent"] == epsilon_spent(straight.plan.noise_multiplier, 1e-5, straight.plan.sample_rate,
                                                  straight.plan.steps)


@pytest.mark.parametrize("values,field", [
    (dict(epsilon=0.0), "epsilon"), (dict(delta=1.0), "delta"), (dict(clip_bound=-1.0), "clip_bound"),
    (dict(batch_size=0), "batch_size"), (dict(optimizer="lion"), "optimizer"), (dict(epochs=0), "epochs"),
    (dict(clip_fn="soft"), "clip_fn"), (dict(learning_rate=0.0), "learning_rate"),
])
def test_bad_config_names_the_field(values, field):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**values).validate()


def test_unknown_config_keys_are_errors():
    with pytest.raises(ValueError, match="clip_bond"):
        TrainConfig.from_dict({"clip_bond": 1.0})
