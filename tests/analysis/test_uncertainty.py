"""Issue 25, item 1: error bars on a sweep's answer — the settings a paired one-sided t-test over
seeds cannot tell from a cell's best, the interval of the best's mean, between-cell statements on the
optimal C, and one line when a single seed cannot tell. Checked against hand-computed t statistics and
planted answers; the test's error rate under a planted tie is measured by simulation."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dptune.analysis.report import analyse, optimum_lines
from dptune.analysis.results import Sweep
from dptune.analysis.uncertainty import (ALPHA, SINGLE_SEED, cell_paired, compare_optima, indistinguishable,
                                         optimum_intervals, per_seed, with_error_bars)
from dptune.analysis import figures
from dptune.platform.store.results_store import ResultsStore


def trials(accuracies: dict, epsilon: float = 1.0, epochs: int = 2) -> list[dict]:
    """Rows of one cell: {(C, B, η): [accuracy per seed]}."""
    rows = []
    for (c, b, lr), values in accuracies.items():
        for seed, acc in enumerate(values):
            rows.append({"trial_id": f"e{epsilon}-E{epochs}-{c}-{b}-{lr}-{seed}", "status": "finished",
                         "backbone": "mlp", "dataset": "digits", "epsilon": epsilon, "epochs": epochs,
                         "clip_bound": c, "batch_size": b,
                         "learning_rate": lr, "seed": seed, "private": True, "accuracy": acc})
    return rows


def planted(means: dict, seeds: int, rng: np.random.Generator, shared: float = 0.05, own: float = 0.004) -> dict:
    """Per setting, accuracies = its mean + a seed effect shared by every setting (common random
    numbers) + a small effect of its own."""
    seed_effect = rng.normal(0, shared, seeds)
    return {k: list(m + seed_effect + rng.normal(0, own, seeds)) for k, m in means.items()}


def test_p_values_are_the_paired_one_sided_t_test_times_the_settings_compared():
    acc = {(1.0, 64, 1.0): [0.80, 0.84, 0.78, 0.82], (0.1, 64, 1.0): [0.79, 0.80, 0.77, 0.80],
           (10.0, 64, 1.0): [0.81, 0.83, 0.79, 0.80]}
    sets = indistinguishable(per_seed(Sweep.from_frame(pd.DataFrame(trials(acc))).trials))
    best = np.array(acc[(1.0, 64, 1.0)])
    for key in [(0.1, 64, 1.0), (10.0, 64, 1.0)]:
        d = best - np.array(acc[key])
        t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
        row = sets[sets.clip_bound == key[0]].iloc[0]
        assert row.p_value == pytest.approx(min(1.0, 3 * (1 - stats.t.cdf(t, len(d) - 1))), rel=1e-9)   # K = 3
        assert row.indistinguishable == (row.p_value >= ALPHA)
    assert sets[sets.best].clip_bound.tolist() == [1.0]


def test_a_planted_tie_is_kept_and_a_planted_gap_excluded_thanks_to_pairing():
    """Seed-to-seed spread (sd 5 points) ten times the gap (2 points): unpaired, the gap could not be
    seen with five seeds; paired, it is."""
    rng = np.random.default_rng(0)
    means = {(1.0, 64, 1.0): 0.80, (2.0, 64, 1.0): 0.80, (0.1, 64, 1.0): 0.78}
    sweep = Sweep.from_frame(pd.DataFrame(trials(planted(means, 5, rng))))
    sets = indistinguishable(per_seed(sweep.trials)).set_index("clip_bound")
    assert sets.loc[0.1, "indistinguishable"] == False  # noqa: E712
    assert sets.loc[1.0, "indistinguishable"] and sets.loc[2.0, "indistinguishable"]
    unpaired = stats.ttest_ind(*(per_seed(sweep.trials).xs(c, level="clip_bound").iloc[0] for c in (1.0, 0.1)))
    assert unpaired.pvalue > ALPHA


@pytest.mark.parametrize("settings, cells", [(2, 600), (5, 200), (20, 60)])
def test_on_cells_of_equal_settings_at_most_alpha_of_the_statements_are_false(settings, cells):
    """Null cells (every setting equally good, three seeds, common random numbers): the best is the
    largest of K noisy means, so an uncorrected test at α calls a setting "distinguishable" from it in
    0.10 (K = 2), 0.14 (K = 5) and 0.22 (K = 20) of the statements; corrected (× K) at most α. The
    bound is α plus three binomial standard errors over the statements (K − 1 per cell)."""
    rng = np.random.default_rng(settings)
    rows = [row for cell in range(cells)
            for row in trials(planted({(float(c), 64, 1.0): 0.8 for c in range(1, settings + 1)}, 3, rng), float(cell))]
    sets = indistinguishable(per_seed(Sweep.from_frame(pd.DataFrame(rows)).trials))
    statements = sets[~sets.best]
    assert len(statements) == cells * (settings - 1)
    false_rate = 1 - statements.indistinguishable.mean()
    assert false_rate <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / len(statements)), false_rate


def secure_rows(accuracies: dict, cell: float = 1.0) -> list[dict]:
    """Rows of one cell run with secure randomness: {(C, B, η): {seed: accuracy}}."""
    return [{**row, "seed": seed, "accuracy": acc, "randomness": "secure",
             "trial_id": f"{row['trial_id']}-s{seed}"}
            for key, values in accuracies.items() for seed, acc in values.items()
            for row in trials({key: [acc]}, cell)]


def test_under_secure_randomness_the_p_values_are_welchs():
    """A secure run's seed fixes none of its noise: settings are compared unpaired, each on its own runs
    (the third shares no seed with the best, so a paired test has none), by Welch's t computed here."""
    acc = {(1.0, 64, 1.0): {0: 0.80, 1: 0.84, 2: 0.78, 3: 0.82, 4: 0.83},
           (0.1, 64, 1.0): {0: 0.70, 1: 0.76, 2: 0.74},
           (10.0, 64, 1.0): {7: 0.79, 8: 0.75, 9: 0.77, 10: 0.72}}
    sweep = Sweep.from_frame(pd.DataFrame(secure_rows(acc)))
    table = per_seed(sweep.trials)
    sets = indistinguishable(table, paired=cell_paired(sweep.trials))
    best = np.array(list(acc[(1.0, 64, 1.0)].values()))
    for key in [(0.1, 64, 1.0), (10.0, 64, 1.0)]:
        other = np.array(list(acc[key].values()))
        va, vb = best.var(ddof=1) / len(best), other.var(ddof=1) / len(other)
        t = (best.mean() - other.mean()) / math.sqrt(va + vb)
        df = (va + vb) ** 2 / (va ** 2 / (len(best) - 1) + vb ** 2 / (len(other) - 1))
        row = sets[sets.clip_bound == key[0]].iloc[0]
        assert row.p_value == pytest.approx(min(1.0, 3 * stats.t.sf(t, df)), rel=1e-9)   # K = 3
    assert math.isnan(indistinguishable(table).set_index("clip_bound").loc[10.0, "p_value"])   # paired: no test


