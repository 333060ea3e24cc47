"""Driver-side Ray Tune callback that writes every finished or errored trial to the results store.

No ended trial goes without its row: a write that fails (the store unreachable or full after the
store's retries) is reported once and tried again at every later trial end and when the sweep
ends, and the first step of a resumed sweep records every trial Ray Tune holds as ended that
the store lacks (a row lost to a crash, a failed write, a quarantined file), from its checkpoint.
A pack trial (:mod:`dptune.platform.sweep.packs`) is written as one row per member, each with its own status and curve.
That first step also tells a restored searcher which trials Ray Tune's snapshot holds, so it hands
out again what it handed out before the kill and the snapshot lost (:meth:`SweepSearcher.reconcile
<dptune.platform.sweep.searcher.SweepSearcher.reconcile>`): the callback holds the searcher, and Ray
Tune pickles both in one experiment state, so the one it restores is the one the callback holds.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ray import tune

from ..faults import fault_point
from .kept import KEPT, config_id
from ..store.layout import ExperimentPaths
from .packs import ending, history_of, members
from ..store.records import epoch_rows, gradnorm_rows, reported, trial_row
from ..store.results_store import ResultsStore, StoreWriteError, first_line, retrying
from .trial_config import resolved
from .trial_errors import error_line
from .tune_adapter import checkpoint_state

if TYPE_CHECKING:
    from .searcher import SweepSearcher


#: Merge the per-trial files whenever this many have accumulated: a query then reads at most this
#: many small files plus the store's few parts (reading a file costs ~0.3 ms whatever its size).
COMPACT_EVERY = 64



class StoreCallback(tune.Callback):
    """Writes a trial's row, its per-epoch curve and its gradient-norm statistics when it ends,
    and merges the per-trial files every ``compact_every`` trials."""

    def __init__(self, paths: ExperimentPaths, compact_every: int = COMPACT_EVERY,
                 searcher: "SweepSearcher | None" = None) -> None:
        self.paths = paths
        #: the sweep's searcher: pickled with this callback in Ray Tune's experiment state, it is the
        #: very searcher Ray Tune restores on resume, told here which trials the snapshot holds
        self.searcher = searcher
        self.compact_every = compact_every
        self._store: ResultsStore | None = None
        self._started = False
        #: trials whose rows could not be written yet: trial id → (trial, status, error)
        self._unrecorded: dict[str, tuple] = {}

    @property
    def store(self) -> ResultsStore:
        if self._store is None:
            self._store = ResultsStore(self.paths.store)
        return self._store

    def on_step_begin(self, iteration: int, trials: list, **info) -> None:
        if self._started:
            return
        self._started = True
        if trials:  # a restored experiment: Ray Tune's snapshot is known now, before any suggestion
            if self.searcher is not None:
                self.searcher.reconcile(trials)
            self._record_missing(trials)

    def on_trial_complete(self, iteration: int, trials: list, trial: "tune.experiment.Trial", **info) -> None:
        if not reported(trial.last_result):   # stopped before it ran: `dptune resume` runs it
            return
        for member in members(trial):
            self._record(member, *ending(member))

    def on_trial_error(self, iteration: int, trials: list, trial: "tune.experiment.Trial", **info) -> None:
        message = error_line(trial)
        for member in members(trial):
            self._record(member, *ending(member, message))

    def on_experiment_end(self, trials: list, **info) -> None:
        self._retry_unrecorded()
        for trial, _, _ in self._unrecorded.values():
            print(f"dptune: trial {trial.trial_id} has no row in the results store yet: `dptune resume "
                  f"{self.paths.root}` records it once the store takes writes", file=sys.stderr)

    def _record(self, trial: "tune.experiment.Trial", status: str, error: str | None = None) -> None:
        """Write the trial's (or pack member's) rows; a failed write is reported once and kept for a later try."""
        self._retry_unrecorded()
        try:
            self._write(trial, status=status, error=error)
        except StoreWriteError as exc:
            self._unrecorded[trial.trial_id] = (trial, status, error)
            print(f"dptune: warning: {exc}", file=sys.stderr)
            return
        try:
            self.store.compact_every(self.compact_every)
        except OSError as exc:  # the sweep goes on: the per-trial files stay readable as they are
            print(f"dptune: warning: compacting the results store failed ({first_line(exc)}); "
                  "tried again at the next trial end", file=sys.stderr)
        fault_point("trial_recorded")

    def _retry_unrecorded(self) -> None:
        for trial_id, (trial, status, error) in list(self._unrecorded.items()):
            try:
                self._write(trial, status=status, error=error)
            except StoreWriteError:
                return
            del self._unrecorded[trial_id]

    def _record_missing(self, trials: list) -> None:
        """Write the rows of every ended trial whose configuration the store does not hold."""
        stored = set(self.store.table("trials").get("config_id", []))
        for trial in trials:
            if trial.status not in (trial.TERMINATED, trial.ERROR):
                continue
            message = error_line(trial) if trial.status == trial.ERROR else None
            for member in members(trial):
                if config_id(member.config) not in stored:
                    self._record(member, *ending(member, message))

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
        history = history_of(state, trial)
        last["history"] = history
        row = trial_row(trial.trial_id, resolved(trial.config), last, status=status, error=error,
                        experiment=self.paths.name)
        row["config_id"] = config_id(trial.config)
        self.store.write_trial(row, epoch_rows(history, row["metric"]), gradnorm_rows(history))
