"""Error bars on a sweep's answer: which settings of a cell cannot be told from its best, and whether
the optimum moved between two cells.

Method (documented choice): a **paired one-sided t-test over seeds, corrected for the selection of
the best**. In a cell, the best setting b is the one with the largest seed-mean score. Another
setting s is *indistinguishable* from b unless b beats it on the seeds both ran by a mean margin
whose one-sided paired t-test rejects "no difference" at level ``ALPHA / K``, K the settings the cell
compares (b and every setting tested against it): Bonferroni's bound on Hsu's multiple comparisons
with the best. Against the *selected* best an uncorrected test at α says "distinguishable" of a
setting as good as the best far more often than α (simulated on cells of equal settings, three
seeds: 0.10 of the statements at K = 2, 0.31 at K = 75), since b is the largest of K noisy means; with
the correction each statement about a setting as good as the best is false with probability at most
α (the p-values reported are the corrected ones, min(1, K·p); computed by
:func:`dptune.search_spaces.comparisons.against_best`, which racing shares). A raced cell (``search.racing``) tests
its contenders again as their seeds grow, up to L looks: its p-values are multiplied by K·L
(:mod:`dptune.search_spaces.racing`; the trials record L, ``looks``). Pairing by seed is what makes a few seeds enough: in reproducible
mode the seeds share batches and noise across the settings of a cell (common random numbers), so
most of the seed-to-seed spread cancels in the differences. A cell whose trials ran with secure
randomness shares nothing between runs of the same seed: it is compared unpaired (Welch's t-test,
same correction). The indistinguishable set is the error
bar of the optimum: drawn outlined on the heatmaps, its range of C, B and η written to ``optima.csv``
beside a t-interval of the best setting's mean value.

Between cells (along every axis that varies: ε, epochs, backbone, dataset), for C and for B: "the
optimal C at ε = a is larger than at ε = b" when every C of a's indistinguishable set exceeds every C
of b's (each set holds the best setting with confidence ≥ 1 − ALPHA against each
rival, so the statement holds at that level up to the union over rivals); "not distinguishable" when
the ranges overlap. With one seed per setting there are no error bars, and the report says so in one
line instead of pretending.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import stats

from ..schema import BATCH_SIZE, CLIP_BOUND, HYPERPARAMETERS
from ..search_spaces.comparisons import ALPHA, against_best

if TYPE_CHECKING:
    from .results import Sweep

#: A configuration of a cell: the trial schema's hyperparameters (C, B, η).
SETTING = list(HYPERPARAMETERS)
SINGLE_SEED = ("one seed per setting: no error bars — the optimum cannot be told from its neighbours "
               "(run several seeds, e.g. `seeds: [0, 1, 2]`)")


#: Statuses whose value is a full run's: trained to the end, or clip-equivalent to one that was
#: (bit-identical results, stored with that run's value). Stopped trials ran fewer epochs.
COMPLETE = ("finished", "equivalent")


def per_seed(trials: pd.DataFrame) -> pd.DataFrame:
    """Complete private trials as one row per (cell, setting) and one column per seed: the score
    (the selected metric, negated where lower is better: higher is better here, as in ``Sweep``)."""
    done = trials[trials["private"] & trials["value"].notna() & trials["status"].isin(COMPLETE)]
    if done.empty:
        return pd.DataFrame()
    done = done.assign(seed=done["seed"].fillna(0) if "seed" in done else 0)   # no seed recorded: one seed
    return done.pivot_table(index=["cell_name", *SETTING], columns="seed", values="score", aggfunc="mean")


def cell_signs(trials: pd.DataFrame) -> dict[str, float]:
    """Each cell's sign: score = sign × the metric's value (−1 where lower is better)."""
    return trials.groupby("cell_name")["sign"].first().to_dict()


def cell_looks(trials: pd.DataFrame) -> dict[str, int]:
    """Each cell's L: the times racing may test a configuration against its optimum (1 unraced)."""
    if "looks" not in trials:
        return {}
    return {cell: int(v) for cell, v in trials.groupby("cell_name")["looks"].max().dropna().items()}


def cell_paired(trials: pd.DataFrame) -> dict[str, bool]:
    """Each cell: whether its runs are paired by seed (False where any ran with secure randomness; a
    store without the column predates secure mode, so its runs were seeded)."""
    if "randomness" not in trials:
        return {}
    return {cell: not (modes == "secure").any() for cell, modes in trials.groupby("cell_name")["randomness"]}


