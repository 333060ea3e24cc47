"""The sweep's own progress log: one line per ended trial (Ray Tune's tables and boxes are behind
``dptune sweep --verbose``)."""
from __future__ import annotations

import sys
import time

from ray import tune

from ...schema import METRICS
from ..store.layout import ExperimentPaths
from ..store.records import reported, stopped_early


class TrialLines(tune.Callback):
    """Prints ``[k/total] status cell C B η: the selected metric, ε spent (seconds)`` when a trial ends;
    with ``paths``, the total counts the trials bracketing added so far (``[k/total+added]``)."""

    def __init__(self, total: int | None = None, paths: ExperimentPaths | None = None) -> None:
        self.total = total
        self.paths = paths
        self.ended = 0
        self._started: dict[str, float] = {}

    def on_trial_start(self, iteration: int, trials: list, trial: "tune.experiment.Trial", **info) -> None:
        self._started.setdefault(trial.trial_id, time.monotonic())

    def on_trial_complete(self, iteration: int, trials: list, trial: "tune.experiment.Trial", **info) -> None:
        if not reported(trial.last_result):   # stopped before it ran (the sweep stopped)
            return
        if (trial.last_result or {}).get("error"):   # it reported its error and ended (not retried)
            self._line(trial, "ERRORED")
        else:
            self._line(trial, "stopped" if stopped_early(trial.last_result) else "finished")

    def on_trial_error(self, iteration: int, trials: list, trial: "tune.experiment.Trial", **info) -> None:
        self._line(trial, "ERRORED")

    def _added(self) -> str:
        """``+N``: the trials bracketing added beyond the plan so far (read from its record)."""
        added = sum(int(r.get("added", 0)) * int(r.get("seeds", 1))
                    for r in (self.paths.saved_bracketing() if self.paths is not None else {}).values())
        return f"+{added}" if added else ""

    def _line(self, trial: "tune.experiment.Trial", status: str) -> None:
        self.ended += 1
        train = meta = trial.config if isinstance(trial.config, dict) else {}
        last = trial.last_result or {}
        count = f"{self.ended}/{self.total}{self._added()}" if self.total else str(self.ended)
        parts = [f"[{count}]", f"{status:<8}", str(meta.get("cell", trial.trial_id))]
        if "clip_bound" in train:
            parts.append(f"C={train['clip_bound']:g} B={train.get('batch_size')} η={train.get('learning_rate', 0):.3g}"
                         + (f" seed={train['seed']}" if "seed" in train else ""))
        metric = train.get("metric", "test_accuracy")
        value = last.get(metric)
        if value is not None and value == value:   # a trial that failed before its first epoch has NaN
            parts.append(f"{METRICS[metric].short if metric in METRICS else metric} {value:.4f}")
        if "epsilon_spent" in last:
            parts.append(f"ε {last['epsilon_spent']:.3g}")
        started = self._started.pop(trial.trial_id, None)
        if started is not None:
            parts.append(f"({time.monotonic() - started:.1f} s)")
        line = "  ".join(parts)
        if last.get("error"):
            line += f": {last['error']}"
        print(line, file=sys.stdout, flush=True)
