"""A results store in a notebook: its tables as pandas DataFrames and its figures as matplotlib
figures, through one entry point, :func:`dptune.open_store`.

```python
import dptune
results = dptune.open_store("dptune-results/default")   # an experiment folder, a store, or s3://…
results.trials.head()                                    # one row per trial
results.optima                                           # the best (C, B, η) per cell
results.heatmaps()["digits · cnn · 8 epochs"]            # a matplotlib Figure, one panel per ε
results.sql("SELECT cell, max(score) FROM trials GROUP BY cell")
```

Everything is read through the store's read-only reader, the same one ``dptune query`` and
``dptune report`` use; gradient-norm tables and figures are computed from private examples and are
NOT differentially private (their names say ``nonprivate``).
"""
from __future__ import annotations

from functools import cached_property

import pandas as pd
from matplotlib.figure import Figure

from ..platform.store.layout import ExperimentPaths
from ..platform.store.results_store import ResultsStore
from .report import Analysis, analyse, gradnorm_figures, heatmap_figures, noise_figures


class Results:
    """One experiment's results store (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.paths = ExperimentPaths.find(str(path))
        self.store = ResultsStore(self.paths.store)

    def __repr__(self) -> str:
        return f"Results({self.paths.root!r}: {len(self.trials)} trials)"

    @property
    def trials(self) -> pd.DataFrame:
        """One row per trial: its cell, (C, B, η), σ, q, T, status, accuracy, ε spent, …"""
        return self.store.table("trials")

    @property
    def epochs(self) -> pd.DataFrame:
        """One row per (trial, epoch): the learning curves."""
        return self.store.table("epochs")

    @property
    def nonprivate_gradnorms(self) -> pd.DataFrame:
        """Per-class statistics of the per-sample gradient norms (NOT differentially private)."""
        return self.store.table("gradnorms")

    def sql(self, query: str) -> pd.DataFrame:
        """A read-only SQL query over the views ``trials``, ``epochs`` and ``gradnorms``."""
        return self.store.query(query)

    @cached_property
    def analysis(self) -> Analysis:
        """The report's tables (heatmap, optima, fixed-setting cost, noise curves, gradient norms)."""
        return analyse(self.store)

    @property
    def optima(self) -> pd.DataFrame:
        """The best (C, B, η) of each cell, with its accuracy, σ, T and σ√T."""
        return self.analysis.optima

    def heatmaps(self) -> dict[str, Figure]:
        """{facet: heatmap of the best accuracy over η per (C, B), one panel per cell}."""
        return dict(heatmap_figures(self.analysis))

    def noise_curves(self) -> dict[str, Figure]:
        """{facet: the cumulative DP noise σ√T against B of each cell}."""
        return dict(noise_figures(self.analysis))

    def nonprivate_gradnorm_figures(self) -> dict[str, tuple[Figure, Figure]]:
        """{facet: (per-class gradient-norm distributions at each cell's optimum, retention w_y(C))}
        (NOT differentially private)."""
        return {facet: (distribution, retention) for facet, distribution, retention in gradnorm_figures(self.analysis)}


def open_store(path: str) -> Results:
    """Open a results store for a notebook: an experiment folder, a store folder, or an s3:// URI."""
    return Results(path)
