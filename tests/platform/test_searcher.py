"""SweepSearcher: the Ray Tune searcher over a plan (grid, random, Optuna TPE), checked against
configurations written out from the spec and figures computed here (q = B/N, T = ⌈E·N/B⌉, σ from
the accountant, η = η_ref·√(B/B_ref)·m)."""
import itertools
import math

import pytest
from ray.tune.search import Searcher

from accounting_checks import assert_calibrated
from sweep_plans import levers_off

from dptune.trainables.config import check_option
from dptune.platform.sweep.searcher import SweepSearcher
from dptune.search_spaces import Catalog, SpecError, load_spec, plan_sweep

N, EPOCHS, SEARCHED_B = 200, 2, (5, 10, 20, 40)   # B = 100 has T = 4 < min_steps 5; 400 > N


@pytest.fixture
def catalog() -> Catalog:
    """A toy catalog (N = 200, quick calibrations), as in the search-space tests."""
    return Catalog(datasets=("toy",), backbones=("mlp", "cnn"), dataset_size=lambda name: 200,
                   check_trial_option=check_option)


@pytest.fixture
def toy_spec():
    """A valid spec mapping over the toy dataset; keyword arguments replace whole sections (the levers
    a ``search`` does not name are off)."""
    def make(**overrides) -> dict:
        return {"axes": {"epsilon": [1, 4], "delta": 1e-5, "backbone": ["mlp"], "dataset": ["toy"], "epochs": [2]},
                "clip_bound": [0.1, 1, 10], "batch_size": [5, 10, 20, 40, 100, 400],
                "learning_rate": {"reference": 1.0, "reference_batch_size": 20, "multipliers": [0.5, 1, 2]},
                "pruning": {"min_steps": 5, "plateau_tol": 10.0}, **overrides,
                "search": levers_off(overrides.get("search"))}
    return make


def objective(train: dict) -> float:
    """A smooth, deterministic stand-in for accuracy with its optimum at C = 1, B = 20, η×1."""
    return 1.0 - 0.1 * math.log10(train["clip_bound"]) ** 2 - 0.05 * math.log2(train["batch_size"] / 20) ** 2 \
        - 0.02 * math.log2(train["learning_rate"] / math.sqrt(train["batch_size"] / 20)) ** 2


def run(searcher: Searcher, limit: int = 1000, start: int = 0, value=objective) -> list[dict]:
    """Drive a searcher as Ray Tune does with one trial at a time; returns the trial specs."""
    out = []
    for i in range(start, start + limit):
        config = searcher.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            break
        trial = config
        out.append(trial)
        searcher.on_trial_complete(f"t{i}", {"accuracy": value(trial)})
    return out


@pytest.fixture
def optuna_plan(catalog, toy_spec):
    def make(seed=0, seeds=(0,), warm_start=False, epsilon=(1,), budget=12):
        spec = load_spec(toy_spec(axes={"epsilon": list(epsilon), "backbone": "mlp", "dataset": "toy", "epochs": 2},
                                  clip_bound=[0.01, 0.1, 1, 10, 100], seeds=list(seeds),
                                  search={"algorithm": "optuna", "budget": budget, "seed": seed,
                                          "warm_start": warm_start}), catalog)
        return plan_sweep(spec, catalog, workers=1)
    return make


def key(trial: dict) -> tuple:
    return trial["clip_bound"], trial["batch_size"], trial["lr_multiplier"], trial["seed"]


def assert_planned(trial: dict) -> None:
    """q, T, σ, σ√T and η of a trial, computed here from its C, B, ε and multiplier."""
    b = trial["batch_size"]
    q, steps = b / N, math.ceil(EPOCHS * N / b)
    assert (trial["sample_rate"], trial["steps"]) == (q, steps)
    assert_calibrated(trial["noise_multiplier"], trial["epsilon"], 1e-5, q, steps)
    assert trial["noise_sqrt_steps"] == pytest.approx(trial["noise_multiplier"] * math.sqrt(steps))
    assert trial["learning_rate"] == pytest.approx(1.0 * math.sqrt(b / 20) * trial["lr_multiplier"])
    assert trial["cell"] == f"toy/mlp/E=2/delta=1e-05/eps={trial['epsilon']:g}"


