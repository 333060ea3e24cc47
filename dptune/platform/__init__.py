"""Sweeps on Ray Tune: the trainable, launching and resuming, and the Parquet results store.

The platform's sections of the sweep spec (experiment, storage, resources, failure) register when
``dptune.platform.spec_sections`` is imported (the sweep and plan commands do); importing the
store alone pulls in neither Ray nor the search spaces.
"""
from .store import ResultsStore

__all__ = ["ResultsStore"]
