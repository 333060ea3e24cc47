"""Driver-side Ray Tune callback that writes every finished or errored trial to the results store."""
from __future__ import annotations

from ray import tune

from .faults import fault_point
from .kept import KEPT, config_id
from .layout import ExperimentPaths
from .records import epoch_rows, gradnorm_rows, trial_row
from .store import ResultsStore, first_line, retrying
from .trial_config import resolved
from .tune_adapter import checkpoint_state


#: Merge the per-trial files whenever this many have accumulated: a query then reads at most this
#: many small files plus the store's few parts (reading a file costs ~0.3 ms whatever its size).
COMPACT_EVERY = 64



class StoreCallback(tune.Callback):
    """Writes a trial's row, its per-epoch curve and its gradient-norm statistics when it ends,
    and merges the per-trial files every ``compact_every`` trials."""

    def __init__(self, paths: ExperimentPaths, compact_every: int = COMPACT_EVERY) -> None:
        self.paths = paths
        self.compact_every = compact_every
        self._store: ResultsStore | None = None

    @property
    def store(self) -> ResultsStore:
        if self._store is None:
            self._store = ResultsStore(self.paths.store)
        return self._store

    def on_trial_complete(self, iteration: int, trials: list, trial: "tune.experiment.Trial", **info) -> None:
        self._write(trial, status="stopped" if stopped_early(trial.last_result) else "finished")

    def on_trial_error(self, iteration: int, trials: list, trial: "tune.experiment.Trial", **info) -> None:
        self._write(trial, status="error", error=_error_message(trial))

    def _write(self, trial: "tune.experiment.Trial", *, status: str, error: str | None = None) -> None:
        last = dict(trial.last_result or {})
        if last.get(KEPT):  # reported again from the store on resume: its rows are already there
            return
        try:  # storage that is restarting or unreachable is waited for, as the store's writes wait
            state = retrying(lambda: checkpoint_state(trial.checkpoint), self.store.write_retry_s)
        except OSError as exc:  # its checkpoint is lost for good: the row, without its curve, says so
            state = None
            error = error or ("its per-epoch curve was not recorded: the trial's checkpoint could not be read "
                              f"({first_line(exc)})")
        history = state["history"] if state else []
        last["history"] = history
        row = trial_row(trial.trial_id, resolved(trial.config), last, status=status, error=error,
                        experiment=self.paths.name)
        row["config_id"] = config_id(trial.config)
        self.store.write_trial(row, epoch_rows(history, row["metric"]), gradnorm_rows(history))
        self.store.compact_every(self.compact_every)
        fault_point("trial_recorded")


def stopped_early(last: dict | None) -> bool:
    """Whether a trial that ended without error took fewer steps than planned (a scheduler stopped it)."""
    last = last or {}
    step, steps = last.get("step"), last.get("steps")
    return step is not None and steps is not None and int(step) < int(steps)


def _error_message(trial: "tune.experiment.Trial") -> str:
    """The last line of the trial's error (the exception type and message), or a placeholder."""
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