def test_grid_searcher_hands_out_every_configuration_once_per_seed_then_finishes(catalog, toy_spec):
    plan = plan_sweep(load_spec(toy_spec(seeds=[0, 1]), catalog), catalog, workers=1)
    expected = sorted(itertools.product([1.0, 4.0], [0.1, 1.0, 10.0], SEARCHED_B, [0.5, 1.0, 2.0], [0, 1]))
    searcher = SweepSearcher(plan, metric="accuracy", clip_equivalence=False)
    trials = run(searcher)
    assert sorted((t["epsilon"], *key(t)) for t in trials) == expected
    assert [t["epsilon"] for t in trials] == sorted(t["epsilon"] for t in trials)   # cell by cell
    for trial in trials:
        assert_planned(trial)
    assert searcher.suggest("again") == Searcher.FINISHED
    chained = SweepSearcher(plan, metric="accuracy")   # clip-equivalence: same trials, each C grid largest first
    assert sorted((t["epsilon"], *key(t)) for t in run(chained)) == expected
    assert chained.suggest("again") == Searcher.FINISHED and chained.equivalents == []


def test_optuna_is_deterministic_for_a_seed_and_proposes_only_pruned_candidates(optuna_plan):
    plan = optuna_plan(seed=3)
    first, second = run(SweepSearcher(plan, metric="accuracy")), run(SweepSearcher(plan, metric="accuracy"))
    assert [key(t) for t in first] == [key(t) for t in second]
    assert len(first) == 12 == plan.num_trials                    # the budget, then FINISHED
    assert len({key(t) for t in first}) == 12                     # repeats are answered, not re-run
    for trial in first:
        assert trial["batch_size"] in SEARCHED_B
        assert trial["clip_bound"] in (0.01, 0.1, 1.0, 10.0, 100.0) and trial["lr_multiplier"] in (0.5, 1.0, 2.0)
        assert_planned(trial)
    other = run(SweepSearcher(optuna_plan(seed=4), metric="accuracy"))
    assert [key(t) for t in other] != [key(t) for t in first]


def test_tpe_uses_the_results(optuna_plan):
    """After its random start, TPE concentrates near the optimum: better than the grid average."""
    plan = optuna_plan(seed=0, budget=30)
    trials = run(SweepSearcher(plan, metric="accuracy"))
    grid = [{"clip_bound": c, "batch_size": b, "learning_rate": math.sqrt(b / 20) * m}
            for c, b, m in itertools.product([0.01, 0.1, 1, 10, 100], SEARCHED_B, [0.5, 1, 2])]
    grid_mean = sum(map(objective, grid)) / len(grid)
    late = [objective(t) for t in trials[15:]]
    assert sum(late) / len(late) > grid_mean
    assert max(objective(t) for t in trials) == pytest.approx(1.0)   # the optimum was found


def test_every_configuration_runs_once_per_seed_and_optuna_sees_the_mean(optuna_plan):
    plan = optuna_plan(seeds=(0, 1), budget=4)
    searcher = SweepSearcher(plan, metric="accuracy")
    trials = run(searcher, value=lambda train: objective(train) + 0.01 * train["seed"])
    assert len(trials) == 8 == plan.num_trials
    assert [t["seed"] for t in trials] == [0, 1] * 4
    assert all(key(a)[:3] == key(b)[:3] for a, b in zip(trials[::2], trials[1::2]))
    best_indices, best_value = searcher.best(0)
    best = max(trials[::2], key=objective)
    assert plan.cells[0].values(best_indices) == key(best)[:3]
    assert best_value == pytest.approx(objective(best) + 0.005)   # the mean over seeds 0 and 1


def test_a_failed_trial_is_told_as_failed(optuna_plan):
    plan = optuna_plan(budget=3)
    searcher = SweepSearcher(plan, metric="accuracy")
    searcher.suggest("a")
    searcher.on_trial_complete("a", None, error=True)
    study = searcher.cells[0].strategy.study
    assert [t.state.name for t in study.trials] == ["FAIL"]
    assert searcher.best(0) is None


def test_save_and_restore_continue_the_same_search(optuna_plan, tmp_path):
    plan = optuna_plan(seed=5)
    uninterrupted = run(SweepSearcher(plan, metric="accuracy"))
    before = SweepSearcher(plan, metric="accuracy")
    head = run(before, limit=5)
    before.save(str(tmp_path / "searcher.pkl"))
    after = SweepSearcher(plan, metric="accuracy")
    after.restore(str(tmp_path / "searcher.pkl"))
    tail = run(after, start=5)
    assert [key(t) for t in head + tail] == [key(t) for t in uninterrupted]


