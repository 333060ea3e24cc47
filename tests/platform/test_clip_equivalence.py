"""Clip-equivalent trials are not trained twice (issue 12, item 6).

With flat clipping and ĝ normalised by B·C, a run that clipped every example at every step follows
the same trajectory for every smaller C. The searcher runs each (B, η) C grid largest first; once a
configuration was fully clipped in every seed, the smaller C are recorded as equivalent.
"""
import math

import pytest
from ray.tune.search import Searcher

from dptune.trainables.config import check_option
from dptune.platform.sweep.searcher import SweepSearcher, chained
from dptune.search_spaces import Catalog, load_spec, plan_sweep
from dptune.platform.sweep.trial_config import train_config
from dptune.trainables.config import TrainConfig
from dptune.trainables.training import train
from sweep_plans import levers_off


@pytest.fixture
def catalog():
    return Catalog(datasets=("toy",), backbones=("mlp",), dataset_size=lambda name: 200,
                   check_trial_option=check_option)


def plan_of(catalog, seeds=(0,), **trial):
    spec = {"axes": {"epsilon": 1, "backbone": "mlp", "dataset": "toy", "epochs": 2},
            "clip_bound": [0.01, 0.1, 1, 10], "batch_size": [10, 20], "pruning": {"min_steps": 5, "plateau_tol": 10},
            "learning_rate": {"reference": 1.0, "reference_batch_size": 20, "multipliers": [1, 2]},
            "seeds": list(seeds), "trial": trial, "search": levers_off()}
    return plan_sweep(load_spec(spec, catalog), catalog, workers=1)


def drive(searcher, fully_clipped_at):
    """Run trials one at a time; a trial reports fully clipped iff its C <= fully_clipped_at[(B, m)]."""
    handed = []
    i = 0
    while (config := searcher.suggest(f"t{i}")) != Searcher.FINISHED:
        assert config is not None          # sequential: never waiting
        spec = config
        b, m, c = spec["batch_size"], spec["lr_multiplier"], spec["clip_bound"]
        handed.append((b, m, c, spec["seed"]))
        full = int(c <= fully_clipped_at.get((b, m), 0))
        searcher.on_trial_complete(f"t{i}", {"accuracy": 0.5, "fully_clipped": full, "step": 40, "steps": 40})
        i += 1
    return handed


def test_smaller_clips_of_a_fully_clipped_trial_are_recorded_not_trained(catalog):
    plan = plan_of(catalog, seeds=(0, 1))
    searcher = SweepSearcher(plan, metric="accuracy")
    handed = drive(searcher, {(10, 1.0): 1.0, (20, 2.0): 10.0})
    # (10, ×1): C = 10 not fully clipped, C = 1 fully clipped → 0.1 and 0.01 equivalent;
    # (20, ×2): C = 10 fully clipped → 1, 0.1, 0.01 equivalent; the two other chains run every C
    trained = {(b, m, c) for b, m, c, _ in handed}
    assert (10, 1.0, 0.1) not in trained and (10, 1.0, 0.01) not in trained and (10, 1.0, 1.0) in trained
    assert not {(20, 2.0, c) for c in (1.0, 0.1, 0.01)} & trained and (20, 2.0, 10.0) in trained
    assert len(handed) == (16 - 5) * 2
    eq = {(e["config"]["batch_size"], e["config"]["lr_multiplier"], e["config"]["clip_bound"],
           e["config"]["seed"]): e["source"] for e in searcher.equivalents}
    assert set(eq) == {(10, 1.0, c, s) for c in (0.1, 0.01) for s in (0, 1)} | \
        {(20, 2.0, c, s) for c in (1.0, 0.1, 0.01) for s in (0, 1)}
    for (b, m, c, s), source in eq.items():    # the source is the same seed's trial at the fully clipped C
        i = int(source[1:])
        assert handed[i][0:2] == (b, m) and handed[i][3] == s and handed[i][2] == (1.0 if b == 10 else 10.0)
    for (b, m, c) in trained:                  # every C of a chain runs largest first
        assert all((b, m, bigger) in trained for bigger in (0.01, 0.1, 1.0, 10.0) if bigger > c)


