"""Issue 48, item 4: `search: {algorithm: gp}` (Optuna's Gaussian-process sampler, as the tool of "On optimal
hyperparameters for DP deep transfer learning" searches) over continuous C and η, `tpe` as the name of today's `optuna`, starting points
(`search.start`) and an earlier sweep's optima (`search.prior`) tried first. A planted objective
(known optimum, between the grid's points) drives the production searcher as Ray Tune does."""
import math
import pickle

import pytest
from ray.tune.search import Searcher

from dptune.platform.store.results_store import ResultsStore, to_json
from dptune.platform.sweep.searcher import SweepSearcher
from dptune.search_spaces import load_spec
from dptune.search_spaces.spec import SpecError
from sweep_plans import digits_spec, plan_of
from test_bracketing import planted
from test_proxy import drive

#: η = 0.25·√(B/32)·m; the optimum's C and η lie between the grid's points (C ∈ {0.25, 1, 4}, m ∈ {0.5, 2, 8}).
OPTIMUM = (2.0, 64, 0.25 * math.sqrt(64 / 32) * 2.5)


def spec(algorithm: str, **search) -> dict:
    return digits_spec(epsilon=[4.0], batch_size=[32, 64, 128], clip_bound=[0.25, 1.0, 4.0],
                       learning_rate={"reference": 0.25, "reference_batch_size": 32, "multipliers": [0.5, 2.0, 8.0]},
                       search={"algorithm": algorithm, "bracket": "off", **search})


def test_gp_finds_an_optimum_between_the_grid_points_that_a_grid_cannot():
    value = planted(OPTIMUM)
    gp = drive(SweepSearcher(plan_of(spec("gp", budget=20)), metric="test_accuracy"), value)
    grid = drive(SweepSearcher(plan_of(spec("grid")), metric="test_accuracy"), value)
    best = max(gp, key=value)
    assert len(gp) == 20 and len(grid) == 27
    assert best["clip_bound"] == pytest.approx(OPTIMUM[0], rel=0.1) and best["batch_size"] == OPTIMUM[1]
    assert best["learning_rate"] == pytest.approx(OPTIMUM[2], rel=0.1)
    assert value(best) > max(map(value, grid)) + 0.01   # the grid's points miss it by a quarter of a step
    assert min(t["clip_bound"] for t in gp) >= 0.25 and max(t["clip_bound"] for t in gp) <= 4.0   # its range


def test_gp_spreads_parallel_proposals_and_is_restorable(tmp_path):
    """Four proposals before any result (the GP sampler's q-batch handling of running trials) are four
    configurations; a searcher saved and restored mid-way goes on with the same study."""
    searcher = SweepSearcher(plan_of(spec("gp", budget=12, startup_trials=2)), metric="test_accuracy")
    value = planted(OPTIMUM)
    for i in range(2):
        config = searcher.suggest(f"s{i}")
        searcher.on_trial_complete(f"s{i}", {"test_accuracy": value(config)})
    running = [searcher.suggest(f"r{i}") for i in range(4)]
    keys = {(c["clip_bound"], c["batch_size"], c["learning_rate"]) for c in running}
    assert len(keys) == 4
    searcher.save(str(tmp_path / "state"))
    restored = SweepSearcher(plan_of(spec("gp", budget=12, startup_trials=2)), metric="test_accuracy")
    restored.restore(str(tmp_path / "state"))
    for i, config in enumerate(running):
        restored.on_trial_complete(f"r{i}", {"test_accuracy": value(config)})
    rest = drive(restored, value)
    assert len(rest) == 12 - 6 and all(c != Searcher.FINISHED for c in rest)


def test_tpe_is_the_name_of_optunas_tpe():
    assert plan_of(spec("tpe", budget=4)).space.search.algorithm == "optuna"


@pytest.mark.parametrize("algorithm", ["grid", "tpe", "gp"])
def test_starting_points_are_tried_first(algorithm):
    start = [{"clip_bound": 4.0, "batch_size": 128, "lr_multiplier": 8.0},
             {"clip_bound": 1.0, "batch_size": 100, "lr_multiplier": 0.5}]   # B = 100 → the nearest, 128
    options = {"budget": 6} if algorithm != "grid" else {}
    searcher = SweepSearcher(plan_of(spec(algorithm, start=start, **options)), metric="test_accuracy")
    first = [searcher.suggest(f"t{i}") for i in range(2)]
    assert [(c["clip_bound"], c["batch_size"], c["lr_multiplier"]) for c in first] == \
        [(4.0, 128, 8.0), (1.0, 128, 0.5)]


def test_an_earlier_sweeps_optima_start_each_cell_at_the_nearest_epsilon(tmp_path):
    """The earlier sweep ran ε = 1 and 8; this one's ε = 2 cell starts at ε = 1's optimum (nearer in
    log), its ε = 8 cell at ε = 8's."""
    plan = plan_of(spec("grid"))
    key = plan.cells[0].cell.key
    store = ResultsStore(str(tmp_path / "earlier" / "store"))
    for eps, best in ((1.0, (0.25, 32, 8.0)), (8.0, (4.0, 64, 0.5))):
        cell = key.replace("eps=4", f"eps={eps:g}")
        for c, b, m, score in ((*best, 0.9), (1.0, 64, 2.0, 0.5)):
            store.write_trial({"trial_id": f"{eps}-{c}-{b}-{m}", "cell": cell, "status": "finished", "epsilon": eps,
                               "clip_bound": c, "batch_size": b, "accuracy": score, "score": score,
                               "config_json": to_json({"lr_multiplier": m})})
    later = digits_spec(epsilon=[2.0, 8.0], batch_size=[32, 64, 128], clip_bound=[0.25, 1.0, 4.0],
                        learning_rate={"reference": 0.25, "reference_batch_size": 32, "multipliers": [0.5, 2.0, 8.0]},
                        search={"bracket": "off", "prior": str(tmp_path / "earlier")})
    searcher = SweepSearcher(plan_of(later), metric="test_accuracy")
    firsts = {}
    for i in range(60):
        config = searcher.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            break
        firsts.setdefault(config["epsilon"], (config["clip_bound"], config["batch_size"], config["lr_multiplier"]))
        searcher.on_trial_complete(f"t{i}", {"test_accuracy": 0.5})
    assert firsts == {2.0: (0.25, 32, 8.0), 8.0: (4.0, 64, 0.5)}


def test_start_and_prior_are_refused_under_private_selection_and_a_prior_without_a_store(tmp_path):
    from dptune.platform.sweep.catalog import trainables_catalog

    private = {**spec("random", start=[{"clip_bound": 1.0, "batch_size": 64, "lr_multiplier": 2.0}]),
               "selection": {"mode": "private", "validation_fraction": 0.2}}
    private["search"].pop("budget", None)
    with pytest.raises(SpecError, match="search.start: selection.mode private draws its K trials"):
        load_spec(private, trainables_catalog())
    with pytest.raises(SpecError, match="search.prior: .* holds no finished trial|cannot be read"):
        load_spec(spec("grid", prior=str(tmp_path / "nothing")), trainables_catalog())
    assert pickle.loads(pickle.dumps(plan_of(spec("gp", budget=3))))   # plans (and their searchers) pickle
