"""How a trial's error ends it: retried, recorded, or the sweep stopped (docs/architecture.md, "Errors").

- An error of the input or the environment (a :class:`~dptune.errors.UserError`: a bad option, a
  missing file, model or extra; an ``ImportError``) recurs in every trial: it is not retried. The
  trial reports it (``error``, ``recurring``) and ends; :class:`StopOnRecurringError` stops the sweep,
  whose driver then names the error in one line (:func:`recurring_error`).
- A diverged trial (its loss no longer finite: :class:`~dptune.trainables.epoch_loop.TrialDiverged`) is an
  outcome, not a failure: its last epoch's report carries the ``error``; it is recorded per trial,
  never retried, and never stops the sweep (a diverged η brackets the optimum from above).
- Anything else (a node lost, a killed worker, a bug) is retried up to ``failure.max_failures``.

Torch-free: the trial function's module imports this one on the driver.
"""
from __future__ import annotations

from typing import Iterable

from ray import tune

from ...schema import DEFAULT_METRIC, SCORE
from ...errors import UserError
from .trial_config import PACK

#: The report key that marks a trial's error as one of its input or environment.
RECURRING = "recurring"


def recurring(error: BaseException) -> bool:
    """An error that every trial would meet again: of the input or the environment, not a divergence."""
    from ...trainables.epoch_loop import TrialDiverged   # the trial's process has the trainer loaded

    return isinstance(error, ImportError) or (isinstance(error, UserError) and not isinstance(error, TrialDiverged))


def diverged(error: BaseException) -> bool:
    from ...trainables.epoch_loop import TrialDiverged

    return isinstance(error, TrialDiverged)


def failure_report(config: dict, error: BaseException) -> dict:
    """The last report of a trial (or of each member of a pack) that met an error of its input: the
    error's one line, marked recurring, and the sweep's metric and score as NaN (Ray Tune wants them)."""
    message = f"{type(error).__name__}: {error}" if not isinstance(error, UserError) else str(error)
    metric = (config[PACK][0] if PACK in config else config).get("metric", DEFAULT_METRIC)
    report = {metric: float("nan"), SCORE: float("nan"), "error": message, RECURRING: 1}
    if PACK in config:
        report["members"] = {str(k): {"error": message, "member_status": "ended"} for k in range(len(config[PACK]))}
    return report


class StopOnRecurringError(tune.Stopper):
    """Stops the sweep once a trial reports an error of its input or environment (``recurring``)."""

    def __init__(self) -> None:
        self.seen = False

    def __call__(self, trial_id: str, result: dict) -> bool:
        if result.get(RECURRING):
            self.seen = True
        return bool(result.get(RECURRING))

    def stop_all(self) -> bool:
        return self.seen


def recurring_error(results: Iterable[dict]) -> str | None:
    """The first recurring error among the trials' last results (None: there was none)."""
    return next((str(r["error"]) for r in results if r and r.get(RECURRING)), None)


def error_line(trial: "tune.experiment.Trial") -> str:
    """The last line of a failed trial's error (the exception type and message), or a placeholder: what
    its store row and its ERRORED line say (the traceback stays in the trial's error file)."""
    try:
        err = trial.get_pickled_error()
    except Exception:  # storage unreachable: fall back to the text file
        err = None
    text = str(err) if err is not None else ""
    if not text and trial.error_file:
        try:
            with open(trial.error_file) as f:
                text = f.read()
        except OSError:
            text = ""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "trial failed (no error message recorded)"