def test_one_seed_not_fully_clipped_keeps_training(catalog):
    plan = plan_of(catalog, seeds=(0, 1))
    searcher = SweepSearcher(plan, metric="accuracy")
    i = 0
    while (config := searcher.suggest(f"t{i}")) != Searcher.FINISHED:
        seed = config["seed"]
        searcher.on_trial_complete(f"t{i}", {"accuracy": 0.5, "fully_clipped": int(seed == 0), "step": 4, "steps": 4})
        i += 1
    assert i == 32 and searcher.equivalents == []


def test_a_chain_waits_for_its_larger_clip_and_other_chains_go_on(catalog):
    plan = plan_of(catalog)
    searcher = SweepSearcher(plan, metric="accuracy")
    running = [searcher.suggest(f"r{i}") for i in range(4)]          # the largest C of each of the 4 chains
    assert all(c["clip_bound"] == 10.0 for c in running)
    assert searcher.suggest("r4") is None                           # every chain waits: not FINISHED
    searcher.on_trial_complete("r0", {"accuracy": 0.5, "fully_clipped": 1, "step": 40, "steps": 40})
    assert searcher.suggest("r5") is None and len(searcher.equivalents) == 3
    searcher.on_trial_complete("r1", {"accuracy": 0.5, "fully_clipped": 0, "step": 40, "steps": 40})
    assert searcher.suggest("r6")["clip_bound"] == 1.0


def test_auto_s_and_stopped_trials_are_not_chained(catalog):
    plan = plan_of(catalog, clip_fn="auto_s")
    assert not chained(plan, 0)
    searcher = SweepSearcher(plan_of(catalog), metric="accuracy")
    config = searcher.suggest("a")
    searcher.on_trial_complete("a", {"accuracy": 0.3, "fully_clipped": 1, "step": 13, "steps": 40})  # stopped early
    assert searcher.equivalents == []


def test_fully_clipped_training_is_the_same_for_every_smaller_clip():
    """The premise, on the real trainer: at a C below every per-sample norm, results do not depend on C."""
    runs = []
    for c in (0.03, 0.01):
        cfg = TrainConfig(dataset="digits", model="cnn", epsilon=0.5, epochs=2, batch_size=128, learning_rate=0.002,
                          clip_bound=c, optimizer="adam", device="cpu")
        runs.append(train(cfg, progress=False))
    assert all(h["clipped_fraction"] == 1.0 for run in runs for h in run)
    assert runs[0][-1]["test_accuracy"] == runs[1][-1]["test_accuracy"]
    assert math.isclose(runs[0][-1]["test_loss"], runs[1][-1]["test_loss"], rel_tol=1e-6)


def test_a_sweep_stores_equivalent_trials_with_their_source_results(tmp_path):
    """Real Ray, real trainer: C = 0.03 clips every example at every step, so C = 0.01 is recorded
    from it, not trained; its stored accuracy equals training C = 0.01 for real."""
    import ray

    from dptune.platform.sweep.catalog import trainables_catalog
    from dptune.platform.sweep.launcher import RunSettings
    from dptune.platform.store.results_store import ResultsStore
    from dptune.platform.sweep.driver import run_sweep

    spec = {"axes": {"epsilon": 0.5, "backbone": "cnn", "dataset": "digits", "epochs": 2},
            "clip_bound": [0.01, 0.03], "batch_size": [128], "pruning": {"min_steps": 20, "max_batch_sizes": 1},
            "learning_rate": {"reference": 0.002, "reference_batch_size": 128}, "trial": {"optimizer": "adam"},
            "search": levers_off()}
    plan = plan_sweep(load_spec(spec, trainables_catalog()), trainables_catalog(), workers=1)
    settings = RunSettings(experiment="eq", storage=str(tmp_path), max_failures=0, verbose=0)
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    try:
        run_sweep(plan, settings, out=open("/dev/null", "w"))
    finally:
        ray.shutdown()
    rows = ResultsStore(settings.paths.store).table("trials").set_index("clip_bound")
    assert list(rows.status.sort_index()) == ["equivalent", "finished"]
    source, eq = rows.loc[0.03], rows.loc[0.01]
    assert eq.equivalent_to == source.trial_id and eq.clip_equivalence_nonprivate
    assert (eq.accuracy, eq.epsilon_spent, eq.steps) == (source.accuracy, source.epsilon_spent, source.steps)
    real = train(train_config(plan.cells[0].trial_config(0.01, 128, 1.0, 0)), progress=False)[-1]
    assert real["test_accuracy"] == eq.accuracy
    epochs = ResultsStore(settings.paths.store).table("epochs")
    assert sorted(epochs[epochs.trial_id == eq.trial_id].epoch) == [1, 2]