def test_on_secure_cells_of_equal_settings_at_most_alpha_of_the_statements_are_false():
    """Null cells under secure randomness (every run an independent draw, three seeds, five settings):
    Welch's test × K keeps the false statements at most α (uncorrected it is 0.13 here)."""
    rng = np.random.default_rng(3)
    cells, settings = 300, 5
    rows = [row for cell in range(cells)
            for row in secure_rows({(float(c), 64, 1.0): dict(enumerate(0.8 + rng.normal(0, 0.02, 3)))
                                    for c in range(1, settings + 1)}, float(cell))]
    sweep = Sweep.from_frame(pd.DataFrame(rows))
    sets = indistinguishable(per_seed(sweep.trials), paired=cell_paired(sweep.trials))
    statements = sets[~sets.best]
    assert len(statements) == cells * (settings - 1)
    false_rate = 1 - statements.indistinguishable.mean()
    assert false_rate <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / len(statements)), false_rate


def test_an_accuracy_interval_stays_inside_zero_and_one():
    """Issue 33, item 7: three seeds of a noisy cell near the ceiling (0.98, 0.99, 0.5) give a t-interval
    past 1; the interval of an accuracy is cut to [0, 1] (its mean lies there, so coverage is kept)."""
    frame = pd.DataFrame([{**row, "metric": "test_accuracy"} for row in
                          trials({(1.0, 64, 1.0): [0.98, 0.99, 0.5], (3.0, 64, 1.0): [0.2, 0.1, 0.15]}, 1.0)])
    sweep = Sweep.from_frame(frame)
    table = per_seed(sweep.trials)
    values = np.array([0.98, 0.99, 0.5])
    half = stats.t.ppf(1 - ALPHA / 2, 2) * values.std(ddof=1) / math.sqrt(3)
    assert values.mean() + half > 1 and values.mean() - half > 0          # the raw interval leaves [0, 1]
    raw = optimum_intervals(indistinguishable(table), table).iloc[0]
    assert raw.accuracy_high == pytest.approx(values.mean() + half)
    _, optima, _ = with_error_bars(sweep, sweep.heatmap_table(), sweep.optima())
    row = optima.dropna(subset=["accuracy_low"]).iloc[0]
    assert row.accuracy_high == 1.0 and row.accuracy_low == pytest.approx(values.mean() - half)
    # a noisy selection score is not bounded: its interval is left as it is
    score = Sweep.from_frame(frame.assign(metric="selection_score"))
    _, optima, _ = with_error_bars(score, score.heatmap_table(), score.optima())
    assert optima.dropna(subset=["accuracy_low"]).iloc[0].accuracy_high == pytest.approx(values.mean() + half)


