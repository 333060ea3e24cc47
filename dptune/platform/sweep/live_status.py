"""The running trials of a live sweep, kept in one small file beside the store
(``<experiment>/dptune-state/running.json``) for ``dptune status``: the store records a trial only
once it ends. Written by a driver-side Ray Tune callback when a trial starts or ends, and at most
every ``MIN_INTERVAL_S`` on its reports (a durable replace: local or s3://); emptied when the sweep
ends, when the driver also writes how many planned trials did not run (:func:`mark_ended`: a search that
converged, or a configuration multi-fidelity stopped on its lead seed, leaves planned trials that never
run, and `dptune status` must not wait for them). Best effort: a write the storage refuses is skipped
with one warning, never stopping the sweep."""
from __future__ import annotations

import sys
import time

from ray import tune

from ...schema import HYPERPARAMETERS
from ..store.durable import write_json
from ..store.layout import LIVE_FILE, ExperimentPaths
from ..store.results_store import first_line

#: Shortest time between two writes on reports (starts and ends are always written).
MIN_INTERVAL_S = 2.0


class LiveStatus(tune.Callback):
    """Keeps ``paths.live`` listing the running trials: cell, (C, B, η), epoch reached, start time."""

    def __init__(self, paths: ExperimentPaths) -> None:
        self.paths = paths
        self.running: dict[str, dict] = {}
        self._written = 0.0
        self._warned = False

    def on_trial_start(self, iteration: int, trials: list, trial: "tune.experiment.Trial", **info) -> None:
        config = trial.config
        self.running[trial.trial_id] = {"cell": config.get("cell"),
                                        **{k: config.get(k) for k in HYPERPARAMETERS},
                                        "epoch": 0, "started": time.time()}
        self._write()

    def on_trial_result(self, iteration: int, trials: list, trial: "tune.experiment.Trial", result: dict,
                        **info) -> None:
        if trial.trial_id in self.running and "epoch" in result:
            self.running[trial.trial_id]["epoch"] = int(result["epoch"])
            if time.monotonic() - self._written >= MIN_INTERVAL_S:
                self._write()

    def on_trial_complete(self, iteration: int, trials: list, trial: "tune.experiment.Trial", **info) -> None:
        self.running.pop(trial.trial_id, None)
        self._write()

    on_trial_error = on_trial_complete

    def on_experiment_end(self, trials: list, **info) -> None:
        self.running.clear()
        self._write()

    def _write(self, **extra: object) -> None:
        """Replace the file; a failed write (the storage unreachable) is reported once and skipped:
        the next one brings the file up to date, and the sweep never stops for it."""
        self._written = time.monotonic()
        try:
            fs, path = self.paths.state_file(LIVE_FILE)
            write_json(fs, path, {"updated": time.time(), "running": self.running, **extra})
        except OSError as exc:
            if not self._warned:
                self._warned = True
                print(f"dptune: warning: the live status for `dptune status` could not be written "
                      f"({first_line(exc)}); the sweep goes on", file=sys.stderr)


def mark_ended(paths: ExperimentPaths, unrun: int) -> None:
    """The sweep's driver ended: nothing runs, and ``unrun`` planned trials did not run and will not
    unless `dptune resume` runs them (the rest of the plan's upper bound was never needed)."""
    LiveStatus(paths)._write(ended=True, unrun=int(unrun))