def test_warm_start_begins_at_the_neighbouring_optimum(optuna_plan):
    plan = optuna_plan(epsilon=(1, 4), warm_start=True, budget=8)
    searcher = SweepSearcher(plan, metric="accuracy")
    trials = run(searcher)
    first_cell, second_cell = trials[:8], trials[8:]
    assert {t["cell"] for t in first_cell} == {plan.cells[0].cell.key}
    # the objective is symmetric in log C and log η: of equal values the optimum is the smallest (C, B, η)
    best = max(first_cell, key=lambda t: (objective(t), -t["clip_bound"], -t["batch_size"], -t["learning_rate"]))
    start = second_cell[0]
    assert (start["clip_bound"], second_cell[0]["lr_multiplier"]) == \
        (best["clip_bound"], best["lr_multiplier"])
    nearest = min(plan.cells[1].searched_batch_sizes, key=lambda b: abs(math.log(b / best["batch_size"])))
    assert start["batch_size"] == nearest
    cold = run(SweepSearcher(optuna_plan(epsilon=(1, 4), warm_start=False, budget=8), metric="accuracy"))
    assert [key(t) for t in cold[:8]] == [key(t) for t in first_cell]   # the first cell is unaffected
    assert key(cold[8]) != key(second_cell[0])                          # and TPE alone starts elsewhere


def test_repeats_are_never_trained_twice_and_every_proposal_is_answered(optuna_plan, catalog, toy_spec):
    spec = load_spec(toy_spec(clip_bound=[1], learning_rate={"reference": 1, "reference_batch_size": 20},
                              axes={"epsilon": 1, "backbone": "mlp", "dataset": "toy", "epochs": 2},
                              search={"algorithm": "optuna", "budget": 4}), catalog)
    plan = plan_sweep(spec, catalog, workers=1)
    assert len(plan.cells[0].grid) == 4                            # 1 C × 4 B × 1 η
    searcher = SweepSearcher(plan, metric="accuracy")
    running = [searcher.suggest(f"r{i}") for i in range(4)]        # four trials in flight at once
    assert len({key(c) for c in running}) == 4            # running configurations are not re-proposed
    assert searcher.suggest("r4") == Searcher.FINISHED
    for i, config in enumerate(running):
        searcher.on_trial_complete(f"r{i}", {"accuracy": objective(config)})
    states = {t.state.name for t in searcher.cells[0].strategy.study.trials}
    assert states <= {"COMPLETE", "FAIL"}                          # nothing left dangling in the study

    small = plan_sweep(load_spec(toy_spec(clip_bound=[1], learning_rate={"reference": 1, "reference_batch_size": 20},
                                          axes={"epsilon": 1, "backbone": "mlp", "dataset": "toy", "epochs": 2},
                                          search={"algorithm": "optuna", "budget": 4, "seed": 1}), catalog),
                       catalog, workers=1)
    sequential = run(SweepSearcher(small, metric="accuracy"))
    assert len(sequential) == len({key(t) for t in sequential}) <= 4


def test_a_restored_searcher_hands_out_again_what_the_trial_snapshot_lost(catalog, toy_spec, tmp_path):
    """Issue 23: the searcher's and Ray Tune's snapshots are written one after the other; after a kill
    the searcher can hold trials the restored trial list lacks (lost: handed out again) and trials the
    list holds as ended (reported: Ray Tune will not report them again). Every configuration of the
    plan then ends exactly once, as in an uninterrupted run."""
    from ray.tune.experiment import Trial

    plan = plan_sweep(load_spec(toy_spec(), catalog), catalog, workers=1)
    uninterrupted = sorted(key(t) + (t["epsilon"],) for t in run(SweepSearcher(plan, metric="accuracy",
                                                                               clip_equivalence=False)))
    before = SweepSearcher(plan, metric="accuracy", clip_equivalence=False)
    ended = run(before, limit=4)                                             # t0..t3 reported
    handed = {f"t{i}": before.suggest(f"t{i}") for i in range(4, 8)}         # t4..t7 handed out
    before.save(str(tmp_path / "searcher.pkl"))
    after = SweepSearcher(plan, metric="accuracy", clip_equivalence=False)
    after.restore(str(tmp_path / "searcher.pkl"))
    # Ray Tune's snapshot: t4 ended meanwhile, t5 still running, t6 and t7 lost
    snapshot = []
    for trial_id, status in (("t4", Trial.TERMINATED), ("t5", Trial.PENDING)):
        trial = Trial("dp_trainable", stub=True, trial_id=trial_id, config=handed[trial_id])
        trial.set_status(status)
        trial.update_last_result({"accuracy": objective(handed[trial_id])})
        snapshot.append(trial)
    after.reconcile(snapshot)   # as the store callback, which holds it, does at the first step
    after.reconcile(snapshot)                                                 # once only
    assert after.unrun() > 0
    again = [after.suggest("r0"), after.suggest("r1")]
    assert [key(c) for c in again] == [key(handed["t6"]), key(handed["t7"])]  # lost ones first
    after.on_trial_complete("r0", {"accuracy": objective(again[0])})
    after.on_trial_complete("r1", {"accuracy": objective(again[1])})
    after.on_trial_complete("t5", {"accuracy": objective(handed["t5"])})
    rest = run(after, start=100)
    assert after.unrun() == 0
    total = ended + [handed[t] for t in ("t4", "t5")] + again + rest
    assert sorted(key(t) + (t["epsilon"],) for t in total) == uninterrupted


