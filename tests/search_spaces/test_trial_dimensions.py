"""Issue 18: trial options given as lists (``trial: {denoise: [null, rmt]}``) are search dimensions:
one sub-cell per combination, each with its own (C, B, η) search, counted by the plan."""
import itertools

import pytest

from dptune.platform.sweep.trial_config import train_options
from dptune.trainables.config import check_option
from dptune.platform.sweep.catalog import trainables_catalog
from dptune.search_spaces import load_spec, plan_sweep
from dptune.search_spaces.spec import SpecError
from dptune.trainables.config import TrainConfig

N = 200
DENOISE_OPTIONS = ("denoise_kappa", "denoise_norm_correction", "denoise_scope")


@pytest.fixture
def cat(catalog):
    """The toy catalog with the trainer's own option names and config fields."""
    from dptune.search_spaces import Catalog

    return Catalog(datasets=catalog.datasets, backbones=catalog.backbones, dataset_size=catalog.dataset_size,
                   check_trial_option=check_option)


def brute_force(trial: dict) -> list[dict]:
    """Every combination of the listed values, written out by hand; the denoise_* options dropped
    where nothing is denoised, and duplicates removed."""
    listed = {k: v for k, v in trial.items() if isinstance(v, list) and k != "diagnostics"}
    fixed = {k: v for k, v in trial.items() if k not in listed}
    out = []
    for values in itertools.product(*listed.values()):
        combo = dict(zip(listed, values))
        if {**fixed, **combo}.get("denoise") is None:
            combo = {k: v for k, v in combo.items() if k not in DENOISE_OPTIONS}
        if combo not in out:
            out.append(combo)
    return out


@pytest.mark.parametrize("trial", [
    {"denoise": [None, "rmt"]},
    {"denoise": [None, "rmt"], "denoise_norm_correction": [True, False], "denoise_kappa": [1.02, 1.2]},
    {"denoise": "rmt", "denoise_kappa": [1.02, 1.1, 1.25], "clip_fn": ["flat", "auto_s"]},
    {"clip_fn": ["flat", "auto_s"], "optimizer": "adam", "diagnostics": ["denoise_cosine"]},
])
def test_plan_counts_every_combination_like_a_brute_force_enumeration(cat, toy_spec, trial):
    spec = load_spec(toy_spec(trial=trial, seeds=[0, 1]), cat)
    plan = plan_sweep(spec, cat, workers=1)
    combos = brute_force(trial)
    epsilons = (1, 4)
    assert len(plan.cells) == len(combos) * len(epsilons)
    # the trials: every combination × ε × (C, B, η) × seed, each once, with the combination's values
    expected = 0
    seen = set()
    for cell in plan:
        options = dict(cell.cell.options)
        assert options in combos
        assert cell.cell.key.endswith("".join(f"/{k}={'null' if v is None else v}" for k, v in options.items()))
        n_c = 1 if {**trial, **options}.get("clip_fn") == "auto_s" else 3      # auto_s: one C stands for all
        expected += n_c * len(cell.searched_batch_sizes) * 3 * 2
        for t in cell.trials():
            train = t
            cfg = TrainConfig.from_dict(train_options(train)).validate()
            for k, v in options.items():
                assert getattr(cfg, k) == v
            for k, v in trial.items():
                if not isinstance(v, list) or k == "diagnostics":
                    assert getattr(cfg, k) == v
            key = (t["cell"], train["clip_bound"], train["batch_size"], train["learning_rate"], train["seed"])
            assert key not in seen
            seen.add(key)
    assert plan.num_trials == len(plan.trials()) == expected == len(seen)


def test_a_searched_norm_estimator_calibrates_sigma_per_sub_cell(toy_spec, cat, monkeypatch):
    """Each sub-cell asks the accountant for its own estimator's σ (a randomised estimator's σ takes
    minutes to calibrate: the accountant is replaced by a recorder here; it is tested in tests/privacy)."""
    asked = []

    def recorder(requests, **_):
        asked.extend(requests)
        return {r: (2.0 if r.norm_estimator == "hutchinson" else 1.0) for r in requests}

    monkeypatch.setattr("dptune.search_spaces.planner.calibrate_many", recorder)
    spec = load_spec(toy_spec(axes={"epsilon": 4, "backbone": "mlp", "dataset": "toy", "epochs": 2},
                              batch_size=[20], trial={"norm_estimator": ["exact", "hutchinson"], "sketch_k": 8}), cat)
    plan = plan_sweep(spec, cat, workers=1)
    exact, hutch = plan.cells
    assert [dict(c.cell.options) for c in plan] == [{"norm_estimator": "exact"}, {"norm_estimator": "hutchinson"}]
    assert {(r.norm_estimator, r.sketch_k) for r in asked} == {("exact", None), ("hutchinson", 8)}
    assert (exact.rows[0]["noise_multiplier"], hutch.rows[0]["noise_multiplier"]) == (1.0, 2.0)
    assert [(t["norm_estimator"], t["sketch_k"], t["noise_multiplier"])
            for t in (exact.trials()[0], hutch.trials()[0])] == [("exact", None, 1.0), ("hutchinson", 8, 2.0)]


@pytest.mark.parametrize("trial,message", [
    ({"denoise": [None, "wiener"]}, r"^trial\.denoise\[1\]: must be one of null, rmt; got 'wiener'$"),
    ({"denoise": "rmt", "denoise_kappa": [1.02, 0.9]}, r"^trial\.denoise_kappa\[1\]: must be a number >= 1"),
    ({"denoise_kappa": "big"}, r"^trial\.denoise_kappa: must be a number >= 1"),
    ({"denoise_norm_correction": [True, "no"]}, r"^trial\.denoise_norm_correction\[1\]: must be true or false"),
    ({"denoise_scope": ["all", "attention"]}, r"^trial\.denoise_scope\[1\]: must be one of all, lora"),
    ({"clip_fn": ["flat", "flat"]}, r"^trial\.clip_fn: duplicate value 'flat'$"),
    ({"clip_fn": []}, r"^trial\.clip_fn: must be a value or a non-empty list"),
    ({"diagnostics": ["cosine"]}, r"^trial\.diagnostics: must be a list of names from: denoise_cosine"),
    ({"diagnostics": "denoise_cosine"}, r"^trial\.diagnostics: must be a list of names"),
    ({"optimizer": ["sgd", "adam"]}, r"^trial\.optimizer: must be one of"),   # not a search dimension
])
def test_bad_values_are_refused_in_one_line(toy_spec, trial, message):
    with pytest.raises(SpecError, match=message) as info:
        load_spec(toy_spec(trial=trial), trainables_catalog())
    assert "\n" not in str(info.value)


def test_private_selection_refuses_a_searched_norm_estimator(toy_spec, cat):
    """Private selection accounts exact clipping only: a searched estimator is refused in one line."""
    spec = toy_spec(trial={"norm_estimator": ["exact", "hutchinson"], "sketch_k": 8}, seeds=[0],
                    search={"algorithm": "random"}, selection={"mode": "private"})
    with pytest.raises(SpecError, match=r"trial\.norm_estimator: selection\.mode private accounts exact clipping "
                                        r"only; give one value") as info:
        load_spec(spec, cat)
    assert "\n" not in str(info.value)
    load_spec({**spec, "trial": {"denoise": [None, "rmt"]}}, cat)   # other searched options are fine
