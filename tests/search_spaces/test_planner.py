"""plan_sweep: cells, σ and the batch rules against a computation by hand, trial specs that the trainer accepts, parallel
deduplicated calibration through the cache, random sampling, and refusing unrunnable plans."""
import math

import pandas as pd
import pytest

from accounting_checks import assert_calibrated
from dptune.platform.sweep.trial_config import train_options
from dptune.privacy import calibrate_noise, epsilon_spent
from dptune.privacy.cache import clear_memory
from dptune.search_spaces import NoiseRequest, calibrate_many, load_spec, plan_sweep
from dptune.search_spaces.noise_table import cached_noise
from dptune.trainables.config import TrainConfig
from dptune.trainables.training import plan_privacy

N = 200


def test_cells_and_their_batch_plans(catalog, toy_spec):
    spec = load_spec(toy_spec(axes={"epsilon": [1, 4], "backbone": ["mlp", "cnn"], "dataset": "toy", "epochs": 2},
                              pruning={"min_steps": 10, "plateau_tol": 0.3}), catalog)
    plan = plan_sweep(spec, catalog, workers=1)
    keys = [c.cell.key for c in plan]
    assert keys == ["toy/mlp/E=2/delta=1e-05/eps=1", "toy/mlp/E=2/delta=1e-05/eps=4",
                    "toy/cnn/E=2/delta=1e-05/eps=1", "toy/cnn/E=2/delta=1e-05/eps=4"]
    for cell in plan:   # by hand: q = B/N, T = ⌈E·N/B⌉, σ from the accountant, then the two rules
        eps, rows = cell.cell.epsilon, cell.batches.set_index("batch_size")
        assert rows.loc[400, "reason"] == "exceeds_dataset" and not rows.loc[400, "kept"]
        hand = {}
        for b in (5, 10, 20, 40, 100):
            q, t = b / N, math.ceil(2 * N / b)
            assert (rows.loc[b, "sample_rate"], rows.loc[b, "steps"]) == (q, t)
            assert_calibrated(rows.loc[b, "noise_multiplier"], eps, 1e-5, q, t)
            hand[b] = (t, rows.loc[b, "noise_multiplier"] * math.sqrt(t))
        floor = min(s for t, s in hand.values() if t >= 10)
        for b, (t, noise) in hand.items():
            want = "min_steps" if t < 10 else ("off_plateau" if noise > 1.3 * floor else None)
            assert rows.loc[b, "kept"] == (want is None) and (rows.loc[b, "reason"] or None) == want, (eps, b)
            assert rows.loc[b, "noise_sqrt_steps"] == pytest.approx(noise)
        assert cell.batches["searched"].equals(cell.batches["kept"])        # no max_batch_sizes: all kept
    # backbones share σ: it depends on (ε, δ, q, T) only
    pd.testing.assert_frame_equal(plan.cells[0].batches, plan.cells[2].batches)


def test_trial_specs_are_valid_train_configs_with_the_planned_privacy(catalog, toy_spec):
    spec = load_spec(toy_spec(trial={"optimizer": "adam", "clip_fn": "auto_s"}, seeds=[0, 7]), catalog)
    plan = plan_sweep(spec, catalog, workers=1)
    trials = plan.trials()
    cell = plan.cells[0]
    searched = cell.searched_batch_sizes
    assert searched == (5, 10, 20, 40)                     # 100 has T = 4 < min_steps 5; 400 > N
    assert len(trials) == plan.num_trials == 2 * 1 * len(searched) * 3 * 2   # auto_s: one C stands for every C
    for trial in trials:
        train = meta = trial
        cfg = TrainConfig.from_dict(train_options(train)).validate()     # unknown keys would raise here
        assert cfg.optimizer == "adam" and cfg.clip_fn == "auto_s" and cfg.seed in (0, 7)
        privacy = plan_privacy(cfg, N)                     # the trainer's own q, T; σ taken as given
        assert (privacy.sample_rate, privacy.steps) == (meta["sample_rate"], meta["steps"])
        assert privacy.noise_multiplier == meta["noise_multiplier"]
        assert_calibrated(meta["noise_multiplier"], cfg.epsilon, cfg.delta, meta["sample_rate"], meta["steps"])
        assert meta["noise_sqrt_steps"] == pytest.approx(privacy.noise_sqrt_steps)
        assert cfg.learning_rate == pytest.approx(1.0 * math.sqrt(cfg.batch_size / 20) * meta["lr_multiplier"])
        assert cfg.batch_size in searched and cfg.clip_bound in (0.1, 1.0, 10.0)
        assert meta["cell"] == f"toy/mlp/E=2/delta=1e-05/eps={cfg.epsilon:g}"
    configs = {(t["epsilon"], t["clip_bound"], t["batch_size"], t["lr_multiplier"],
                t["seed"]) for t in trials}
    assert len(configs) == len(trials)                     # the grid, without repeats


