"""Analysis of a results store: heatmaps, gradient-norm distributions, C*, noise curves, report.

Reads the store only through :class:`dptune.platform.store.results_store.ResultsStore` and uses
:mod:`dptune.privacy`. Gradient-norm material (norm distributions, retention, C*) is computed
from private examples and is **not** differentially private.

Modules: ``optimal_clipping`` (C*, MSE(C), retention), ``results`` (cells, heatmap data, optima, cost of a
fixed setting), ``noise`` (σ√T against B), ``gradnorms`` (per-class norms), ``figures``,
``report`` (`dptune heatmap`, `dptune report`), ``diagnostic`` (`dptune optimal-clip`). Only the
light math is imported here, so ``from dptune.analysis import optimal_clip`` needs no matplotlib.
"""
from .optimal_clipping import ClipMSE, class_retention, clip_mse, optimal_clip

__all__ = ["ClipMSE", "class_retention", "clip_mse", "optimal_clip"]
