"""The sweep's own progress log: one line per ended trial, and a live line while trials run long
(Ray Tune's tables and boxes, and what trials print, are behind ``dptune sweep --verbose``)."""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from ray import tune

from ...schema import BATCH_SIZE, CLIP_BOUND, DEFAULT_METRIC, LEARNING_RATE, METRICS
from ..store.layout import ExperimentPaths, added_trials
from ..store.records import reported, stopped_early
from .trial_errors import error_line

#: Seconds without a line before the live line shows: refreshed in place on a terminal (at most
#: once a second), one line a minute when the output is a file.
LIVE_AFTER_S = {"terminal": 10.0, "file": 60.0}
TERMINAL_REFRESH_S = 1.0


class TrialLines(tune.Callback):
    """Prints ``[k/total] status cell C B η: the selected metric, ε spent (seconds)`` when a trial ends,
    and an ERRORED trial's error in its last line (the traceback stays in the trial's error file);
    with ``paths``, the total counts the trials bracketing and racing added so far (``[k/total+added]``).

    While trials run and nothing was printed for a while (:data:`LIVE_AFTER_S`), a live line says how
    many run and where the slowest stands (step of T, seconds): on a terminal one line rewritten in
    place, into a file one line a minute. ``clock`` is the time source (tests pass their own)."""

    def __init__(self, total: int | None = None, paths: ExperimentPaths | None = None, *,
                 out: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.paths = paths
        self.ended = 0
        self.out = out
        self.clock = clock
        self._started: dict[str, float] = {}
        self._added_count = 0        # the last count of added trials read (kept while the record cannot be read)
        self._printed = clock()      # when the last line (a trial's, or a live one into a file) was written
        self._live_shown = False     # a live line stands on the terminal (cleared before the next line)

    @property
    def _stream(self) -> TextIO:
        return self.out if self.out is not None else sys.stdout

    def _terminal(self) -> bool:
        isatty = getattr(self._stream, "isatty", None)
        return bool(isatty and isatty())

    def on_trial_start(self, iteration: int, trials: list, trial: "tune.experiment.Trial", **info) -> None:
        self._started.setdefault(trial.trial_id, self.clock())

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        running = [t for t in trials if getattr(t, "status", None) == "RUNNING"]
        now, terminal = self.clock(), self._terminal()
        if not running:
            self._clear()
            return
        if now - self._printed < LIVE_AFTER_S["terminal" if terminal else "file"]:
            return
        line = self.live_line(running, now)
        if terminal:
            self._stream.write("\r\033[K" + line)
            self._stream.flush()
            self._live_shown = True
            self._printed = now - LIVE_AFTER_S["terminal"] + TERMINAL_REFRESH_S   # refresh in a second
        else:
            print(line, file=self._stream, flush=True)
            self._printed = now

    def live_line(self, running: list, now: float) -> str:
        """``running  k trial(s); slowest: cell C B η seed  step s/T  (seconds)``: the running trial
        furthest from its end (the smallest share of its T steps done)."""
        def done(trial) -> float:
            last, steps = trial.last_result or {}, _steps(trial)
            return float(last.get("step") or 0) / steps if steps else 0.0

        slowest = min(running, key=done)
        step, steps = int((slowest.last_result or {}).get("step") or 0), _steps(slowest)
        parts = [f"[{self._count()}]" if self.total else "", f"{'running':<8}",
                 f"{len(running)} trial{'s' if len(running) > 1 else ''}; slowest:", *self._describe(slowest)]
        parts.append(f"step {step}/{steps}" if steps else f"step {step}")
        started = self._started.get(slowest.trial_id)
        if started is not None:
            parts.append(f"({now - started:.0f} s)")
        return "  ".join(p for p in parts if p)

    def _clear(self) -> None:
        """Take the terminal's live line away (the next trial line takes its place)."""
        if self._live_shown:
            self._stream.write("\r\033[K")
            self._stream.flush()
            self._live_shown = False

    def on_trial_complete(self, iteration: int, trials: list, trial: "tune.experiment.Trial", **info) -> None:
        if not reported(trial.last_result):   # stopped before it ran (the sweep stopped)
            return
        if (trial.last_result or {}).get("error"):   # it reported its error and ended (not retried)
            self._line(trial, "ERRORED")
        else:
            self._line(trial, "stopped" if stopped_early(trial.last_result) else "finished")

    def on_trial_error(self, iteration: int, trials: list, trial: "tune.experiment.Trial", **info) -> None:
        self._line(trial, "ERRORED", error_line(trial))

    def _added(self) -> str:
        """``+N``: the trials bracketing and racing added beyond the plan so far (read from their record;
        while the storage cannot be read, the count last read: a display must not fail the trial it shows)."""
        if self.paths is not None:
            try:
                self._added_count = sum(map(added_trials, self.paths.saved_bracketing().values()))
            except OSError:
                pass
        return f"+{self._added_count}" if self._added_count else ""

    def _count(self) -> str:
        return f"{self.ended}/{self.total}{self._added()}" if self.total else str(self.ended)

    @staticmethod
    def _describe(trial: "tune.experiment.Trial") -> list[str]:
        """The trial's cell and its C, B, η and seed."""
        train = trial.config if isinstance(trial.config, dict) else {}
        parts = [str(train.get("cell", trial.trial_id))]
        if CLIP_BOUND in train:
            parts.append(f"C={train[CLIP_BOUND]:g} B={train.get(BATCH_SIZE)} η={train.get(LEARNING_RATE, 0):.3g}"
                         + (f" seed={train['seed']}" if "seed" in train else ""))
        return parts

    def _line(self, trial: "tune.experiment.Trial", status: str, error: str | None = None) -> None:
        self.ended += 1
        train = trial.config if isinstance(trial.config, dict) else {}
        last = trial.last_result or {}
        parts = [f"[{self._count()}]", f"{status:<8}", *self._describe(trial)]
        metric = train.get("metric", DEFAULT_METRIC)
        value = last.get(metric)
        if value is not None and value == value:   # a trial that failed before its first epoch has NaN
            parts.append(f"{METRICS[metric].short if metric in METRICS else metric} {value:.4f}")
        if "epsilon_spent" in last:
            parts.append(f"ε {last['epsilon_spent']:.3g}")
        now = self.clock()
        started = self._started.pop(trial.trial_id, None)
        if started is not None:
            parts.append(f"({now - started:.1f} s)")
        line = "  ".join(parts)
        if error or last.get("error"):
            line += f": {error or last['error']}"
        self._clear()
        print(line, file=self._stream, flush=True)
        self._printed = now


def _steps(trial: "tune.experiment.Trial") -> int | None:
    """A trial's T: from its reports, or its config before the first."""
    steps = (trial.last_result or {}).get("steps") or (trial.config if isinstance(trial.config, dict) else {}).get("steps")
    return int(steps) if steps else None
