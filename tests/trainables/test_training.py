"""End-to-end training on embedded digits, privacy plan arithmetic, and exact resume."""
import math

import pytest
import torch

from accounting_checks import assert_calibrated
from dptune.privacy import epsilon_spent
from dptune.trainables.config import TrainConfig
from dptune.trainables.training import Trainer, plan_privacy, train
from sweep_plans import levers_off


def test_non_private_cnn_reaches_95_percent_on_digits():
    history = train(TrainConfig(dataset="digits", model="cnn", epsilon=math.inf, epochs=15, batch_size=128,
                                learning_rate=0.1, momentum=0.9), progress=False)
    assert history[-1]["test_accuracy"] >= 0.95
    assert history[-1]["epsilon_spent"] == math.inf


def test_dp_training_at_epsilon_8_learns_and_spends_its_budget():
    cfg = TrainConfig(dataset="digits", model="cnn", epsilon=8.0, epochs=10, batch_size=128, learning_rate=2.0)
    history = train(cfg, progress=False)
    assert history[-1]["test_accuracy"] > 0.5  # chance is 0.1; the measured figure is in the README
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
    assert_calibrated(plan.noise_multiplier, 3.0, 1e-5, 100 / 1437, plan.steps)
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


# --- validation split for selection (issue 12, item 4) ------------------------------------------

def test_validation_split_is_seeded_stratified_and_disjoint():
    from dptune.trainables.data.catalog import load_dataset
    from dptune.trainables.data.splits import labels_of, with_validation

    data = load_dataset("digits", seed=0)
    n = len(data.train)
    a, b, c = (with_validation(data, 0.1, s) for s in (0, 0, 1))
    assert len(a.validation) == math.ceil(0.1 * n) and len(a.train) == n - math.ceil(0.1 * n)
    assert torch.equal(a.train.tensors[0], b.train.tensors[0]) and not torch.equal(a.train.tensors[0],
                                                                                   c.train.tensors[0])
    from collections import Counter

    def rows(x):
        return Counter(tuple(r.flatten().tolist()) for r in x)

    # every training example in exactly one part (as a multiset: digits has duplicate images)
    assert rows(a.train.tensors[0]) + rows(a.validation.tensors[0]) == rows(data.train.tensors[0])
    share = torch.bincount(labels_of(a.validation), minlength=10).float() / len(a.validation)
    whole = torch.bincount(labels_of(data.train), minlength=10).float() / n
    assert (share - whole).abs().max() < 0.02                # stratified: class shares kept


def _accuracy(model, split) -> float:
    """Accuracy computed here, from the split's tensors in one forward pass."""
    x, y = split.tensors if hasattr(split, "tensors") else (split.dataset.tensors[0][split.indices],
                                                             split.dataset.tensors[1][split.indices])
    with torch.no_grad():
        return float((model(x).argmax(-1) == y).double().mean())


def test_training_with_a_validation_split_selects_on_it_and_reports_test_accuracy():
    cfg = TrainConfig(dataset="digits", model="mlp", epsilon=4.0, epochs=1, batch_size=64, learning_rate=1.0,
                      validation_fraction=0.2, model_options={"hidden": 16})
    trainer = Trainer(cfg)
    n = 1437 - math.ceil(0.2 * 1437)
    assert trainer.n_train == n
    q, steps = 64 / n, math.ceil(n / 64)
    assert (trainer.plan.sample_rate, trainer.plan.steps) == (pytest.approx(q), steps)
    assert_calibrated(trainer.plan.noise_multiplier, 4.0, 1e-5, q, steps)
    metrics = trainer.run_epoch()
    assert metrics["validation_nonprivate"] is True
    assert "accuracy" not in metrics and metrics["validation_accuracy"] == pytest.approx(
        _accuracy(trainer.model, trainer.data.validation))
    assert metrics["test_accuracy"] == pytest.approx(_accuracy(trainer.model, trainer.data.test))
    assert metrics["epsilon_spent"] == pytest.approx(epsilon_spent(trainer.plan.noise_multiplier, 1e-5, q, steps))


def test_the_planner_calibrates_for_the_examples_trained_on():
    from dptune.platform.sweep.catalog import trainables_catalog
    from dptune.platform.sweep.dp_trial import check_plan
    from dptune.platform.sweep.trial_config import plan_figures, train_config
    from dptune.search_spaces import load_spec, plan_sweep

    spec = {"axes": {"epsilon": 2, "backbone": {"name": "mlp", "hidden": 16}, "dataset": "digits", "epochs": 1},
            "clip_bound": 1, "batch_size": 64, "pruning": {"min_steps": 5},
            "learning_rate": {"reference": 1.0, "reference_batch_size": 64}, "selection": {"validation_fraction": 0.1},
            "search": levers_off()}
    plan = plan_sweep(load_spec(spec, trainables_catalog()), trainables_catalog(), workers=1)
    assert plan.cells[0].dataset_size == 1437 - math.ceil(0.1 * 1437)
    trial = plan.cells[0].trials()[0]
    assert trial["validation_fraction"] == 0.1
    check_plan(plan_figures(trial), Trainer(train_config(trial)).plan)   # q and T are the trainer's


def test_validation_split_of_a_tokenised_set_reads_labels_without_inputs():
    from dptune.trainables.data.catalog import load_dataset
    from dptune.trainables.data.splits import labels_of, with_validation

    data = load_dataset("bbc_news", max_length=8)
    split = with_validation(data, 0.1, 3)
    n = len(data.train)
    assert len(split.validation) == math.ceil(0.1 * n) and len(split.train) + len(split.validation) == n
    assert torch.equal(labels_of(split.validation), torch.stack([split.validation[i][1]
                                                                for i in range(len(split.validation))]))
    assert set(split.train.indices).isdisjoint(split.validation.indices)


def test_a_training_example_with_a_nan_is_counted_not_fatal():
    """Issue 22: one NaN pixel in one training example: the run trains to its end with finite
    weights, and each epoch reports how many times that example was drawn (and contributed nothing)."""
    from dataclasses import replace

    from torch.utils.data import TensorDataset

    from dptune.trainables.data.catalog import load_dataset

    data = load_dataset("digits", seed=0)
    x, y = (t.clone() for t in data.train.tensors)
    x[7, 0, 3, 3] = float("nan")
    poisoned = replace(data, train=TensorDataset(x, y))
    cfg = TrainConfig(dataset="digits", model="mlp", epsilon=4.0, epochs=4, batch_size=512, learning_rate=1.0,
                      model_options={"hidden": 16}, device="cpu")
    trainer = Trainer(cfg, poisoned)
    history = trainer.fit()
    drawn = sum(h["nonfinite_examples"] for h in history)
    # example 7 joins each of the T steps with probability q: its count is Binomial(T, q) (here T·q ≈ 4)
    assert 1 <= drawn <= trainer.plan.steps
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert math.isfinite(history[-1]["test_loss"]) and history[-1]["test_accuracy"] > 0.2
