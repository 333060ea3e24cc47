"""`dptune sweep` and `dptune resume`: validate and plan a spec, run it on Ray Tune, report.

Every trial of the plan is handed out by the plan's searcher (grid, random or Optuna), whose
state Ray Tune checkpoints with the experiment, so `resume` continues the same search.
"""
from __future__ import annotations

import dataclasses
import sys
from types import SimpleNamespace
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, TextIO

import ray
from ray import tune

from ...schema import BATCH_SIZE, DEFAULT_METRIC, SCORE
from ...errors import UserError
from ...timeline import mark
from ...search_spaces import SweepPlan, format_plan, load_spec, plan_sweep
from . import spec_sections  # noqa: F401  (registers the platform's spec sections)
from .catalog import trainables_catalog
from .equivalence import EquivalenceLog, write_equivalent_rows
from .kept import keeping, kept_results
from .live_status import mark_ended
from .launcher import RunSettings, max_concurrent, resourced, run_config, start_ray, trial_slots
from ..store.durable import read_json, write_json
from ..store.layout import DEFAULT_SPEC, PLAN_FILE, SETTINGS_FILE, ExperimentPaths, absolute
from .pack_policy import PackPolicy
from .packs import ending, members
from .trial_errors import recurring_error
from .ray_setup import console
from .ray_tasks import RayTasks
from .schedulers import build_scheduler
from .searcher import SweepSearcher
from .selection_release import release_selections
from ..store.records import reported
from ..store.storage_check import check_storage
from ..store.results_store import ResultsStore
from .trial_function import dp_trainable



@dataclass
class SweepOutcome:
    """What a sweep (or its resume) ended with: where, how many trials finished or errored, and
    Ray Tune's results (each trial's config, last result and checkpoint)."""

    paths: ExperimentPaths
    finished: int
    errored: int
    results: tune.ResultGrid | None = None
    #: planned trials that have not ended (handed out and lost, queued, cells with configurations
    #: left): 0 for a complete sweep; `dptune resume` runs the rest
    unrun: int = 0
    #: the metric the sweep selected on (``SweepPlan.metric``)
    metric: str = DEFAULT_METRIC
    #: the error of its input or environment that stopped the sweep (it would recur in every trial)
    recurring: str | None = None


def prepare(spec_path: str | None, *, storage: str | None = None, progress: bool = True,
            out: TextIO | None = None, address: str | None = None, start_local_ray: bool = False,
            check: Callable[[RunSettings], None] | None = None,
            verbose: bool = False) -> tuple[SweepPlan, RunSettings]:
    """Validate and plan a spec (the embedded default when None) before any trial is launched.

    ``check`` vets the run settings before anything starts (e.g. refuses an earlier run's folder);
    the storage must take a write first.
    With ``address`` (a Ray cluster), the σ the plan lacks are calibrated as Ray tasks across it;
    with ``start_local_ray``, local Ray starts while they are calibrated (in other processes): a
    sweep's first trial then waits for neither in turn. ``verbose``: Ray Tune's own tables and what
    the trials print reach the console (``dptune sweep --verbose``)."""
    spec = load_spec(spec_path or DEFAULT_SPEC, trainables_catalog())
    settings = RunSettings(experiment=spec["experiment"], storage=absolute(storage or spec["storage"]),
                           resources=spec["resources"], max_failures=spec["failure"], tracking=spec["tracking"],
                           verbose=2 if verbose else 0)
    check_storage(settings.storage)
    if check is not None:
        check(settings)
    if address:
        start_ray(address, log_to_driver=verbose)
        plan = plan_sweep(spec, trainables_catalog(), progress=progress, executor=RayTasks(), draw=True)
    elif start_local_ray:
        with ThreadPoolExecutor(max_workers=1) as planner:
            planning = planner.submit(plan_sweep, spec, trainables_catalog(), progress=progress, draw=True)
            start_ray(log_to_driver=verbose)
            plan = planning.result()
    else:
        plan = plan_sweep(spec, trainables_catalog(), progress=progress, draw=True)
    mark("planned", ray_started=ray.is_initialized())
    packing = PackPolicy.for_sweep(plan.space.search, settings.resources)
    print(format_plan(plan, dry_run=False, pack_line=packing.cell_line if packing else None), file=out)
    for note in plan.notes:
        print(f"note: {note}", file=out)
    return plan, settings


def run_sweep(plan: SweepPlan, settings: RunSettings, *, address: str | None = None,
              out: TextIO | None = None, trainable: Callable[[dict], None] | None = None) -> SweepOutcome:
    """Run every trial of ``plan`` on Ray Tune; the store callback writes each one as it ends.
    Trials get flat configs (:mod:`dptune.platform.sweep.trial_config`); the spec's scheduler, if any, stops hopeless
    trials within their cell. ``trainable`` replaces the DP trainable (tests, benchmarks)."""
    start_ray(address, log_to_driver=bool(settings.verbose))
    scheduler = build_scheduler(plan.space.search.scheduler, settings.paths.absolute())
    packing = PackPolicy.for_sweep(plan.space.search, settings.resources, trial_slots(settings))
    searcher = SweepSearcher(plan, metric=SCORE, on_equivalent=EquivalenceLog(settings.paths.absolute()),
                             pack=packing, paths=settings.paths.absolute())
    tuner = tune.Tuner(
        resourced(settings) if trainable is None else resourced(settings, trainable),
        tune_config=tune.TuneConfig(search_alg=searcher,
                                    num_samples=-1,
                                    scheduler=scheduler, reuse_actors=True,
                                    max_concurrent_trials=max_concurrent(settings)),
        run_config=run_config(settings, plan.num_trials, searcher),
    )
    settings.paths.create(owner_only=plan.space.selection.private)
    _save_settings(settings)
    _save_plan(plan, settings)
    print(f"dptune: running {plan.num_trials} trials; experiment at {settings.paths.root}\n"
          f"        if this is interrupted, continue with: dptune resume {settings.paths.root}", file=out)
    mark("tune_fit")
    results = tuner.fit()
    mark("tune_done")
    return _outcome(results, settings, searcher, out)


