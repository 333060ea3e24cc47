"""The Ray Tune function of a DP trial, importable without torch.

Ray Tune pickles the trial function by reference, so the sweep's driver imports the module that
defines it: this one is light, and the trial's body (:mod:`dptune.platform.sweep.dp_trial`: torch, the trainer) is
imported in the trial's own process. The driver then starts Ray and calibrates σ without spending
seconds loading torch first.
"""
from __future__ import annotations

from typing import Callable

from ..faults import fault_point
from .trial_errors import diverged, failure_report, recurring


def dp_trainable(config: dict, on_workers: Callable[[dict], None] | None = None) -> None:
    """One DP trial, or a pack of trials (:mod:`dptune.platform.sweep.packs`):
    :func:`dptune.platform.sweep.dp_trial.run_trial` (``on_workers``: a multi-worker trial's Ray Train run, set by
    the launcher).
    A divergence ends it as reported (its last epoch carries the error); an error of its input or
    environment ends it with one report of that error, not retried (:mod:`.trial_errors`); any other
    error is raised, for Ray Tune to retry."""
    from ...timeline import mark

    from .tune_adapter import report, trial_output

    mark("trial_entered", cell=config.get("cell"), seed=config.get("seed"))
    with trial_output():
        fault_point("trial_entered")
        try:
            from .dp_trial import run_trial

            run_trial(config, on_workers)
        except Exception as error:
            if diverged(error):
                return
            if not recurring(error):
                raise
            report(failure_report(config, error))
