"""Sweep-spec validation: every mistake fails before anything runs, naming the field."""
import re
from pathlib import Path

import pytest

from dptune.platform.sweep.catalog import trainables_catalog
from dptune.search_spaces import SearchSpace, SpecError, load_spec, register_check, register_section
from dptune.search_spaces import spec as spec_module
from dptune.search_spaces.search_sections import AxisValue
from dptune.search_spaces.spec import integer, mapping

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_small.yaml"


def test_a_valid_spec_is_parsed_with_defaults(catalog, toy_spec):
    spec = load_spec(toy_spec(), catalog)
    space = SearchSpace.from_spec(spec)
    assert space.axes.epsilon == (1.0, 4.0) and space.axes.delta == (1e-5,)
    assert space.clip_bounds == (0.1, 1.0, 10.0) and space.batch_sizes == (5, 10, 20, 40, 100, 400)
    assert space.search.algorithm == "grid" and space.seeds == (0,)
    assert space.trial.config() == {"norm_estimator": "exact", "sketch_k": None}
    assert space.learning_rate.at(80, 2.0) == pytest.approx(1.0 * 2 * 2)   # √(80/20) = 2


def test_scalars_numeric_strings_and_log_spaced_clip_grid(catalog, toy_spec):
    spec = load_spec(toy_spec(axes={"epsilon": "0.5", "delta": "1e-5", "backbone": "mlp", "dataset": "toy",
                                    "epochs": 3},
                              clip_bound={"min": 0.01, "max": 100, "num": 5}), catalog)
    space = SearchSpace.from_spec(spec)
    assert space.axes.epsilon == (0.5,) and space.axes.delta == (1e-5,) and space.axes.backbone == (AxisValue("mlp"),)
    assert space.clip_bounds == pytest.approx((0.01, 0.1, 1.0, 10.0, 100.0))


