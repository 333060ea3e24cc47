"""Per-class gradient-norm distributions, retention weights and clipped shares from ``gradnorms``.

NOT differentially private: the ``gradnorms`` table is computed from private training examples
(the store marks every row ``nonprivate``); so is everything here.

For each private cell the trials at its optimal (C, B, η) are used, all seeds and epochs pooled
(the norms clipping acted on during training). Histograms add up exactly across epochs and seeds
because they share fixed log bins; quantiles are read off the pooled histogram (log-linear within
a bin of a quarter decade).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .optimal_clipping import HIST_EDGES, histogram_quantiles, histogram_retention
from .results import Sweep
from ..schema import BATCH_SIZE, CLIP_BOUND, LEARNING_RATE

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
QUANTILE_COLUMNS = tuple(f"q{round(q * 100):02d}" for q in QUANTILES)


def optimum_trial_ids(sweep: Sweep) -> dict[str, list[str]]:
    """{cell name: ids of the finished trials at that private cell's optimal (C, B, η)}."""
    optima = sweep.optima()
    done = sweep.finished()
    out = {}
    for _, best in optima[optima["private"] & optima["value"].notna()].iterrows():
        at = done[(done["cell_name"] == best["cell_name"]) & np.isclose(done[CLIP_BOUND], best[CLIP_BOUND])
                  & np.isclose(done[BATCH_SIZE], best[BATCH_SIZE])
                  & np.isclose(done[LEARNING_RATE], best[LEARNING_RATE])]
        out[best["cell_name"]] = [str(t) for t in at["trial_id"]]
    return out


def class_norms(sweep: Sweep, gradnorms: pd.DataFrame) -> pd.DataFrame:
    """One row per (private cell, class): pooled ``count``, ``histogram``, ``clipped_fraction`` (at
    the cell's optimal C, count-weighted), quantiles ``q10`` … ``q90`` and the cell's ``clip_bound``."""
    columns = ["cell_name", "label", "count", "clipped_fraction", "histogram", *QUANTILE_COLUMNS, CLIP_BOUND]
    if gradnorms.empty or "label" not in gradnorms:
        return pd.DataFrame(columns=columns)
    optima = sweep.optima().set_index("cell_name")
    rows = []
    for cell, ids in optimum_trial_ids(sweep).items():
        g = gradnorms[gradnorms["trial_id"].astype(str).isin(ids) & gradnorms["histogram"].notna()]
        for label, per_label in g.groupby("label"):
            counts = np.sum([np.asarray(h, dtype=np.float64) for h in per_label["histogram"]], axis=0)
            weights = per_label["count"].astype(float)
            clipped = float(np.average(per_label["clipped_fraction"], weights=weights)) if weights.sum() else np.nan
            row = {"cell_name": cell, "label": int(label), "count": int(weights.sum()),
                   "clipped_fraction": clipped, "histogram": counts,
                   CLIP_BOUND: float(optima.loc[cell, CLIP_BOUND])}
            row.update(dict(zip(QUANTILE_COLUMNS, histogram_quantiles(counts, QUANTILES))))
            rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def retention_curves(norms: pd.DataFrame, clip_bounds: np.ndarray) -> pd.DataFrame:
    """w_y(C) per (cell, class) on a grid of C, from the pooled histograms (long format)."""
    rows = []
    for _, r in norms.iterrows():
        w = histogram_retention(r["histogram"], clip_bounds)
        rows += [{"cell_name": r["cell_name"], "label": r["label"], CLIP_BOUND: c, "retention": v}
                 for c, v in zip(clip_bounds, w)]
    return pd.DataFrame(rows, columns=["cell_name", "label", CLIP_BOUND, "retention"])


def retention_grid(norms: pd.DataFrame, points: int = 200) -> np.ndarray:
    """A log grid of C from a decade below the smallest 10% quantile (or C) to a decade above the
    largest 90% quantile (or C), within the histogram's range."""
    if norms.empty:
        return np.logspace(-2, 2, points)
    lo = np.nanmin(np.minimum(norms[QUANTILE_COLUMNS[0]], norms[CLIP_BOUND]))
    hi = np.nanmax(np.maximum(norms[QUANTILE_COLUMNS[-1]], norms[CLIP_BOUND]))
    lo, hi = max(HIST_EDGES[0], lo / 10), min(HIST_EDGES[-1], hi * 10)
    return np.logspace(np.log10(lo), np.log10(hi), points)
