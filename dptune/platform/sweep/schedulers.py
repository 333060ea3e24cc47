"""Early stopping within a cell (``search.scheduler``): Ray Tune's ASHA or median stopping, one
instance per group of comparable trials, epochs (or, with ``grace_steps``, optimizer steps) as the
resource.

Ray Tune's schedulers compare every trial of an experiment with every other; a sweep's cells
differ in ε, backbone, dataset and epochs, so their accuracies are not comparable, and within a
cell, trials of different B take different numbers of steps per epoch, so their early epochs are
not either (a large-B trial has taken a few steps when a small-B one has taken many). A
:class:`PerCellScheduler` gives each group — the trials of one cell with the same B, or with
``within: cell`` the whole cell — its own ``AsyncHyperBandScheduler`` (rungs at epoch ends:
``time_attr="epoch"``, ``max_t`` the cell's epochs; with ``grace_steps``, rungs at optimizer steps
grace·rf^k, each taken at the first epoch end past it: ``time_attr="step"``) or
``MedianStoppingRule``, and keeps their
state in a file beside the experiment, so
``dptune resume`` continues with the rungs already recorded and the stop decisions already taken
(Ray Tune restores its searcher but builds a scheduler afresh). A trial stopped just before a
driver failure, whose stop Ray Tune had not yet recorded, is stopped again at its next report.

A stopped trial took fewer steps than planned, so it spent less than the cell's ε; the store
callback records it with status ``stopped`` and the ε of its last epoch. The members of a pack
(:mod:`dptune.platform.sweep.packs`) are decided one by one, each in its own group, from its own result; a stopped
member is retired from its pack (through :class:`dptune.platform.sweep.packs.PackStops`, before the pack's next epoch)
while the others go on.
"""
from __future__ import annotations

import functools
import math
import pickle
from typing import Optional

import ray
from ray.tune.experiment import Trial
from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, MedianStoppingRule, TrialScheduler

from ...errors import UserError
from ...schema import BATCH_SIZE, SCORE
from ...search_spaces.search_sections import Scheduler
from ..store.durable import read_file, write_bytes
from ..store.layout import ExperimentPaths
from .packs import MemberTrial, is_pack, members, new_member_results, pack_stops

#: File of the per-cell scheduler state, beside Ray's experiment state.
STATE_FILE = "dptune-scheduler.pkl"
#: The reported metric that counts epochs (the scheduler's resource).
TIME_ATTR = "epoch"
#: The reported metric that counts optimizer steps (the resource with ``grace_steps``), and the bound
#: of its rungs (above any trial's T).
STEP_ATTR = "step"
MAX_STEPS = 2**31


def cell_scheduler(settings: Scheduler, epochs: float, *, metric: str = SCORE, mode: str = "max") -> TrialScheduler:
    """The scheduler of one cell whose trials train ``epochs`` epochs: epochs as the resource, or
    optimizer steps with ``grace_steps`` (then rungs run up to :data:`MAX_STEPS`; a trial ends at
    its own T whatever the rungs above it). It compares the trials' signed score; ``metric`` and
    ``mode`` are kept for a scheduler pickled before the score (it resumes on its own metric)."""
    by_steps = settings.grace_steps is not None
    time_attr, grace = (STEP_ATTR, settings.grace_steps) if by_steps else (TIME_ATTR, settings.grace_epochs)
    if settings.name == "asha":
        return AsyncHyperBandScheduler(time_attr=time_attr, metric=metric, mode=mode,
                                       max_t=MAX_STEPS if by_steps else math.ceil(epochs), grace_period=grace,
                                       reduction_factor=settings.reduction_factor)
    if settings.name == "median":
        return MedianStoppingRule(time_attr=time_attr, metric=metric, mode=mode, grace_period=grace,
                                  min_samples_required=settings.min_samples, hard_stop=True)
    raise UserError(f"scheduler must be one of asha, median; got {settings.name!r}")


