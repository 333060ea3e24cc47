"""selection.mode private in the spec and the plan (issue 13): one-line errors naming the field, K
and the draws drawn secretly when the sweep starts (issue 22) from the pruned space, and σ per B
whose repeat-and-select total meets the cell's ε (recomputed here with the accountant)."""
import math
import re

import pytest

from dptune.errors import UserError
from dptune.privacy.selection import TrialCount, score_noise_multiplier, selection_privacy
from dptune.search_spaces import SpecError, format_plan, load_spec, plan_sweep

PRIVATE = {"mode": "private", "distribution": "truncated_negative_binomial", "mean_trials": 4, "shape": 1,
           "score_noise": 0.3, "validation_fraction": 0.1}


def _private(toy_spec, **overrides):
    base = {"search": {"algorithm": "random", "seed": 3}, "selection": dict(PRIVATE),
            "axes": {"epsilon": [4], "delta": 1e-5, "backbone": ["mlp"], "dataset": ["toy"], "epochs": [2]},
            "batch_size": [10, 20, 40]}
    return toy_spec(**{**base, **overrides})


@pytest.mark.parametrize("overrides,message", [
    ({"search": {"algorithm": "grid"}}, "search.algorithm: selection.mode private needs algorithm random: a grid"),
    ({"search": {"algorithm": "optuna", "budget": 5}}, "search.algorithm: selection.mode private needs algorithm "
                                                       "random: TPE chooses each configuration from earlier"),
    ({"search": {"algorithm": "random", "budget": 5}}, "search.budget: not used under selection.mode private"),
    ({"search": {"algorithm": "random", "scheduler": "asha"}}, "search.scheduler: asha stops trials"),
    ({"seeds": [0, 1]}, "seeds: give one seed under selection.mode private"),
    ({"selection": {**PRIVATE, "distribution": "uniform"}}, "selection.distribution: must be one of "
                                                            "truncated_negative_binomial, poisson, geometric"),
    ({"selection": {**PRIVATE, "distribution": "poisson"}}, "selection.shape: only applies to distribution "
                                                            "truncated_negative_binomial"),
    ({"selection": {**PRIVATE, "mean_trials": 1}}, "selection.mean_trials: must be a finite number > 1"),
    ({"selection": {**PRIVATE, "score_noise": 0}}, "selection.score_noise: must be a finite number > 0"),
    ({"selection": {**PRIVATE, "mode": "secret"}}, "selection.mode: must be one of nonprivate, private"),
    ({"selection": {"mean_trials": 4}}, "selection.mean_trials: only applies to selection.mode private"),
])
def test_bad_private_specs_fail_in_one_line_naming_the_field(catalog, toy_spec, overrides, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        load_spec(_private(toy_spec, **overrides), catalog)


def test_random_search_still_needs_a_budget_outside_private_selection(catalog, toy_spec):
    with pytest.raises(SpecError, match="search.budget: required for algorithm random"):
        load_spec(toy_spec(search={"algorithm": "random"}), catalog)


def test_the_sweep_draws_k_secret_trials_whose_total_meets_the_cell_budget(catalog, toy_spec):
    spec = load_spec(_private(toy_spec), catalog)
    dry = plan_sweep(spec, catalog, workers=1)                      # `dptune plan`: nothing drawn yet
    with pytest.raises(UserError, match="drawn secretly when the sweep starts"):
        dry.cells[0].draws
    assert "K and its trials are drawn secretly" in format_plan(dry) and dry.num_trials == 4   # the mean
    plan = plan_sweep(spec, catalog, workers=1, draw=True)
    (cell,) = plan.cells
    assert cell.validation_size == math.ceil(0.1 * 200) and cell.dataset_size == 200 - 20
    assert len(cell.draws) >= 1
    trials = cell.trials()
    assert plan.num_trials == cell.num_trials == len(trials) == len(cell.draws)
    grid = set(cell.grid)
    assert all(d[:3] in grid for d in cell.draws)
    law = TrialCount.of("truncated_negative_binomial", 4, 1)
    score = score_noise_multiplier(0.3, 20)
    for t, (c, b, m, seed) in zip(trials, cell.draws):
        train = meta = t
        assert (train["clip_bound"], train["batch_size"], train["seed"]) == (c, b, seed)
        assert train["split_seed"] == 0 and train["score_noise"] == 0.3 and train["validation_fraction"] == 0.1
        assert meta["selection_k"] == len(cell.draws)
        row = cell.row(b)
        privacy = selection_privacy(row["noise_multiplier"], row["sample_rate"], row["steps"], score_multiplier=score,
                                    count=law, delta=1e-5)
        assert meta["total_epsilon"] == pytest.approx(privacy.total_epsilon) and privacy.total_epsilon <= 4
        assert meta["trial_epsilon"] == pytest.approx(privacy.trial_epsilon)
        assert privacy.trial_epsilon < privacy.total_epsilon
    text = format_plan(plan)
    assert f"drew K = {len(cell.draws)}" in text and "per-trial ε (training + noisy score) → total ε" in text
    assert all(t["randomness"] == "secure" for t in trials)       # private selection always runs secure
    # the same spec draws another selection: nothing of it comes from the spec (its seeds included)
    draws = {plan_sweep(spec, catalog, workers=1, draw=True).cells[0].draws for _ in range(5)}
    assert len(draws | {cell.draws}) > 1


def test_k_over_many_cells_spreads_like_its_law(catalog, toy_spec):
    """Poisson K may be 0 (nothing released); each cell draws its own K."""
    spec = load_spec(_private(toy_spec, selection={**PRIVATE, "distribution": "poisson", "shape": None,
                                                   "mean_trials": 3},
                              axes={"epsilon": [4, 5, 6, 7], "delta": 1e-5, "backbone": ["mlp", "cnn"],
                                    "dataset": ["toy"], "epochs": [2]}, batch_size=[20]), catalog)
    ks = [len(c.draws) for c in plan_sweep(spec, catalog, workers=1, draw=True).cells]
    assert len(set(ks)) > 1


@pytest.mark.parametrize("law", [TrialCount.of("truncated_negative_binomial", 4, 1),
                                 TrialCount.of("truncated_negative_binomial", 6, 2.5),
                                 TrialCount.of("truncated_negative_binomial", 5, 0), TrialCount.of("poisson", 3),
                                 TrialCount.of("geometric", 7)])
def test_k_is_the_inverse_cdf_of_its_law_at_the_uniform(law):
    """K(u) is the smallest k with P(K ≤ k) ≥ u, the CDF summed here from the law's pmf written out
    (truncated negative binomial ∝ C(k+η−1, k)(1−γ)^k for k ≥ 1; logarithmic ∝ (1−γ)^k/k; Poisson)."""
    if math.isinf(law.shape):
        def pmf(k):
            return math.exp(-law.mean + k * math.log(law.mean) - math.lgamma(k + 1))
        first = 0
    else:
        g = law.gamma

        def weight(k):
            if law.shape == 0:
                return (1 - g) ** k / k
            return math.exp(math.lgamma(k + law.shape) - math.lgamma(k + 1) - math.lgamma(law.shape)) * (1 - g) ** k
        total = sum(weight(k) for k in range(1, 4000))

        def pmf(k):
            return weight(k) / total
        first = 1
    cdf, acc = {}, 0.0
    for k in range(first, 200):
        acc += pmf(k)
        cdf[k] = acc
    mean = sum(k * pmf(k) for k in range(first, 400))
    assert mean == pytest.approx(law.mean, rel=1e-6)
    for u in (1e-9, 0.01, 0.2, 0.5, 0.77, 0.95, 0.999):
        k = law.sample(u)
        assert cdf[k] >= u - 1e-12 and (k == first or cdf[k - 1] < u + 1e-12), (u, k)
    with pytest.raises(ValueError):
        law.sample(1.0)