def resume_sweep(root: str, *, restart_errored: bool = False, address: str | None = None,
                 out: TextIO | None = None, trainable: Callable[[dict], None] | None = None) -> SweepOutcome:
    """Continue an interrupted sweep: unfinished trials resume from their checkpoints, errored
    ones resume (or restart from scratch), finished ones are kept; the searcher's state is restored.
    A configuration the results store holds as ended is not trained again (see :mod:`dptune.platform.sweep.kept`); one
    the searcher handed out before the kill that Ray Tune's snapshot lost is trained now (see
    :meth:`dptune.platform.sweep.searcher.SweepSearcher.reconcile`)."""
    paths = ExperimentPaths(root).absolute()
    if not tune.Tuner.can_restore(paths.root):
        raise UserError(f"no restorable experiment at {root!r}: pass the folder "
                         "<storage>/<experiment> that `dptune sweep` printed")
    settings = load_settings(paths)
    start_ray(address, log_to_driver=bool(settings.verbose))
    console(bool(settings.verbose))
    kept = kept_results(ResultsStore(settings.paths.store))  # what ended, even if Ray's snapshot lags
    function = keeping(trainable or dp_trainable, kept)
    tuner = tune.Tuner.restore(paths.root, resourced(settings, function), resume_unfinished=True,
                               resume_errored=not restart_errored, restart_errored=restart_errored)
    print(f"dptune: resuming {paths.root}", file=out)
    results = tuner.fit()
    return _outcome(results, settings, SweepSearcher.saved(paths), out)


def _save_settings(settings: RunSettings) -> None:
    """Keep the run settings beside Ray's experiment state, so `resume` uses the same resources."""
    fs, root = settings.paths.filesystem()
    write_json(fs, f"{root}/{SETTINGS_FILE}", dataclasses.asdict(settings))


def plan_record(plan: SweepPlan) -> dict:
    """What the report and ``dptune status`` need of the plan a sweep ran: its pruning rules and, per
    cell (keyed as the store's ``cell`` column), N, every candidate B with whether it was kept and
    searched, its planned trials (an upper bound for a search that can converge) and epochs."""
    pruning = plan.space.pruning
    return {"pruning": {"min_steps": pruning.min_steps, "plateau_tol": pruning.plateau_tol,
                        "max_batch_sizes": pruning.max_batch_sizes},
            "cells": {c.cell.key: {"dataset_size": c.dataset_size,
                                   "batch_sizes": [int(r[BATCH_SIZE]) for r in c.rows],
                                   "kept": [int(r[BATCH_SIZE]) for r in c.rows if r["kept"]],
                                   "searched": [int(b) for b in c.searched_batch_sizes],
                                   "trials": c.num_trials, "epochs": c.cell.epochs} for c in plan}}


def _save_plan(plan: SweepPlan, settings: RunSettings) -> None:
    """Keep the plan beside the store, so `dptune report` draws the rules the sweep used."""
    fs, root = settings.paths.filesystem()
    write_json(fs, f"{root}/{PLAN_FILE}", plan_record(plan), indent=1)


def load_settings(paths: ExperimentPaths) -> RunSettings:
    fs, root = paths.filesystem()
    saved = read_json(fs, f"{root}/{SETTINGS_FILE}", "the run settings")
    if saved is None:
        raise UserError(f"{paths.root} was not started by `dptune sweep` (no {SETTINGS_FILE})")
    return RunSettings.from_dict(saved)


def _outcome(results: tune.ResultGrid, settings: RunSettings, searcher: SweepSearcher | None,
             out: TextIO | None = None) -> SweepOutcome:
    write_equivalent_rows(settings.paths.absolute())   # clip-equivalent trials: recorded, not trained
    release_selections(results, settings.paths.absolute(), out=out)   # private selection: best trial, tested once
    # stopped trials count as finished here; a pack counts its members, each by its own ending
    ran = [r for r in results if r.error is not None or reported(r.metrics)]   # not those stopped before they ran
    endings = [ending(m, "failed" if r.error is not None else None)[0] for r in ran
               for m in members(SimpleNamespace(config=r.config, trial_id="", last_result=r.metrics))]
    errored = endings.count("error")
    unrun = searcher.unrun() if searcher is not None else 0
    mark_ended(settings.paths.absolute(), unrun)
    if unrun:
        print(f"dptune: the plan is not complete: {unrun} planned trial(s) did not run; "
              f"`dptune resume {settings.paths.root}` runs them", file=out)
    metric = searcher.plan.metric if searcher is not None else DEFAULT_METRIC
    return SweepOutcome(settings.paths, len(endings) - errored, errored, results, unrun, metric,
                        recurring_error(r.metrics for r in results))