@pytest.mark.parametrize("overrides, message", [
    (dict(serach={"algorithm": "grid"}), "unknown section 'serach' (did you mean 'search'?)"),
    (dict(pruning={"min_step": 20}), "pruning.min_step: unknown key 'min_step' (did you mean 'min_steps'?); "
                                     "allowed: max_batch_sizes, min_steps, plateau_tol"),
    (dict(axes={"epsilon": [1, 0], "backbone": "mlp", "dataset": "toy", "epochs": 1}),
     "axes.epsilon[1]: must be a number > 0, or inf for the non-private baseline; got 0"),
    (dict(axes={"epsilon": -2, "backbone": "mlp", "dataset": "toy", "epochs": 1}), "axes.epsilon: must be"),
    (dict(axes={"epsilon": "-inf", "backbone": "mlp", "dataset": "toy", "epochs": 1}), "or inf for the non-private"),
    (dict(clip_bound=[]), "clip_bound: must be a value or a non-empty list"),
    (dict(batch_size=[]), "batch_size: must be a value or a non-empty list"),
    (dict(learning_rate={"reference": 1, "reference_batch_size": 8, "multipliers": []}),
     "learning_rate.multipliers: must be a value or a non-empty list"),
    (dict(batch_size=[8, 8]), "duplicate value 8"),
    (dict(batch_size=[8, 2.5]), "batch_size[1]: must be a whole number >= 1"),
    (dict(axes={"epsilon": 1, "backbone": "resnet", "dataset": "toy", "epochs": 1}),
     "axes.backbone: unknown backbone 'resnet'; registered: cnn, mlp"),
    (dict(axes={"epsilon": 1, "backbone": "mlp", "dataset": "cifar", "epochs": 1}),
     "axes.dataset: unknown dataset 'cifar'; registered: toy"),
    (dict(axes={"epsilon": 1, "backbone": "mlp", "dataset": "toy"}), "axes.epochs: required"),
    (dict(learning_rate=None), "learning_rate: required section is missing"),
    (dict(search={"algorithm": "bayes"}), "search.algorithm: must be one of grid, random, optuna"),
    (dict(search={"algorithm": "optuna"}), "search.budget: required for algorithm optuna"),
    (dict(search={"algorithm": "grid", "budget": 5}), "search.budget: only applies to algorithm random or optuna"),
    (dict(search={"algorithm": "optuna", "budget": 4, "startup_trials": 9}), "search.startup_trials: must be <="),
    (dict(trial={"optimizer": "lamb"}), "trial.optimizer: must be one of sgd, adam"),
    (dict(trial={"peft": "adapters"}), "trial.peft: must be one of null, film, lora, head, full"),
    (dict(trial={"norm_estimator": "magic", "sketch_k": 8}),
     "trial.norm_estimator: must be one of exact, hutchinson, hutchpp"),
    (dict(trial={"sketch_k": 8}), "trial: sketch_k must be None when norm_estimator='exact'"),
    (dict(trial={"denoise": "svd"}), "trial.denoise: must be one of null, rmt"),
    (dict(pruning={"plateau_tol": -1}), "pruning.plateau_tol: must be a finite number >= 0"),
    (dict(dataset_sizes={"toy": 0}), "dataset_sizes.toy: must be a whole number >= 1"),
    (dict(dataset_sizes={"cifar100": 50000}), "dataset_sizes.cifar100: not on axes.dataset"),
    (dict(seeds=[]), "seeds: must be a value or a non-empty list"),
])
def test_bad_specs_fail_naming_the_field(catalog, toy_spec, overrides, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        load_spec(toy_spec(**overrides), catalog)


def test_every_error_is_reported_at_once(catalog, toy_spec):
    with pytest.raises(SpecError) as info:
        load_spec(toy_spec(clip_bound=[], batch_size=[0], extra=1), catalog)
    text = str(info.value)
    assert "unknown section 'extra'" in text and "clip_bound:" in text and "batch_size[0]:" in text


def test_declared_sizes_allow_planning_an_unregistered_dataset(catalog, toy_spec):
    spec = load_spec(toy_spec(axes={"epsilon": 1, "backbone": "mlp", "dataset": ["toy", "cifar100"], "epochs": 1},
                              dataset_sizes={"cifar100": 50000}), catalog)
    assert SearchSpace.from_spec(spec).dataset_sizes == {"cifar100": 50000}


def test_another_component_adds_sections_and_checks(catalog, toy_spec, monkeypatch):
    """Another component (the platform) registers its own sections; unknown keys inside them are
    still errors, and a second registration of a name is refused."""
    monkeypatch.setattr(spec_module, "SECTIONS", spec_module.SECTIONS.copy())
    monkeypatch.setattr(spec_module, "CHECKS", spec_module.CHECKS.copy())

    @register_section("notify", default={}, summary="where to send the summary")
    def parse_notify(value, catalog):
        raw = mapping(value, "notify", ("email", "retries"))
        return {"retries": integer(raw.get("retries", 1), "notify.retries", ge=1)}

    @register_check
    def at_most_eight_retries(spec, catalog):
        if spec["notify"]["retries"] > 8:
            raise SpecError("notify.retries: at most 8 here")

    assert load_spec(toy_spec(), catalog)["notify"] == {"retries": 1}
    assert load_spec(toy_spec(notify={"retries": 2}), catalog)["notify"] == {"retries": 2}
    with pytest.raises(SpecError, match="notify.emails: unknown key 'emails' \\(did you mean 'email'\\?\\)"):
        load_spec(toy_spec(notify={"emails": "a@b"}), catalog)
    with pytest.raises(SpecError, match="at most 8"):
        load_spec(toy_spec(notify={"retries": 9}), catalog)
    with pytest.raises(ValueError, match="already registered"):
        register_section("axes")(parse_notify)
    register_check(at_most_eight_retries)  # the same check again: not an error, and it runs once
    assert list(spec_module.CHECKS).count(f"{__name__}.{at_most_eight_retries.__qualname__}") == 1


def test_the_example_spec_is_valid():
    spec = load_spec(EXAMPLE, trainables_catalog())
    space = SearchSpace.from_spec(spec)
    assert space.axes.dataset == (AxisValue("digits"),) and space.pruning.max_batch_sizes == 3


def test_yaml_that_is_not_a_mapping_is_refused(tmp_path, catalog):
    path = tmp_path / "bad.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match="must be a mapping of sections"):
        load_spec(path, catalog)
    with pytest.raises(FileNotFoundError):
        load_spec(tmp_path / "missing.yaml", catalog)


def test_a_yaml_syntax_error_names_file_line_and_column_and_shows_the_line(tmp_path, catalog):
    path = tmp_path / "typo.yaml"
    path.write_text("axes:\n  epsilon: 1\n  dataset: digits\nclip_bound: [0.1, 1\nbatch_size: [64]\n")
    with pytest.raises(SpecError) as info:
        load_spec(path, catalog)
    first, *shown = str(info.value).splitlines()
    # PyYAML stops at line 5 ("batch_size:", column 11: the ':'); the unclosed '[' opened on line 4
    assert first.startswith(f"{path}:5:11: not valid YAML: expected ',' or ']', but got ':'") and "line 4" in first
    assert "<unicode string>" not in str(info.value)
    assert shown == ["     4 | clip_bound: [0.1, 1", "       |             ^",
                     "     5 | batch_size: [64]", "       |           ^"]


def test_randomised_clipping_needs_a_sketch_size(catalog, toy_spec):
    hutch = catalog
    with pytest.raises(SpecError, match=re.escape("trial: sketch_k must be a whole number >= 1")):
        load_spec(toy_spec(trial={"norm_estimator": "hutchinson"}), hutch)
    space = SearchSpace.from_spec(load_spec(toy_spec(trial={"norm_estimator": "hutchinson", "sketch_k": 32}), hutch))
    assert space.trial.config() == {"norm_estimator": "hutchinson", "sketch_k": 32}
