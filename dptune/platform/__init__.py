"""Sweeps on Ray Tune: the trainable, launching and resuming, and the Parquet results store.

Importing the package registers the platform's sections of the sweep spec (experiment, storage,
resources, failure). Ray itself is imported only by the modules that run sweeps.
"""
from . import spec_sections as _spec_sections  # noqa: F401  (registers the spec sections)
from .store import ResultsStore

__all__ = ["ResultsStore"]
