"""Issue 48: bracketing. An optimum on an edge of the values its cell searched gets the next values
beyond it, along its own line, until it lies inside or a data-independent rule stops it.

A planted objective (deterministic, its optimum known, outside the initial grid on each axis in turn)
drives the production searcher as Ray Tune does; the answer is checked against a brute-force search
of a grid wide enough to contain the optimum, and the rules against the planner's own numbers."""
import math

import pytest

from dptune.platform.sweep.searcher import SweepSearcher
from dptune.search_spaces.bracketing import MIN_BATCH_SIZE, edges, extended, extended_batch_size, line, stale
from sweep_plans import digits_spec, plan_of
from test_proxy import drive   # Ray Tune with one trial at a time

N_DIGITS = 1437   # digits' training set (the planner reads it from the data)


def planted(optimum: tuple[float, float, float]):
    """Accuracy peaked at (C*, B*, η*) in log space: each axis alone decides its own optimum (η on the
    spec's lattice η = 0.25·√(B/32)·m)."""
    c_star, b_star, lr_star = optimum

    def accuracy(config: dict) -> float:
        return 0.9 - sum(0.02 * math.log2(v / s) ** 2 for v, s in
                         ((config["clip_bound"], c_star), (config["batch_size"], b_star),
                          (config["learning_rate"], lr_star)))
    return accuracy


def sweep(value, *, clip_bound, batch_size, multipliers, bracket="on", seeds=(0,)) -> tuple[list[dict], object]:
    plan = plan_of(digits_spec(epsilon=[4.0], batch_size=batch_size, clip_bound=clip_bound, seeds=seeds,
                               learning_rate={"reference": 0.25, "reference_batch_size": 32, "multipliers": multipliers},
                               search={"bracket": bracket}))
    searcher = SweepSearcher(plan, metric="test_accuracy", mode="max")
    return drive(searcher, value), searcher.cells[0]


def best_of(trials: list[dict], value) -> tuple:
    best = max(trials, key=value)
    return best["clip_bound"], best["batch_size"], best["learning_rate"]


def test_edges_read_b_in_the_cell_c_at_its_b_and_eta_at_its_c_and_b():
    tried = [(c, b, m) for c in (1, 2, 3) for b in (10, 20) for m in (1, 2)] + [(9, 40, 5)]
    assert edges(tried, (1, 20, 2)) == [(0, -1), (2, 1)]          # B inside (40 tried), C smallest at B=20
    assert edges(tried, (9, 40, 5)) == [(1, 1)]                   # alone at B=40: its C and η have no range
    assert edges(tried, (2, 10, 1)) == [(1, -1), (2, -1)]


def test_a_neighbour_tried_only_at_etas_on_one_side_of_the_optimums_is_stale():
    tried = [(c, b, m) for c in (0, 1, 2) for b in (0, 1) for m in (0, 1)] + [(1, 1, 2), (1, 1, 3)]
    assert stale(tried, (1, 1, 3)) == [(0, -1), (0, 1), (1, -1)]   # C 0 and 2, B 0 tried at η ≤ 1 only
    assert stale(tried, (1, 1, 1)) == []                          # every neighbour tried at η 1
    assert stale(tried, (2, 0, 0)) == []                          # C 3 and B −1 never tried: edges, not stale
    assert stale([(None, 0, 0), (None, 1, 2)], (None, 0, 3)) == [(1, 1)]


def test_values_beyond_a_grid_follow_its_spacing_and_b_stays_within_16_and_n_over_2():
    assert extended((0.1, 0.3, 1.0), 3) == pytest.approx(1.0 * (1 / 0.3))
    assert extended((0.1, 0.3, 1.0), -2) == pytest.approx(0.1 * (0.1 / 0.3) ** 2)
    assert extended((2.0,), 1) is None
    assert [extended_batch_size((32, 128, 512), i, N_DIGITS) for i in (-2, -1, 3, 4)] == [16, 16, 718, 718]
    assert line((1, 1, 1), 2, 1) == [(1, 1, 2)] and line((1, 1, 1), 0, -1) == [(0, 1, 0), (0, 1, 1), (0, 1, 2)]


