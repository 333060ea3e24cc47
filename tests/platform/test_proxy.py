"""Proxy runs (search.proxy, "TAN without a burn"): configurations ranked at (B/k, σ/k, T), the best
one trained once at full scale. Figures checked against values computed here (B' = B/k, σ' = σ·B'/B,
T unchanged, T = ⌈E·N/B⌉), the searcher driven as Ray Tune drives it."""
import math

import pytest
from ray.tune.search import Searcher

from dptune.errors import UserError
from dptune.platform.sweep.searcher import SweepSearcher
from dptune.privacy.schedule import num_steps
from dptune.search_spaces import Catalog, SpecError, load_spec, plan_sweep
from dptune.search_spaces.plan_table import format_plan
from dptune.search_spaces.proxy import MIN_PROXY_SIGMA, proxy_run
from dptune.trainables.config import check_option

N = 200


@pytest.fixture
def catalog() -> Catalog:
    return Catalog(datasets=("toy",), backbones=("mlp",), dataset_size=lambda name: N, check_trial_option=check_option)


def spec(divisor=2, **overrides) -> dict:
    return {"axes": {"epsilon": [0.25, 1], "delta": 1e-5, "backbone": ["mlp"], "dataset": ["toy"], "epochs": [2]},
            "clip_bound": [0.1, 1], "batch_size": [20, 40],
            "learning_rate": {"reference": 1.0, "reference_batch_size": 20, "multipliers": [0.5, 1]},
            "pruning": {"min_steps": 5, "plateau_tol": 10.0},
            "search": {"algorithm": "grid", "proxy": {"batch_divisor": divisor}, "bracket": "off"},
            **overrides}


@pytest.mark.parametrize("batch,sigma,epochs,n,k", [(512, 6.68, 8, 1437, 8), (40, 2.0, 2, 200, 2), (30, 1.5, 3, 200, 4),
                                                     (100, 3.0, 5, 1000, 3)])
def test_a_proxy_keeps_the_noise_on_the_averaged_gradient_and_the_steps(batch, sigma, epochs, n, k):
    steps = math.ceil(epochs * n / batch)
    run = proxy_run(batch, sigma, steps, n, k)
    assert run.batch_size == round(batch / k)
    assert run.noise_multiplier / run.batch_size == pytest.approx(sigma / batch, rel=1e-12)   # σC/B unchanged
    assert run.steps == steps == math.ceil(run.epochs * n / run.batch_size)                  # T unchanged
    assert run.sample_rate == run.batch_size / n


def best_objective(train: dict) -> float:
    """A deterministic stand-in for accuracy, best at C = 1, η multiplier 0.5, B = 20 (the proxies'
    own B is B/k: the objective reads the B they stand for)."""
    b = train.get("full_batch_size", train["batch_size"])
    return 1.0 - abs(math.log10(train["clip_bound"])) - 0.1 * abs(train["lr_multiplier"] - 0.5) - 0.01 * (b == 40)


def drive(searcher: Searcher, objective=best_objective, metric: str = "test_accuracy") -> list[dict]:
    out = []
    for i in range(1000):
        config = searcher.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            return out
        assert config is not None, "nothing runs, yet the searcher waits"
        out.append(config)
        searcher.on_trial_complete(f"t{i}", {metric: objective(config)})
    raise AssertionError("the searcher never finished")