@pytest.mark.parametrize("limit, searched", [(1, (5,)), (2, (5, 40)), (3, (5, 20, 40)), (4, (5, 10, 20, 40)),
                                             (9, (5, 10, 20, 40))])
def test_max_batch_sizes_searches_b_spread_across_the_plateau(catalog, toy_spec, limit, searched):
    # the smallest kept B (the recommended one) first, then both ends, then evenly spaced ranks
    spec = load_spec(toy_spec(pruning={"min_steps": 5, "plateau_tol": 10.0, "max_batch_sizes": limit}), catalog)
    plan = plan_sweep(spec, catalog, workers=1)
    for cell in plan:
        kept = cell.batches.loc[cell.batches["kept"], "batch_size"].tolist()
        assert kept == [5, 10, 20, 40] and cell.searched_batch_sizes == searched
        assert {t["batch_size"] for t in cell.trials()} == set(searched)


def test_random_search_samples_the_pruned_grid_reproducibly(catalog, toy_spec):
    def sample(seed):
        spec = load_spec(toy_spec(search={"algorithm": "random", "budget": 7, "seed": seed}), catalog)
        plan = plan_sweep(spec, catalog, workers=1)
        return plan, [[(t["clip_bound"], t["batch_size"], t["lr_multiplier"])
                       for t in cell.trials()] for cell in plan]

    plan, first = sample(0)
    _, again = sample(0)
    _, other = sample(1)
    assert first == again and first != other
    for cell, configs in zip(plan, first):
        assert len(configs) == len(set(configs)) == 7 == cell.num_trials
        assert set(configs) <= set(cell.grid)
    assert first[0] != first[1]                            # each cell draws its own sample


def test_calibration_is_deduplicated_parallel_and_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path))
    clear_memory()
    requests = [NoiseRequest(eps, 1e-5, q, math.ceil(1 / q)) for eps in (2.0, 4.0) for q in (0.1, 0.25, 0.5)]
    sigmas = calibrate_many(requests + requests[::-1], workers=2)           # two series, two processes
    assert set(sigmas) == set(requests) and len(sigmas) == 6
    assert (tmp_path / "accounting.sqlite").exists()
    clear_memory()                                                           # the disk level alone now
    for request in requests:
        assert cached_noise(request) == sigmas[request]
    monkeypatch.setenv("DPTUNE_CACHE_DIR", "off")                             # recompute here, no cache
    clear_memory()
    for r in requests:  # a series is warm-started: the same σ as a lone calibration up to its 0.1% tolerance
        alone = calibrate_noise(r.epsilon, r.delta, r.sample_rate, r.steps)
        assert math.isclose(sigmas[r], alone, rel_tol=1e-3)
        assert epsilon_spent(sigmas[r], r.delta, r.sample_rate, r.steps) <= r.epsilon
    clear_memory()


def test_cache_lookup_uses_the_key_calibrate_noise_stores_under(tmp_path, monkeypatch):
    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path))
    clear_memory()
    request = NoiseRequest(3.0, 1e-5, 0.2, 5)
    assert cached_noise(request) is None
    sigma = calibrate_noise(3.0, 1e-5, 0.2, 5)
    assert cached_noise(request) == sigma
    clear_memory()
    assert cached_noise(request) == sigma                   # and from the SQLite file
    clear_memory()