class PerCellScheduler(FIFOScheduler):
    """One inner scheduler per cell, or per (cell, B) (``settings.within``; :func:`cell_scheduler`);
    trials without a ``cell`` key run to the end. ``state``: the experiment whose folder keeps the
    groups' state."""

    def __init__(self, settings: Scheduler, *, state: ExperimentPaths | None = None) -> None:
        super().__init__()
        self._metric, self._mode = SCORE, "max"
        self.settings = settings
        self.make = functools.partial(cell_scheduler, settings)
        self.state = state
        self.cells: dict[str, TrialScheduler] = {}
        self.stopped: set[str] = set()   # trials stopped by a decision already taken
        self._stops = None               # the pack members' stops (packs.PackStops), made on first use
        self._loaded = False

    # --- Ray Tune's TrialScheduler interface --------------------------------------------------

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], **spec) -> bool:
        return True   # the metric and mode are fixed at construction

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        for member in members(trial):
            inner = self._inner(member)
            if inner is not None:
                inner.on_trial_add(tune_controller, member)

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        if is_pack(trial):   # each member decided alone; the pack goes on while any member does
            stop = [k for k, member in new_member_results(result)
                    if self._decide(tune_controller, MemberTrial(trial, k), member) == TrialScheduler.STOP]
            if stop:
                if self._stops is None:   # held here: an actor with no handle left is collected
                    self._stops = pack_stops(create=True)
                ray.get([self._stops.stop.remote(trial.trial_id, k) for k in stop])   # before the pack goes on
            self._save()
            return TrialScheduler.CONTINUE
        decision = self._decide(tune_controller, trial, result)
        self._save()
        return decision

    def _decide(self, tune_controller, trial: Trial, result: dict) -> str:
        inner = self._inner(trial)
        if inner is None:
            return TrialScheduler.CONTINUE
        if trial.trial_id in self.stopped:   # decided before a driver failure, not yet applied: apply it
            return TrialScheduler.STOP
        decision = inner.on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.STOP and result.get("step", 0) < result.get("steps", 0):
            self.stopped.add(trial.trial_id)
        return decision

    def on_trial_complete(self, tune_controller, trial: Trial, result: dict) -> None:
        completed = False
        for member in members(trial):
            inner = self._inner(member)
            if inner is not None and member.trial_id in getattr(inner, "_trial_info", {member.trial_id: None}):
                inner.on_trial_complete(tune_controller, member, member.last_result if member is not trial else result)
                completed = True
        if completed:   # one write of the state for a pack's members
            self._save()

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        for member in members(trial):
            inner = self._inner(member)
            if inner is not None:
                inner.on_trial_error(tune_controller, member)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        for member in members(trial):
            inner = self._inner(member)
            if inner is not None and member.trial_id in getattr(inner, "_trial_info", {member.trial_id: None}):
                inner.on_trial_remove(tune_controller, member)

    def debug_string(self) -> str:
        return "\n".join(f"{cell}: {inner.debug_string()}" for cell, inner in self.cells.items()) or "no cells yet"

    # --- internals -----------------------------------------------------------------------------

    def _inner(self, trial: Trial) -> TrialScheduler | None:
        self._load()
        config = trial.config or {}
        cell = config.get("cell")
        # a proxy search's full-scale answer runs to its end, and so do the other seeds of a configuration
        # whose lead seed passed every rung (the decision was taken on the lead: cell_search.CellSearch)
        if cell is None or config.get("final") or config.get("follower"):
            return None
        group = cell if self.settings.within == "cell" else f"{cell}/B={config.get(BATCH_SIZE)}"
        if group not in self.cells:
            self.cells[group] = self.make(float(config["epochs"]))
        return self.cells[group]

    def _state_file(self) -> tuple[object, str] | None:
        if self.state is None:
            return None
        fs, root = self.state.filesystem()
        return fs, f"{root}/{STATE_FILE}"

    def _save(self) -> None:
        where = self._state_file()
        if where is None:
            return
        fs, path = where
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        write_bytes(fs, path, pickle.dumps({"cells": self.cells, "stopped": self.stopped}))

    def _load(self) -> None:
        """Once, on first use: the cells' state saved by an earlier driver of the same experiment."""
        if self._loaded:
            return
        self._loaded = True
        where = self._state_file()
        if where is None:
            return
        fs, path = where
        saved = read_file(fs, path, pickle.loads, "the scheduler's state")
        if saved is not None:
            self.cells, self.stopped = saved["cells"], saved["stopped"]


def build_scheduler(settings: Scheduler, paths: ExperimentPaths | None) -> TrialScheduler | None:
    """The sweep's scheduler (None for ``none``: every trial runs to its last epoch); it compares
    the trials' signed score (:data:`~dptune.schema.metrics.SCORE`)."""
    if settings.name == "none":
        return None
    return PerCellScheduler(settings, state=paths)
