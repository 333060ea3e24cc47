"""The comparison of a cell's settings with its best, over seeds: the test behind the error bars
(:mod:`dptune.analysis.uncertainty`, where the method is argued) and behind racing's contenders
(:mod:`dptune.platform.sweep.race`), here so that both use one computation. Pure numpy and scipy.

Paired or not: in reproducible mode a seed fixes a trial's initialisation, batches and noise, the same
for every setting of a cell (common random numbers), so the settings are compared seed by seed (a
paired t-test on the seeds both ran). Under secure randomness (``trial: {randomness: secure}``) a seed
fixes nothing of the noise or the batches, so two settings' runs with the same seed are independent
draws: they are compared unpaired, by Welch's t-test (unequal variances) on each one's own runs.
"""
from __future__ import annotations

import numpy as np
from scipy import stats

#: Level of the paired one-sided test (and 1 − the error bars' interval's confidence).
ALPHA = 0.05


def against_best(values: np.ndarray, looks: int = 1, paired: bool = True) -> tuple[int, np.ndarray]:
    """``values``: settings × seeds (NaN where a setting did not run a seed; higher is better). The best
    setting (the largest mean over its seeds, the first of equals) and each setting's one-sided
    p-value of "the best is better" — paired t-test on the seeds both ran, or (``paired=False``, secure
    randomness) Welch's t-test on each one's own runs — multiplied by K·``looks`` (K: the settings with
    a test, the best included) and capped at 1; NaN where fewer than two seeds are shared (paired) or
    either has fewer than two runs (Welch): no test; 1 for the best itself."""
    means = np.nanmean(values, axis=1)
    best = int(np.nanargmax(means))
    p = np.full(len(values), np.nan)
    top = values[best][~np.isnan(values[best])]
    for i, row in enumerate(values):
        if i == best:
            p[i] = 1.0
        elif paired:
            shared = ~np.isnan(row) & ~np.isnan(values[best])
            if shared.sum() >= 2:
                p[i] = _one_sided(values[best][shared] - row[shared], None)
        elif (~np.isnan(row)).sum() >= 2 and len(top) >= 2:
            p[i] = _one_sided(top, row[~np.isnan(row)])
    tested = ~np.isnan(p)
    others = tested & (np.arange(len(values)) != best)
    p[others] = np.minimum(1.0, tested.sum() * looks * p[others])
    return best, p


def _one_sided(a: np.ndarray, b: np.ndarray | None) -> float:
    """p of "a's mean is larger": of the differences ``a`` (paired, ``b`` None) or of ``a`` against ``b``
    (Welch). Without spread the t statistic is undefined: equal means tie (1), any gap is certain (0)."""
    if b is None:
        if np.allclose(a, a[0]):
            return 1.0 if a[0] <= 0 else 0.0
        return float(stats.ttest_1samp(a, 0.0, alternative="greater").pvalue)
    if np.allclose(a, a[0]) and np.allclose(b, b[0]):
        return 1.0 if a[0] <= b[0] else 0.0
    return float(stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue)
