"""The comparison of a cell's settings with its best, over seeds: the test behind the error bars
(:mod:`dptune.analysis.uncertainty`, where the method is argued) and behind racing's contenders
(:mod:`dptune.platform.sweep.race`), here so that both use one computation. Pure numpy and scipy.
"""
from __future__ import annotations

import numpy as np
from scipy import stats

#: Level of the paired one-sided test (and 1 − the error bars' interval's confidence).
ALPHA = 0.05


def against_best(values: np.ndarray, looks: int = 1) -> tuple[int, np.ndarray]:
    """``values``: settings × seeds (NaN where a setting did not run a seed; higher is better). The best
    setting (the largest mean over its seeds, the first of equals) and each setting's one-sided paired
    t-test p-value of "the best is better" on the seeds both ran, multiplied by K·``looks`` (K: the
    settings with a test, the best included) and capped at 1; NaN where fewer than two seeds are
    shared (no test), 1 for the best itself."""
    means = np.nanmean(values, axis=1)
    best = int(np.nanargmax(means))
    p = np.full(len(values), np.nan)
    for i, row in enumerate(values):
        shared = ~np.isnan(row) & ~np.isnan(values[best])
        if i == best:
            p[i] = 1.0
        elif shared.sum() >= 2:
            diff = values[best][shared] - row[shared]
            if np.allclose(diff, diff[0]):   # no spread: equal means tie, any gap is certain
                p[i] = 1.0 if diff[0] <= 0 else 0.0
            else:
                p[i] = stats.ttest_rel(values[best][shared], row[shared], alternative="greater").pvalue
    tested = ~np.isnan(p)
    others = tested & (np.arange(len(values)) != best)
    p[others] = np.minimum(1.0, tested.sum() * looks * p[others])
    return best, p