@pytest.mark.parametrize("lr_scaling,multipliers", [("none", {0.5, 1.0, 2.0}), ("linear", {0.5, 1.0})])
def test_transfer_searches_each_smaller_eps_near_the_previous_best(catalog, toy_spec, lr_scaling, multipliers):
    """search.transfer: the largest ε runs its whole grid first; each smaller ε then runs only the
    configurations within one grid step of the previous cell's best (C = 1, B = 20, η×1 here), with
    η×1 moved to η×(ε/ε_prev) = ×0.5 first under the linear rule; the answer is still the optimum."""
    spec = toy_spec(axes={"epsilon": [1, 2, 4], "delta": 1e-5, "backbone": ["mlp"], "dataset": ["toy"], "epochs": [2]},
                    clip_bound=[0.01, 0.1, 1, 10, 100], search={"transfer": {"radius": 1, "lr_scaling": lr_scaling}})
    plan = plan_sweep(load_spec(spec, catalog), catalog, workers=1)
    searcher = SweepSearcher(plan, metric="accuracy")
    trials = run(searcher)
    by_eps = {e: [t for t in trials if t["epsilon"] == e] for e in (1.0, 2.0, 4.0)}
    assert len(by_eps[4.0]) == 5 * len(SEARCHED_B) * 3
    last_of_4 = max(i for i, t in enumerate(trials) if t["epsilon"] == 4.0)
    assert all(trials.index(t) > last_of_4 for t in by_eps[2.0])   # waits for its source to be done
    expected = set(itertools.product([0.1, 1.0, 10.0], [10, 20, 40], multipliers))
    for eps in (2.0, 1.0):
        assert {(t["clip_bound"], t["batch_size"], t["lr_multiplier"]) for t in by_eps[eps]} == expected
    best = {e: max(ts, key=objective) for e, ts in by_eps.items()}
    assert all((b["clip_bound"], b["batch_size"]) == (1.0, 20) for b in best.values())
    assert searcher.suggest("again") == Searcher.FINISHED


def test_transfer_waits_for_every_result_of_its_source(catalog, toy_spec):
    """With the source cell's last trial still running, the next ε cell hands out nothing; once that
    result is in, it starts near the source's best."""
    spec = toy_spec(axes={"epsilon": [1, 4], "delta": 1e-5, "backbone": ["mlp"], "dataset": ["toy"], "epochs": [2]},
                    clip_bound=[1], search={"transfer": True})   # one C: the whole grid at once (no clip chains)
    plan = plan_sweep(load_spec(spec, catalog), catalog, workers=1)
    searcher = SweepSearcher(plan, metric="accuracy")
    handed = []
    while (config := searcher.suggest(f"t{len(handed)}")) is not None:
        handed.append(config)
    assert {c["epsilon"] for c in handed} == {4.0} and len(handed) == len(SEARCHED_B) * 3
    for i, config in enumerate(handed[:-1]):
        searcher.on_trial_complete(f"t{i}", {"accuracy": objective(config)})
    assert searcher.suggest("waiting") is None          # the last ε = 4 trial is still running
    searcher.on_trial_complete(f"t{len(handed) - 1}", {"accuracy": objective(handed[-1])})
    nxt = searcher.suggest("next")
    assert nxt["epsilon"] == 1.0 and nxt["batch_size"] in (10, 20, 40)


def test_transfer_is_for_grid_search_only(catalog, toy_spec):
    with pytest.raises(SpecError, match="search.transfer: only applies to algorithm grid"):
        load_spec(toy_spec(search={"algorithm": "optuna", "budget": 5, "transfer": True}), catalog)
