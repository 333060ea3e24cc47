"""Sweeps on Ray Tune and their results store, in folders by job: ``store/`` (an experiment's files
and the Parquet results store; no Ray), ``sweep/`` (the driver, the searcher, the trial bodies, Ray)
and ``views/`` (status, export, audit); ``faults.py`` is shared.

The platform's sections of the sweep spec (experiment, storage, resources, failure, tracking)
register when ``dptune.platform.sweep.spec_sections`` is imported (the sweep and plan commands do).
``ResultsStore`` is imported on first use (PEP 562), so the light modules (``store.layout``,
``sweep.spec_sections``) load without DuckDB.
"""
from __future__ import annotations

from ..lazy_names import lazy_names

__all__ = ["ResultsStore"]
__getattr__ = lazy_names(__name__, {"ResultsStore": ".store.results_store"})
