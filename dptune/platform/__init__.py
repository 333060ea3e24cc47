"""Sweeps on Ray Tune: the trainable, launching and resuming, and the Parquet results store.

The platform's sections of the sweep spec (experiment, storage, resources, failure) register when
``dptune.platform.sweep.spec_sections`` is imported (the sweep and plan commands do); importing the
store alone pulls in neither Ray nor the search spaces. ``ResultsStore`` is imported on first use
(PEP 562), so the light modules (``layout``, ``spec_sections``) load without DuckDB.
"""
from __future__ import annotations

from typing import Any

__all__ = ["ResultsStore"]


def __getattr__(name: str) -> Any:
    if name == "ResultsStore":
        from .store.results_store import ResultsStore

        globals()[name] = ResultsStore
        return ResultsStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
