"""Difficulty-aware search spaces: spec sections → cells → pruned (C, B, η) trials (paper 000).

Importing the package registers the search-space sections of the sweep spec. ``SweepSearcher``
(Ray Tune) is imported on first use, so planning does not pay for importing Ray.
"""
from . import sections as _sections  # noqa: F401  (registers the spec sections)
from .batches import batch_plan, prune_batches
from .calibrate import NoiseRequest, calibrate_many
from .planner import META_FIELDS, Cell, CellPlan, SweepPlan, plan_sweep
from .report import format_plan
from .sections import SearchSpace
from .spec import Catalog, Spec, SpecError, load_spec, register_check, register_section

__all__ = ["batch_plan", "prune_batches", "NoiseRequest", "calibrate_many", "META_FIELDS", "Cell", "CellPlan",
           "SweepPlan", "plan_sweep", "format_plan", "SearchSpace", "Catalog", "Spec",
           "SpecError", "load_spec", "register_check", "register_section", "SweepSearcher"]


def __getattr__(name: str) -> object:
    if name == "SweepSearcher":
        from .searcher import SweepSearcher

        return SweepSearcher
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