@pytest.mark.parametrize("axis,optimum,grid", [
    ("η too small", (0.5, 64, 0.25 * math.sqrt(64 / 32) * 0.5), dict(clip_bound=[0.25, 0.5, 1.0], batch_size=[32, 64],
                                                                   multipliers=[1.0, 2.0, 4.0])),
    ("C too large", (2.0, 64, 0.25 * math.sqrt(64 / 32) * 2), dict(clip_bound=[0.25, 0.5, 1.0], batch_size=[32, 64], multipliers=[1.0, 2.0, 4.0])),
    ("B too large", (0.5, 128, 0.25 * math.sqrt(128 / 32) * 2), dict(clip_bound=[0.25, 0.5, 1.0], batch_size=[32, 64],
                                                                     multipliers=[1.0, 2.0, 4.0])),
])
def test_bracketing_reaches_an_optimum_outside_the_grid_on_each_axis(axis, optimum, grid):
    """The answer equals a brute-force search of a grid wide enough to hold the planted optimum, at a
    fraction of its trials; bracketing ends with the optimum inside ("bracketed")."""
    value = planted(optimum)
    trials, cell = sweep(value, **grid)
    assert cell.bracket.outcome == "bracketed", cell.bracket.record()
    found = best_of(trials, value)
    assert found == pytest.approx(optimum)
    wide = dict(clip_bound=[0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0], batch_size=[16, 32, 64, 128, 256, 512],
                multipliers=[0.25, 0.5, 1.0, 2.0, 4.0, 8.0])
    reference, _ = sweep(value, bracket="off", **wide)
    assert best_of(reference, value) == pytest.approx(found)
    assert len(trials) < len(reference) / 3


def coupled(c_star: float, b_star: int, m_star: float):
    """Accuracy peaked at (C*, B*, m*) whose best B at a given η multiplier m is B*·m/m*: at the too-small
    η multipliers a grid starts from, its best B is too small, and a move along η leaves it behind."""
    def accuracy(config: dict) -> float:
        b = config["batch_size"]
        dm = math.log2(config["learning_rate"] / (0.25 * math.sqrt(b / 32)) / m_star)
        return 0.9 - 0.02 * (math.log2(config["clip_bound"] / c_star) ** 2 + dm ** 2 + (math.log2(b / b_star) - dm) ** 2)
    return accuracy


def test_a_move_along_eta_searches_b_again_where_eta_now_is():
    """Started two η steps too small, the grid's best B is half the optimum's; after η moves, B = 64 is
    stale (tried only at smaller η) and is searched again at the new η. Without that, bracketing declared
    the cell bracketed at B = 32."""
    value = coupled(0.5, 64, 4.0)
    trials, cell = sweep(value, clip_bound=[0.25, 0.5, 1.0], batch_size=[32, 64, 128], multipliers=[0.5, 1.0])
    wide = dict(clip_bound=[0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0], batch_size=[16, 32, 64, 128, 256, 512],
                multipliers=[0.25, 0.5, 1.0, 2.0, 4.0, 8.0])
    reference, _ = sweep(value, bracket="off", **wide)
    assert best_of(reference, value) == pytest.approx((0.5, 64, 0.25 * math.sqrt(2) * 4.0))
    assert best_of(trials, value) == pytest.approx(best_of(reference, value))
    assert len(trials) < len(reference) / 3
    assert cell.bracket.outcome != "bracketed" and "its neighbour was not tried at its η" in cell.bracket.outcome


@pytest.mark.parametrize("optimum_b,grid_b,rule", [(4096, [256, 512], f"B ≤ N/2 ({N_DIGITS // 2})"),
                                                    (4, [32, 64], f"B ≥ {MIN_BATCH_SIZE}")])