def test_planning_only_datasets_are_refused_before_calibrating(catalog, toy_spec, tmp_path, monkeypatch):
    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path / "cache"))
    spec = load_spec(toy_spec(axes={"epsilon": 1, "backbone": "mlp", "dataset": ["toy", "big"], "epochs": 2},
                              dataset_sizes={"big": 400}, batch_size=[40]), catalog)
    with pytest.raises(ValueError, match="big are not registered"):
        plan_sweep(spec, catalog, workers=1)
    assert not (tmp_path / "cache").exists()                # nothing was calibrated
    plan = plan_sweep(spec, catalog, workers=1, strict=False)
    assert [c.dataset_size for c in plan] == [N, 400] and plan.planning_only_datasets == ("big",)
    with pytest.raises(ValueError, match="not registered"):
        plan.check_runnable()


def test_declared_sizes_of_registered_datasets_are_checked_by_a_strict_plan(catalog, toy_spec, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path / "cache"))
    wrong = load_spec(toy_spec(dataset_sizes={"toy": 150}, batch_size=[40]), catalog)
    with pytest.raises(ValueError, match="dataset_sizes.toy: declared 150 training examples but the data has 200"):
        plan_sweep(wrong, catalog, workers=1)
    assert not (tmp_path / "cache").exists()
    planned = plan_sweep(wrong, catalog, workers=1, strict=False)           # dptune plan: used as declared
    assert planned.cells[0].dataset_size == 150 and planned.declared_sizes == {"toy": 150}
    with pytest.raises(ValueError, match="declared, not read from the data"):
        planned.check_runnable()
    right = plan_sweep(load_spec(toy_spec(dataset_sizes={"toy": 200}, batch_size=[40]), catalog), catalog, workers=1)
    assert right.cells[0].dataset_size == 200 and right.declared_sizes == {}


def test_a_cell_without_batch_sizes_is_refused(catalog, toy_spec):
    spec = load_spec(toy_spec(pruning={"min_steps": 1000}), catalog)
    with pytest.raises(ValueError, match="cell toy/mlp/E=2/delta=1e-05/eps=1 keeps no batch size"):
        plan_sweep(spec, catalog, workers=1)
    plan = plan_sweep(spec, catalog, workers=1, strict=False)
    assert len(plan.empty_cells) == 2 and plan.num_trials == 0


def test_expected_cost_counts_steps_and_examples(catalog, toy_spec):
    spec = load_spec(toy_spec(axes={"epsilon": 1, "backbone": "mlp", "dataset": "toy", "epochs": 2}), catalog)
    plan = plan_sweep(spec, catalog, workers=1)
    steps, examples = plan.expected_cost
    per_clip_and_lr = [(80, 5), (40, 10), (20, 20), (10, 40)]              # (T, B) of the searched B
    assert steps == 9 * sum(t for t, _ in per_clip_and_lr)
    assert examples == 9 * sum(t * b for t, b in per_clip_and_lr) == 9 * 4 * 400


def test_an_infinite_epsilon_is_the_non_private_baseline_of_its_neighbours(catalog, toy_spec):
    """ε = inf on the axis: σ = 0 for every B without calling the accountant, nothing dropped by the
    plateau (σ√T = 0 everywhere), and one C (nothing is clipped)."""
    spec = load_spec(toy_spec(axes={"epsilon": [1, ".inf"], "delta": 1e-5, "backbone": ["mlp"], "dataset": ["toy"],
                                    "epochs": [2]}), catalog)
    private, baseline = plan_sweep(spec, catalog, workers=1).cells
    assert math.isinf(baseline.cell.epsilon) and not baseline.cell.private and private.cell.private
    kept = [r for r in baseline.rows if r["kept"]]
    assert [r["batch_size"] for r in kept] == [5, 10, 20, 40]           # 100: T = 4 < min_steps; 400 > N
    assert all(r["noise_multiplier"] == 0 and r["noise_sqrt_steps"] == 0 for r in kept)
    assert baseline.clip_bounds == (10.0,) and private.clip_bounds == (0.1, 1.0, 10.0)
    assert {t["noise_multiplier"] for t in baseline.trials()} == {0.0}
