"""Per-class statistics of per-sample gradient norms (non-private diagnostics).

Used per step by the engine and per epoch by the trainer: counts, the share clipped at C, norm
quantiles, and a histogram on fixed log-spaced bins so histograms from different trials add up.
"""
from __future__ import annotations

import numpy as np
import torch

NORM_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
#: Log-spaced histogram edges: 1e-4 … 1e4, 4 bins per decade (outside values go to the end bins).
HIST_EDGES = np.logspace(-4, 4, 33)


def class_norm_statistics(norms: torch.Tensor, labels: torch.Tensor, clip_bound: float, *,
                          histogram: bool = False) -> dict[int, dict]:
    """{label: {count, clipped_fraction, norm_quantiles{q: value}[, histogram]}} for each label present."""
    norms = norms.detach().double().cpu()
    labels = labels.detach().cpu()
    q = torch.tensor(NORM_QUANTILES, dtype=torch.float64)
    out: dict[int, dict] = {}
    for label in labels.unique().tolist():
        n_y = norms[labels == label]
        entry = {"count": int(n_y.numel()),
                 "clipped_fraction": float((n_y > clip_bound).double().mean()),
                 "norm_quantiles": dict(zip(NORM_QUANTILES, torch.quantile(n_y, q).tolist()))}
        if histogram:
            clipped = np.clip(n_y.numpy(), HIST_EDGES[0], HIST_EDGES[-1])
            entry["histogram"] = np.histogram(clipped, bins=HIST_EDGES)[0].tolist()
        out[int(label)] = entry
    return out
