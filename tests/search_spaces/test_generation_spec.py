"""Specs of generation tasks (a causal LM on prompt → completion data), with the real catalog: the
metric a sweep selects on and its direction, and every mismatch refused in one line before anything
runs."""
import json

import pytest

from dptune.platform.sweep.catalog import trainables_catalog
from dptune.search_spaces import SearchSpace, SpecError, load_spec, plan_sweep

from sweep_plans import levers_off


def lm_spec(**overrides) -> dict:
    spec = {"axes": {"epsilon": [2, 9], "backbone": {"name": "smollm2-135m"}, "dataset": "bbc_headlines",
                     "epochs": 1},
            "clip_bound": [0.5, 1], "batch_size": [64], "search": levers_off(),
            "learning_rate": {"reference": 2e-4, "reference_batch_size": 64, "multipliers": [1]}}
    spec.update(overrides)
    return spec


def test_a_generation_sweep_selects_on_test_nll_lower_is_better_by_default():
    spec = load_spec(lm_spec(), trainables_catalog())
    space = SearchSpace.from_spec(spec)
    assert (space.axes.task, space.metric) == ("generation", "test_nll")
    plan = plan_sweep(spec, trainables_catalog())
    assert (plan.metric, plan.mode) == ("test_nll", "min")
    assert {c["metric"] for c in plan.trials()} == {"test_nll"}
    validated = SearchSpace.from_spec(load_spec(lm_spec(selection={"validation_fraction": 0.1}), trainables_catalog()))
    assert validated.metric == "validation_nll"
    named = lm_spec(selection={"validation_fraction": 0.1, "metric": "test_nll"})
    assert SearchSpace.from_spec(load_spec(named, trainables_catalog())).metric == "test_nll"


@pytest.mark.parametrize("overrides, message", [
    (dict(selection={"metric": "test_accuracy"}),
     "selection.metric: a generation task reports test_nll, validation_nll; got 'test_accuracy'"),
    (dict(selection={"metric": "validation_nll"}),
     "selection.metric: validation_nll needs a validation split (selection.validation_fraction > 0)"),
    (dict(selection={"metric": "test_rouge"}), "selection.metric: must be one of"),
    (dict(selection={"mode": "private"}), "selection.mode: private selection releases a noisy validation accuracy"),
    (dict(axes={"epsilon": 2, "backbone": "smollm2-135m", "dataset": ["bbc_headlines", "digits"], "epochs": 1}),
     "axes.dataset: one task per sweep"),
    (dict(axes={"epsilon": 2, "backbone": "cnn", "dataset": "bbc_headlines", "epochs": 1}),
     "axes: dataset 'bbc_headlines' is a generation task (prompt → completion): its backbone must be a causal "
     "language model"),
])
def test_mismatches_are_refused_in_one_line_naming_the_field(overrides, message):
    with pytest.raises(SpecError) as err:
        load_spec(lm_spec(**overrides), trainables_catalog())
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_classifier_sweep_cannot_name_an_lm_metric_nor_train_the_embedded_lm():
    spec = {**lm_spec(), "axes": {"epsilon": 2, "backbone": "cnn", "dataset": "digits", "epochs": 1}}
    with pytest.raises(SpecError, match="a classification task reports test_accuracy, validation_accuracy; "
                                        "got 'test_nll'"):
        load_spec({**spec, "selection": {"metric": "test_nll"}}, trainables_catalog())
    with pytest.raises(SpecError, match="'smollm2-135m' is a causal language model"):
        load_spec({**spec, "axes": {**spec["axes"], "backbone": "smollm2-135m"}}, trainables_catalog())


def test_a_checkpoint_without_a_causal_lm_head_is_refused_from_its_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "distilbert"}))
    spec = lm_spec(axes={"epsilon": 2, "backbone": {"name": f"hf:{tmp_path}"}, "dataset": "bbc_headlines",
                         "epochs": 1})
    with pytest.raises(SpecError, match="a distilbert model has no causal-LM head; dataset 'bbc_headlines' is a "
                                        "generation task"):
        load_spec(spec, trainables_catalog())
    random = lm_spec(axes={"epsilon": 2, "backbone": {"name": "hf:bert_generation_typo", "weights": "random"},
                           "dataset": "bbc_headlines", "epochs": 1})
    with pytest.raises(SpecError, match="has no causal-LM head"):
        load_spec(random, trainables_catalog())