def test_under_auto_s_the_planner_collapses_the_clip_axis_and_says_so(catalog):
    flat, auto = plan_of(catalog), plan_of(catalog, clip_fn="auto_s")
    assert flat.notes == [] and len(flat.cells[0].grid) == 16
    assert auto.cells[0].clip_bounds == (10.0,) and len(auto.cells[0].grid) == 4 and auto.num_trials == 4
    assert "collapsed to C = 10" in auto.notes[0] and "auto_s" in auto.notes[0]
    handed = drive(SweepSearcher(auto, metric="accuracy"), {})
    assert {c for _, _, c, _ in handed} == {10.0} and len(handed) == 4


def test_auto_s_update_does_not_depend_on_the_clip():
    """The premise of the collapse, on the real trainer: two C, same trajectory under AUTO-S."""
    runs = [train(TrainConfig(dataset="digits", model="mlp", epsilon=2.0, epochs=1, batch_size=128, learning_rate=1.0,
                              clip_bound=c, clip_fn="auto_s", model_options={"hidden": 16}, device="cpu"),
                  progress=False)[-1] for c in (0.1, 10.0)]
    assert runs[0]["test_accuracy"] == runs[1]["test_accuracy"] and \
        math.isclose(runs[0]["test_loss"], runs[1]["test_loss"], rel_tol=1e-5)


def test_an_equivalent_of_a_full_scale_run_beside_proxies_is_stored(tmp_path):
    """Beside proxy runs the store reads ``proxy_divisor`` as a nullable integer column, so the
    full-scale source's value is pandas' NA: its equivalent must still be written (Arrow refuses NA)."""
    from dptune.platform.sweep.equivalence import EquivalenceLog, write_equivalent_rows
    from dptune.platform.store.layout import ExperimentPaths
    from dptune.platform.store.results_store import ResultsStore
    import pandas as pd

    paths = ExperimentPaths(str(tmp_path / "exp"))
    store = ResultsStore(paths.store)
    base = {"experiment": "e", "cell": "c", "clip_bound": 1.0, "batch_size": 64, "learning_rate": 0.1,
            "accuracy": 0.7, "epsilon": 1.0}
    store.write_trial({**base, "trial_id": "proxy", "status": "proxy", "proxy_divisor": 2, "full_batch_size": 64},
                      [{"epoch": 1, "accuracy": 0.6}])
    store.write_trial({**base, "trial_id": "full", "status": "finished", "proxy_divisor": None,
                       "full_batch_size": None}, [{"epoch": 1, "accuracy": 0.7}])
    EquivalenceLog(paths)([{"source": "full", "config": {"clip_bound": 0.1, "batch_size": 64, "learning_rate": 0.1,
                                                         "cell": "c", "seed": 0}}])
    assert write_equivalent_rows(paths) == 1
    rows = ResultsStore(paths.store).table("trials").set_index("trial_id")
    eq = rows.loc["full-C0.1"]
    assert eq.status == "equivalent" and eq.clip_bound == 0.1 and eq.accuracy == 0.7
    assert pd.isna(eq.proxy_divisor)