def test_proxy_search_ranks_at_b_over_k_then_trains_the_best_at_full_scale(catalog):
    plan = plan_sweep(load_spec(spec(), catalog), catalog, workers=1)
    trials = drive(SweepSearcher(plan, metric="test_accuracy", clip_equivalence=False))
    for cell in plan.cells:
        mine = [t for t in trials if t["cell"] == cell.cell.key]
        proxies, finals = [t for t in mine if not t.get("final")], [t for t in mine if t.get("final")]
        assert len(proxies) == 2 * 2 * 2 and len(finals) == 1 and mine[-1] is finals[0]   # the answer comes last
        sigma = {int(r["batch_size"]): float(r["noise_multiplier"]) for r in cell.rows}
        for t in proxies:
            b = t["full_batch_size"]
            steps = num_steps(2, N, b)
            assert (t["proxy_divisor"], t["batch_size"], t["steps"]) == (2, b // 2, steps)
            assert t["noise_multiplier"] == pytest.approx(sigma[b] / 2)
            assert t["sample_rate"] == (b // 2) / N and num_steps(t["epochs"], N, t["batch_size"]) == steps
        final = finals[0]
        assert (final["clip_bound"], final["batch_size"], final["lr_multiplier"]) == (1.0, 20, 0.5)
        assert final["noise_multiplier"] == sigma[20] and final["epochs"] == 2 and "proxy_divisor" not in final
    assert plan.num_trials == len(trials)


def test_the_plan_prints_proxy_and_full_scale_compute(catalog):
    plan = plan_sweep(load_spec(spec(), catalog), catalog, workers=1)
    text = format_plan(plan)
    assert "proxy runs (Sander et al." in text and "B=40 → 20" in text and "B=20 → 10" in text
    cell = plan.cells[0]
    # grid (2 C × 2 B × 2 η) at B/2 for the same T, then the best once at full scale (at most B = 40's T·B)
    proxy_examples = sum(num_steps(2, N, b) * b // 2 * 4 for b in (20, 40))
    final_examples = max(num_steps(2, N, b) * b for b in (20, 40))
    assert cell.expected_cost()[1] == proxy_examples and cell.final_cost()[1] == final_examples


def test_a_proxy_whose_sigma_breaks_the_equivalence_is_refused(catalog):
    plain = plan_sweep(load_spec(spec(divisor=1), catalog), catalog, workers=1)
    sigmas = [(float(c.row(b)["noise_multiplier"]), b) for c in plain.cells for b in (20, 40)]

    def lowest(k: int) -> float:   # the smallest proxy σ' = σ·round(B/k)/B of the plan at divisor k
        return min(sigma * round(b / k) / b for sigma, b in sigmas)

    broken = next(k for k in range(2, 21) if lowest(k) < MIN_PROXY_SIGMA)
    fine = broken - 1
    assert fine >= 2 and lowest(fine) >= MIN_PROXY_SIGMA
    plan_sweep(load_spec(spec(divisor=fine), catalog), catalog, workers=1)   # σ/k at or above the limit: runs
    with pytest.raises(UserError, match=r"eps=1: at B = \d+ the proxy's σ' = [0-9.]+ \(at B' = \d+\) is below.*batch_divisor"):
        plan_sweep(load_spec(spec(divisor=broken), catalog), catalog, workers=1)


def test_proxy_options_are_checked_before_anything_runs(catalog):
    with pytest.raises(SpecError, match=r"search.proxy.batch_divisor"):
        load_spec(spec(divisor=0), catalog)
    with pytest.raises(SpecError, match=r"search.proxy.batch_divisor: required"):
        load_spec({**spec(), "search": {"algorithm": "grid", "proxy": {}}}, catalog)
    with pytest.raises(SpecError, match=r"search.proxy"):
        load_spec({**spec(), "selection": {"mode": "private", "validation_fraction": 0.2}}, catalog)


def test_a_proxy_sweep_stores_labelled_proxies_and_the_full_scale_answer(local_ray, tmp_path):
    from accounting_checks import assert_calibrated
    from sweep_plans import digits_spec, plan_of

    from dptune.platform.sweep.launcher import RunSettings
    from dptune.platform.store.results_store import ResultsStore
    from dptune.platform.sweep.driver import run_sweep

    plan = plan_of(digits_spec(epsilon=2.0, batch_size=[200, 400], clip_bound=(0.5, 2.0), epochs=2,
                               model_options={"hidden": 32}, search={"algorithm": "grid", "proxy": {"batch_divisor": 2}}))
    settings = RunSettings(experiment="proxy", storage=str(tmp_path), max_failures=0)
    outcome = run_sweep(plan, settings)
    assert (outcome.errored, outcome.unrun) == (0, 0)
    rows = ResultsStore(settings.paths.store).table("trials")
    # 2 C × 2 B proxies (a smaller C whose larger C clipped everything is recorded, not trained, and
    # stays a proxy) and the answer; every Ray trial but the answer is a proxy
    proxies, answer = rows[rows.status == "proxy"], rows[rows.status == "finished"]
    assert len(proxies) == 4 and len(answer) == 1 and outcome.finished == 1 + proxies.equivalent_to.isna().sum()
    n = 1437
    for row in proxies.itertuples():
        b = row.full_batch_size
        assert (row.proxy_divisor, row.batch_size, row.steps) == (2, b // 2, math.ceil(2 * n / b))
        assert row.epsilon_spent > row.epsilon   # its own ε: σ/2 spends more than the cell's
    final = answer.iloc[0]
    best = proxies[proxies.accuracy == proxies.accuracy.max()]   # the proxies' best (C, B): the answer's
    assert bool(final.final) and (final.clip_bound, final.batch_size) in set(zip(best.clip_bound, best.full_batch_size))
    q, steps = final.batch_size / n, math.ceil(2 * n / final.batch_size)
    assert (final.sample_rate, final.steps) == (pytest.approx(q), steps)
    assert_calibrated(final.noise_multiplier, 2.0, 1e-5, q, steps)
    assert final.epsilon_spent <= 2.0
    from dptune.analysis.results import Sweep

    # the analysis has one cell: proxies (their own B and epochs) are not cells of their own; its
    # optimum is the answer, not a proxy
    optima = Sweep.from_frame(rows).optima()
    assert optima["cell_name"].tolist() == ["digits · mlp[hidden=32] · ε=2 · 2 epochs"]
    assert (optima.clip_bound[0], optima.batch_size[0], optima.accuracy[0]) == \
        (final.clip_bound, final.batch_size, final.accuracy)


def test_auto_divisor_is_per_batch_size_the_largest_power_of_two_in_the_measured_region():
    """``batch_divisor: auto``: per B the k in {1, 2, 4, 8, 16} found by brute force here (σ·round(B/k)/B
    ≥ MIN_PROXY_SIGMA and round(B/k) ≥ 16); a B left at k = 1 runs at full scale as an ordinary trial,
    and when the best configuration is such a B no full-scale answer run repeats it."""
    from dptune.search_spaces.proxy import MIN_AUTO_PROXY_BATCH

    n = 4000
    catalog = Catalog(datasets=("toy",), backbones=("mlp",), dataset_size=lambda name: n, check_trial_option=check_option)
    plan = plan_sweep(load_spec(spec(divisor="auto", axes={"epsilon": [1, 4], "delta": 1e-5, "backbone": ["mlp"],
                                                           "dataset": ["toy"], "epochs": [8]},
                                     batch_size=[64, 1024], clip_bound=[1]), catalog), catalog, workers=1)
    expected = {}
    for cell in plan.cells:
        for b in (64, 1024):
            sigma = float(cell.row(b)["noise_multiplier"])
            expected[cell.cell.epsilon, b] = max(k for k in (1, 2, 4, 8, 16)
                                                 if k == 1 or (round(b / k) >= MIN_AUTO_PROXY_BATCH
                                                               and sigma * round(b / k) / b >= MIN_PROXY_SIGMA))
    assert expected[1.0, 1024] >= 4 and expected[4.0, 64] == 1   # both kinds occur in this plan
    trials = drive(SweepSearcher(plan, metric="test_accuracy", clip_equivalence=False),
                   lambda t: -t.get("full_batch_size", t["batch_size"]))   # the smaller B is better
    for t in trials:
        b = t.get("full_batch_size", t["batch_size"])
        k = expected[t["epsilon"], b]
        if t.get("final"):
            assert k > 1 and t["batch_size"] == b and "proxy_divisor" not in t
        elif k == 1:
            assert "proxy_divisor" not in t and t["batch_size"] == b   # full scale: an ordinary trial
        else:
            assert (t["proxy_divisor"], t["batch_size"]) == (k, round(b / k))
            cell = next(c for c in plan.cells if c.cell.epsilon == t["epsilon"])
            assert t["noise_multiplier"] == pytest.approx(float(cell.row(b)["noise_multiplier"]) * round(b / k) / b)
    finals = {t["epsilon"] for t in trials if t.get("final")}
    # the objective prefers B = 64: at ε = 4 it ran at full scale already (no answer run); at ε = 1 it was a proxy
    assert finals == {e for e in (1.0, 4.0) if expected[e, 64] > 1}
    assert "B=64 at full scale" in format_plan(plan)


def test_transfer_starts_while_its_source_trains_its_answer(catalog):
    """With proxies, the next ε cell needs its source's search results, not its full-scale answer
    run: with ε = 1's answer run handed out and never ending, ε = 0.25 is still searched."""
    plan = plan_sweep(load_spec(spec(search={"algorithm": "grid", "proxy": {"batch_divisor": 2}, "transfer": True,
                                             "bracket": "off"}),
                                catalog), catalog, workers=1)
    searcher = SweepSearcher(plan, metric="test_accuracy", clip_equivalence=False)
    handed = []
    for i in range(100):
        config = searcher.suggest(f"t{i}")
        if config is None or config == Searcher.FINISHED:
            break
        handed.append(config)
        if not (config.get("final") and config["epsilon"] == 1.0):   # ε = 1's answer keeps running
            searcher.on_trial_complete(f"t{i}", {"test_accuracy": best_objective(config)})
    first_small = next(i for i, t in enumerate(handed) if t["epsilon"] == 0.25)
    assert all(t["epsilon"] == 1.0 and not t.get("final") for t in handed[:first_small])   # its source's search first
    assert sum(1 for t in handed if t["epsilon"] == 0.25 and not t.get("final")) > 1
    assert any(t.get("final") and t["epsilon"] == 1.0 for t in handed)