def indistinguishable(table: pd.DataFrame, alpha: float = ALPHA, signs: dict[str, float] | None = None,
                      looks: dict[str, int] | None = None, paired: dict[str, bool] | None = None) -> pd.DataFrame:
    """Per (cell, setting) of a :func:`per_seed` table: its seed-mean ``value`` (in the metric's own
    units: ``signs`` from :func:`cell_signs`, +1 when not given; again as ``accuracy`` where higher is
    better), seeds, the one-sided p-value of "the cell's
    best is better" (paired, or Welch's where ``paired`` from :func:`cell_paired` says False) corrected
    for the selection and for racing's repeated tests (× K·L: K the settings compared, L the cell's
    ``looks`` from :func:`cell_looks`, 1 when not given; see the module docstring), and ``indistinguishable`` (p ≥ alpha, or the best itself; False where fewer
    than two seeds are shared: no test)."""
    signs, looks, paired = signs or {}, looks or {}, paired or {}
    rows = []
    for cell, block in table.groupby(level="cell_name"):
        values = block.to_numpy(dtype=float)
        best, p = against_best(values, looks.get(cell, 1), paired.get(cell, True))
        means = np.nanmean(values, axis=1)
        sign = signs.get(cell, 1.0)
        for i, key in enumerate(block.index):
            rows.append({"cell_name": cell, **dict(zip(SETTING, key[1:])), "value": sign * float(means[i]),
                         "accuracy": sign * float(means[i]) if sign > 0 else math.nan,
                         "seeds": int((~np.isnan(values[i])).sum()), "p_value": float(p[i]), "best": i == best})
    for r in rows:
        r["indistinguishable"] = bool(r["best"] or (not math.isnan(r["p_value"]) and r["p_value"] >= alpha))
    return pd.DataFrame(rows)


#: Metrics with a bounded range, which their intervals are cut to: the mean lies in the range, so
#: cutting a t-interval to it keeps its coverage (three seeds of a noisy cell gave [0.12, 1.03]).
METRIC_RANGES = {"test_accuracy": (0.0, 1.0), "validation_accuracy": (0.0, 1.0)}


def metric_range(trials: pd.DataFrame) -> tuple[float, float]:
    """The range the store's selected metric (its ``metric`` column) can take; unbounded when unknown
    or mixed (a noisy selection score can leave [0, 1])."""
    metrics = set(trials["metric"].dropna()) if "metric" in trials else set()
    ranges = {METRIC_RANGES.get(m, (-math.inf, math.inf)) for m in metrics} or {(-math.inf, math.inf)}
    return ranges.pop() if len(ranges) == 1 else (-math.inf, math.inf)


def optimum_intervals(sets: pd.DataFrame, table: pd.DataFrame, alpha: float = ALPHA,
                      bounds: tuple[float, float] = (-math.inf, math.inf),
                      signs: dict[str, float] | None = None) -> pd.DataFrame:
    """Per cell: the best setting's t-interval (1 − alpha) of its mean value (``value_low``,
    ``value_high``: the metric, in its own units: ``signs`` as for :func:`indistinguishable`; again as
    ``accuracy_low``, ``accuracy_high`` where higher is better), cut to the metric's range ``bounds``, how
    many settings are indistinguishable from it, and the range of C, B and η over them."""
    signs = signs or {}
    rows = []
    for cell, group in sets.groupby("cell_name"):
        best = group[group["best"]].iloc[0]
        values = signs.get(cell, 1.0) * table.loc[(cell, *[best[c] for c in SETTING])].dropna().to_numpy(dtype=float)
        n = len(values)
        low = high = math.nan
        if n >= 2:
            half = stats.t.ppf(1 - alpha / 2, n - 1) * values.std(ddof=1) / math.sqrt(n)
            low, high = max(values.mean() - half, bounds[0]), min(values.mean() + half, bounds[1])
        tied = group[group["indistinguishable"]]
        accuracy = signs.get(cell, 1.0) > 0
        rows.append({"cell_name": cell, "value_low": low, "value_high": high,
                     "accuracy_low": low if accuracy else math.nan, "accuracy_high": high if accuracy else math.nan,
                     "indistinguishable": len(tied) if n >= 2 else math.nan,
                     **{f"{c}_{end}": (tied[c].min() if end == "min" else tied[c].max()) if n >= 2 else math.nan
                        for c in SETTING for end in ("min", "max")}})
    return pd.DataFrame(rows)


def compare_optima(intervals: pd.DataFrame, a: str, b: str, axis: str = CLIP_BOUND) -> str:
    """"larger", "smaller" or "not distinguishable": the optimal ``axis`` of cell ``a`` against cell
    ``b``, from their indistinguishable sets (see the module docstring); "unknown" without error bars."""
    ra, rb = (intervals.set_index("cell_name").loc[c] for c in (a, b))
    if any(math.isnan(r[f"{axis}_{end}"]) for r in (ra, rb) for end in ("min", "max")):
        return "unknown"
    if ra[f"{axis}_min"] > rb[f"{axis}_max"]:
        return "larger"
    if ra[f"{axis}_max"] < rb[f"{axis}_min"]:
        return "smaller"
    return "not distinguishable"