def test_the_fixed_setting_line_says_whether_eta_was_tuned():
    """Issue 33, item 3: "η tuned per cell" only where η was searched (some (C, B) ran at several η)."""
    from dptune.analysis.uncertainty import fixed_setting_lines

    rng = np.random.default_rng(3)
    best = {(1.0, 64, 1.0): 0.9, (1.0, 128, 1.0): 0.7}
    for extra, words in [({}, "(η not tuned: one η per B)"), ({(1.0, 128, 2.0): 0.72}, "(η tuned per cell)")]:
        frame = pd.DataFrame(trials(planted({**best, **extra}, 4, rng)))
        sweep = Sweep.from_frame(frame)
        heatmap, _, _ = with_error_bars(sweep, sweep.heatmap_table(), sweep.optima())
        setting, cost = sweep.fixed_setting_cost(1.0, 128)
        (line,) = fixed_setting_lines(heatmap, cost, setting)
        assert line.startswith(f"fixed setting C=1, B=128 {words}: costs") and sweep.eta_tuned() == bool(extra)


def test_interval_of_the_best_and_between_cell_statements():
    rng = np.random.default_rng(2)
    grid = [0.1, 1.0, 10.0]
    small_eps = {(c, 64, 1.0): 0.80 - (0.10 if c != 10.0 else 0) for c in grid}   # optimum C = 10
    large_eps = {(c, 64, 1.0): 0.90 - (0.10 if c != 0.1 else 0) for c in grid}    # optimum C = 0.1
    flat = {(c, 64, 1.0): 0.85 for c in grid}
    frame = pd.DataFrame(trials(planted(small_eps, 4, rng), 1.0) + trials(planted(large_eps, 4, rng), 8.0)
                         + trials(planted(flat, 4, rng), 4.0))
    sweep = Sweep.from_frame(frame)
    table = per_seed(sweep.trials)
    intervals = optimum_intervals(indistinguishable(table), table).set_index("cell_name")
    names = {eps: sweep.trials[sweep.trials.epsilon == eps].cell_name.iloc[0] for eps in (1.0, 4.0, 8.0)}
    best = table.loc[(names[1.0], 10.0, 64, 1.0)].to_numpy()
    half = stats.t.ppf(1 - ALPHA / 2, 3) * best.std(ddof=1) / 2
    assert intervals.loc[names[1.0], "accuracy_low"] == pytest.approx(best.mean() - half)
    assert intervals.loc[names[1.0], "accuracy_high"] == pytest.approx(best.mean() + half)
    intervals = intervals.reset_index()
    assert compare_optima(intervals, names[1.0], names[8.0]) == "larger"
    assert compare_optima(intervals, names[8.0], names[1.0]) == "smaller"
    assert compare_optima(intervals, names[1.0], names[4.0]) == "not distinguishable"
    heatmap, optima, comparisons = with_error_bars(sweep, sweep.heatmap_table(), sweep.optima())
    # neighbours along ε are (1, 4) and (4, 8): the flat cell ties with both in C (only 1 against 8
    # differ, and they are not neighbours), and every B is 64: four ties, summed up in one line
    assert comparisons == ["neighbouring cells (along epsilon): optimal C or B not distinguishable in 4 "
                           "comparison(s) (α = 0.05)"]
    assert heatmap[heatmap.cell_name == names[4.0]].indistinguishable.sum() == 3   # the flat cell: all tied
    lines = optimum_lines(optima, comparisons)
    assert any("95% interval" in line and "not distinguishable from it" in line for line in lines)
    fig = figures.heatmap_figure(heatmap, sweep.cells()[sweep.cells().cell_name == names[4.0]], "flat")
    dashed = [p for p in fig.axes[0].patches if p.get_linestyle() == "--"]
    assert len(dashed) == 2   # the two settings tied with the starred optimum


def test_a_single_seed_sweep_says_it_cannot_tell(tmp_path):
    store = ResultsStore(str(tmp_path / "store"))
    for row in trials({(c, 64, 1.0): [0.8 + c / 100] for c in (0.1, 1.0)}):
        store.write_trial({**row, "experiment": "x", "cell": "digits/mlp", "model": "mlp"})
    a = analyse(store, noise=False, gradnorms=False)
    assert SINGLE_SEED in a.notes and a.comparisons == [SINGLE_SEED]
    assert optimum_lines(a.optima, a.comparisons)[-1] == SINGLE_SEED