def test_a_rule_stops_bracketing_where_it_must_and_is_named(optimum_b, grid_b, rule):
    """B > N/2 (and below 16) cannot be run: bracketing goes to the bound, then stops with the rule."""
    value = planted((0.5, optimum_b, 0.5))
    trials, cell = sweep(value, clip_bound=[0.25, 0.5, 1.0], batch_size=grid_b, multipliers=[0.5, 1.0, 2.0, 4.0])
    bound = N_DIGITS // 2 if optimum_b > 1000 else MIN_BATCH_SIZE
    assert bound in {t["batch_size"] for t in trials} and cell.bracket.stopped.get("B") == rule
    assert rule in cell.bracket.outcome
    assert all(MIN_BATCH_SIZE <= t["batch_size"] <= N_DIGITS // 2 for t in trials)


def test_at_most_max_extensions_per_axis_and_off_means_the_grid_alone():
    value = planted((64.0, 64, 0.5))   # C far beyond the grid's top
    trials, cell = sweep(value, clip_bound=[0.25, 0.5, 1.0], batch_size=[32, 64], multipliers=[1.0, 2.0, 4.0])
    assert cell.bracket.extensions[0] == 2 and cell.bracket.stopped["C"] == "at most 2 extensions"
    assert max(t["clip_bound"] for t in trials) == pytest.approx(4.0)   # 1 → 2 → 4: two extensions
    plain, cell = sweep(value, clip_bound=[0.25, 0.5, 1.0], batch_size=[32, 64], multipliers=[1.0, 2.0, 4.0],
                        bracket="off")
    assert len(plain) == 18 and cell.bracket is None


def test_extensions_run_once_per_seed_and_never_twice():
    value = planted((4.0, 64, 0.5))
    trials, cell = sweep(value, clip_bound=[0.25, 0.5, 1.0], batch_size=[32, 64], multipliers=[1.0, 2.0, 4.0],
                         seeds=(0, 1))
    keys = [(t["clip_bound"], t["batch_size"], t["learning_rate"], t["seed"]) for t in trials]
    assert len(keys) == len(set(keys))
    assert len(trials) == 2 * (18 + cell.bracket.added)


def test_a_sweep_says_per_cell_that_it_bracketed_and_counts_what_it_added(rigged_ray, tmp_path, capsys):
    """Through Ray Tune and the store: the closing lines and optima.csv say "bracketed" with the trials
    added, the progress lines count them beyond the plan, and `dptune status` does too."""
    import io

    import pandas as pd

    import rigged
    from dptune.analysis.report import write_heatmaps
    from dptune.platform.store.results_store import ResultsStore
    from dptune.platform.sweep.driver import run_sweep
    from dptune.platform.sweep.launcher import RunSettings
    from dptune.platform.views.status import read_status

    plan = plan_of(digits_spec(epsilon=[4.0], batch_size=[64], clip_bound=[0.5, 1.0, 2.0], seeds=(0, 1),
                               learning_rate={"reference": 0.25, "reference_batch_size": 64,
                                              "multipliers": [4.0, 8.0]},
                               search={"bracket": "on"}))
    settings = RunSettings(experiment="bracket", storage=str(tmp_path), max_failures=0, verbose=0)
    outcome = run_sweep(plan, settings, trainable=rigged.planted_trainable)   # η* = 0.5: below the grid (1, 2)
    added = outcome.finished - plan.num_trials
    # η×2 then η×1 at the optimum's (C, B); after the first, C = 0.5 and 2 (tried at η×4, ×8 only) at η×1
    # and ×2 (their η×4 is known): six configurations, two seeds each
    assert outcome.errored == 0 and added == 2 * (2 + 4)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert lines[-1].startswith(f"[{outcome.finished}/{plan.num_trials}+{added}]")
    out = io.StringIO()
    write_heatmaps(ResultsStore(settings.paths.store), tmp_path / "analysis", out=out)
    assert f"bracketed (+{added} trials beyond the grid)" in out.getvalue()
    optimum = pd.read_csv(tmp_path / "analysis" / "optima.csv").iloc[0]
    assert optimum["bracketing"] == f"bracketed (+{added} trials beyond the grid)"
    assert (optimum["clip_bound"], optimum["learning_rate"]) == pytest.approx((1.0, 0.5))
    assert f"with {added} trial(s) bracketing or racing added" in read_status(str(settings.paths.root)).render()


def test_a_sweep_killed_in_an_extension_resumes_it_without_running_anything_twice(tmp_path):
    """`dptune sweep` SIGKILLed right after it recorded the first trial bracketing added (the grid has
    two); `dptune resume` restores the extension state: the record settles, every configuration it
    counts is in the store once, and none ran twice."""
    import json

    from dptune.platform.store.results_store import ResultsStore
    from sweep_plans import levers_off
    from test_driver_failure import killed_then_resumed

    spec = {"experiment": "ext", "axes": {"epsilon": [8], "backbone": [{"name": "mlp", "hidden": 16}],
                                          "dataset": ["digits"], "epochs": [1]},
            "clip_bound": [1.0], "batch_size": [256],
            "learning_rate": {"reference": 1.0, "reference_batch_size": 256, "multipliers": [0.125, 0.25]},
            "pruning": {"min_steps": 1, "plateau_tol": 100}, "search": levers_off({"bracket": "on"}),
            "resources": {"cpu": 1}, "failure": {"max_failures": 1}}
    experiment = killed_then_resumed(tmp_path, spec, "trial_recorded@3=kill", lambda folder: None)
    record = json.loads((experiment / "dptune-state" / "bracketing.json").read_text())
    (cell,) = record.values()
    assert cell["settled"] and cell["added"] >= 1
    rows = ResultsStore(str(experiment / "store")).table("trials")
    assert rows["config_id"].is_unique and len(rows) == 2 + cell["added"]
    assert (rows["status"] == "finished").all()
    assert rows["learning_rate"].nunique() == len(rows)   # each an η of its own: the line of η at (C, B)


def test_of_equal_means_the_optimum_is_the_one_the_closing_lines_report():
    """Two configurations with the same seed-mean (small test sets tie): bracketing judges the edges of
    the one the analysis reports — the smallest (C, B, η), the first of equals in its table — not the
    other (a benchmark run reported an edge that bracketing had judged inside, about its tie partner)."""
    plan = plan_of(digits_spec(epsilon=[4.0], batch_size=[32, 64], clip_bound=[0.5, 1.0], multipliers=[1.0, 2.0]))
    cell = SweepSearcher(plan, metric="test_accuracy", mode="max").cells[0]
    cell.finished = {(1, 0, 0): 0.9, (0, 1, 0): 0.9, (0, 0, 0): 0.5, (1, 1, 1): None}
    assert cell.best() == ((0, 1, 0), 0.9)
    # a lower-is-better metric's results reach the cell as scores (negated): its smallest wins
    cell.finished = {key: None if v is None else -v for key, v in cell.finished.items()}
    assert cell.best() == ((0, 0, 0), -0.5)