def with_error_bars(sweep: "Sweep", heatmap: pd.DataFrame, optima: pd.DataFrame,
                    across: str = "epsilon") -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """The heatmap table with an ``indistinguishable`` column (its (C, B)'s best η is not told from
    the cell's optimum), the optima with their intervals and ranges, and the between-cell
    statements on the optimal C and B across ``across``, then across every other axis that varies —
    or ``[SINGLE_SEED]`` when no setting ran on two seeds."""
    table = per_seed(sweep.trials)
    if table.empty or int(table.notna().sum(axis=1).max()) < 2:
        return heatmap.assign(indistinguishable=False), optima, [SINGLE_SEED] if not table.empty else []
    signs = cell_signs(sweep.trials)
    sets = indistinguishable(table, signs=signs, looks=cell_looks(sweep.trials), paired=cell_paired(sweep.trials))
    keys = ["cell_name", *SETTING]
    heatmap = heatmap.merge(sets[keys + ["indistinguishable", "p_value"]], on=keys, how="left")
    heatmap["indistinguishable"] = heatmap["indistinguishable"].fillna(False).astype(bool)
    intervals = optimum_intervals(sets, table, bounds=metric_range(sweep.trials), signs=signs)
    axes = [across] + [a for a in sweep.cell_columns if a != across and sweep.trials[a].nunique() > 1]
    statements, ties = [], 0
    for axis in axes:
        lines, tied = between_cells(sweep, intervals, axis)
        statements, ties = statements + lines, ties + tied
    if ties:
        statements.append(f"{'other ' if statements else ''}neighbouring cells (along {', '.join(axes)}): "
                          f"optimal C or B not distinguishable in {ties} comparison(s) (α = {ALPHA:g})")
    return heatmap, optima.merge(intervals, on="cell_name", how="left"), statements


#: The settings whose optimum :func:`between_cells` compares, and how its lines name them.
COMPARED = {CLIP_BOUND: "C", BATCH_SIZE: "B"}


def between_cells(sweep: "Sweep", intervals: pd.DataFrame, across: str) -> tuple[list[str], int]:
    """For each facet, each pair of neighbouring cells along ``across``: a line for each of the optimal
    C and B that is larger or smaller (:func:`compare_optima`), named by the facet and the two values of
    ``across``; and how many comparisons were not distinguishable."""
    from .results import cell_title

    lines, ties = [], 0
    known = set(intervals["cell_name"])
    for facet, cells in sweep.facets(across):
        rows = [row for _, row in cells[cells["cell_name"].isin(known)].sort_values(across).iterrows()]
        for a, b in zip(rows, rows[1:]):
            for axis, symbol in COMPARED.items():
                verdict = compare_optima(intervals, a["cell_name"], b["cell_name"], axis)
                if verdict == "not distinguishable":
                    ties += 1
                elif verdict != "unknown":
                    lines.append(f"{facet}: optimal {symbol} at {cell_title({across: a[across]})} is {verdict} than "
                                 f"at {cell_title({across: b[across]})} (indistinguishable sets disjoint, "
                                 f"α = {ALPHA:g})")
    return lines, ties


def fixed_setting_lines(heatmap: pd.DataFrame, cost: pd.DataFrame, setting: tuple[float, float], *,
                        metric: str = "accuracy", lower_is_better: bool = False) -> list[str]:
    """Whether one global (C, B) (η tuned per cell where it was searched) costs accuracy (the selected
    ``metric``; in its own units where lower is better), with its error bar: per cell where
    it is not optimal, its cost and the paired test's p-value against the cell's optimum (from
    :func:`with_error_bars`' heatmap); one line when it is indistinguishable from the optimum everywhere.
    Empty without error bars."""
    if "p_value" not in heatmap:
        return []
    from .results import eta_note

    c, b = setting
    at = heatmap[np.isclose(heatmap[CLIP_BOUND], c) & np.isclose(heatmap[BATCH_SIZE], b)]
    at = at.set_index("cell_name")
    tuned = "learning_rates" in heatmap and int(heatmap["learning_rates"].max()) > 1
    name = f"fixed setting C={c:g}, B={b:g} ({eta_note(tuned)})"
    lines, tested = [], 0
    for _, row in cost[cost["fixed_stopped"].notna()].iterrows() if "fixed_stopped" in cost else ():
        lines.append(f"{name}: {row['fixed_stopped']} at {row['cell_name']} (multi-fidelity: it lost there to the "
                     "cell's other configurations, worse than its optimum)")
    for _, row in cost.dropna(subset=["fixed_value"]).iterrows():
        if row["cell_name"] not in at.index or pd.isna(at.loc[row["cell_name"], "p_value"]):
            continue   # no test: fewer than two seeds shared with the optimum
        tested += 1
        if bool(at.loc[row["cell_name"], "indistinguishable"]):
            continue
        amount = f"{row['cost']:.3f} of {metric}" if lower_is_better else f"{100 * row['cost']:.1f} accuracy points"
        lines.append(f"{name}: costs {amount} at {row['cell_name']} "
                     f"(paired one-sided t-test over seeds against the optimum, × the settings compared: p = "
                     f"{at.loc[row['cell_name'], 'p_value']:.3g} < α = {ALPHA:g})")
    if lines or not tested:
        return lines
    return [f"{name}: not distinguishable from the optimum in any cell where it ran (α = {ALPHA:g})"]
