"""Difficulty-aware search spaces: spec sections → cells → pruned (C, B, η) trials.

The rules are those of "On optimal hyperparameters for DP deep transfer learning" (ICLR 2026).
Importing the package registers the search-space sections of the sweep spec. It imports neither
Ray nor the trainables: the platform passes in what can be trained (a :class:`Catalog`) and turns
a :class:`SweepPlan` into a Ray Tune searcher (``dptune.platform.sweep.searcher``).
"""
from . import search_sections as _search_sections  # noqa: F401  (registers the spec sections)
from .batches import MIN_STEPS, PLATEAU_TOL, batch_plan, prune_batches
from .noise_table import NoiseRequest, calibrate_many
from .plan_table import format_plan
from .planner import PLAN_FIELDS, Cell, CellPlan, SweepPlan, plan_sweep
from .search_sections import SearchSpace
from .spec import Catalog, Spec, SpecError, load_spec, register_check, register_section

__all__ = ["MIN_STEPS", "PLATEAU_TOL", "batch_plan", "prune_batches", "NoiseRequest", "calibrate_many",
           "PLAN_FIELDS", "Cell", "CellPlan", "SweepPlan", "plan_sweep", "format_plan", "SearchSpace", "Catalog",
           "Spec", "SpecError", "load_spec", "register_check", "register_section"]