def test_the_cost_of_a_fixed_setting_comes_with_its_paired_test(tmp_path):
    """Two cells whose optima differ (C = 10 against C = 0.1): the best single (C, B) loses 10 points in
    one of them, and the line says so with the p-value scipy gives on the same paired differences; in
    two flat cells the fixed setting is not distinguishable from the optimum anywhere."""
    rng = np.random.default_rng(5)
    grid = [0.1, 10.0]
    cells = {1.0: {(c, 64, 1.0): 0.80 - (0.10 if c != 10.0 else 0) for c in grid},
             8.0: {(c, 64, 1.0): 0.92 - (0.10 if c != 0.1 else 0) for c in grid}}
    rows = [r for eps, means in cells.items() for r in trials(planted(means, 4, rng), eps)]
    store = ResultsStore(str(tmp_path / "store"))
    for row in rows:
        store.write_trial({**row, "experiment": "x", "cell": f"digits/mlp/eps{row['epsilon']}", "model": "mlp"})
    a = analyse(store, noise=False, gradnorms=False)
    frame = pd.DataFrame(rows)
    fixed_c = 0.1 if frame[frame.clip_bound == 0.1].accuracy.mean() > frame[frame.clip_bound == 10.0].accuracy.mean() else 10.0
    assert a.fixed_setting == (fixed_c, 64)
    losing_eps = 1.0 if fixed_c == 0.1 else 8.0
    at = frame[frame.epsilon == losing_eps].pivot_table(index="seed", columns="clip_bound", values="accuracy")
    other = 10.0 if fixed_c == 0.1 else 0.1
    p = 2 * stats.ttest_rel(at[other], at[fixed_c], alternative="greater").pvalue   # × K = 2 settings compared
    (line,) = [c for c in a.comparisons if c.startswith("fixed setting")]
    assert f"C={fixed_c:g}, B=64" in line and f"p = {p:.3g}" in line and p < ALPHA
    assert f"costs {100 * (at[other].mean() - at[fixed_c].mean()):.1f} accuracy points" in line

    flat = ResultsStore(str(tmp_path / "flat"))
    for eps in (1.0, 8.0):
        for row in trials(planted({(c, 64, 1.0): 0.85 for c in grid}, 4, rng), eps):
            flat.write_trial({**row, "experiment": "x", "cell": f"digits/mlp/eps{eps}", "model": "mlp"})
    lines = [c for c in analyse(flat, noise=False, gradnorms=False).comparisons if c.startswith("fixed setting")]
    assert len(lines) == 1 and "not distinguishable from the optimum in any cell" in lines[0]


def test_the_optimal_batch_size_is_compared_along_every_axis_that_varies():
    """One ε, two epoch budgets whose optimal B differ (32 against 512, planted): the statements along
    epochs say the optimal B at 1 epoch is smaller, and the optimal C (one value) is not distinguishable."""
    rng = np.random.default_rng(7)
    short = {(1.0, b, 1.0): 0.70 - (0.15 if b != 32 else 0) for b in (32, 128, 512)}
    long = {(1.0, b, 1.0): 0.90 - (0.15 if b != 512 else 0) for b in (32, 128, 512)}
    sweep = Sweep.from_frame(pd.DataFrame(trials(planted(short, 3, rng), 1.0, epochs=1)
                                          + trials(planted(long, 3, rng), 1.0, epochs=16)))
    _, _, comparisons = with_error_bars(sweep, sweep.heatmap_table(), sweep.optima(), across="epsilon")
    assert comparisons == [
        "digits · mlp · ε=1: optimal B at 1 epoch is smaller than at 16 epochs (indistinguishable sets disjoint, "
        "α = 0.05)",
        "other neighbouring cells (along epsilon, epochs): optimal C or B not distinguishable in 1 comparison(s) "
        "(α = 0.05)"]   # the one C


def test_clip_equivalent_trials_count_as_the_run_they_equal():
    """A smaller C stored as `equivalent` (bit-identical to the larger C's run, with its accuracy) is tied
    with it, not dropped: the optimum (ties go to the smaller C) then lies in its own indistinguishable set."""
    rng = np.random.default_rng(3)
    rows = trials(planted({(1.0, 64, 1.0): 0.80, (10.0, 64, 1.0): 0.60}, 3, rng))
    rows += [{**r, "trial_id": r["trial_id"] + "-eq", "clip_bound": 0.1, "status": "equivalent"}
             for r in rows if r["clip_bound"] == 1.0]
    sweep = Sweep.from_frame(pd.DataFrame(rows))
    sets = indistinguishable(per_seed(sweep.trials)).set_index("clip_bound")
    assert bool(sets.loc[0.1, "indistinguishable"]) and bool(sets.loc[1.0, "indistinguishable"])
    assert not bool(sets.loc[10.0, "indistinguishable"])
    _, optima, _ = with_error_bars(sweep, sweep.heatmap_table(), sweep.optima())
    assert (optima["clip_bound"].iloc[0], optima["clip_bound_min"].iloc[0], optima["clip_bound_max"].iloc[0]) == (0.1, 0.1, 1.0)
