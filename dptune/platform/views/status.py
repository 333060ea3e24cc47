"""``dptune status EXPERIMENT``: where a sweep stands, while it runs and after, local or s3://.

Per cell: trials finished, running, pending, stopped (early, by the scheduler) and errored, the best
so far with its (C, B, η), and trial-epochs spent against the plan; for the sweep, an ETA from the
rate of trial-epochs so far; under the table, the errored trials' messages and where each one's
traceback is (Ray Tune's ``error.txt`` in the trial's folder). Read from the plan the sweep saved (planned trials and epochs per
cell: an upper bound where a search can converge or a scheduler stop trials), the results store
(ended trials) and the live file of running trials (``live_status``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd
import pyarrow.fs as pafs

from ...errors import UserError
from ...schema import HYPERPARAMETERS, METRICS, NON_PRIVATE_LABEL, figure, non_private
from ..store.durable import read_json
from ..store.layout import ExperimentPaths, added_trials, filesystem
from ..store.results_store import ResultsStore, selected_values

COLUMNS = ("cell", "finished", "running", "pending", "stopped", "errored", "best (mean over seeds)", "trial-epochs")
#: Statuses whose accuracy is a whole run's (a clip-equivalent trial has its source's): what the
#: sweep's closing lines, ``optima.csv`` and the report average over seeds.
COMPLETE = ("finished", "equivalent")
#: What each cell searches (the trial schema's hyperparameters: C, B, η).
SETTING = list(HYPERPARAMETERS)
#: Errored trials listed under the table (the rest are counted, with the query that lists them).
SHOWN_ERRORS = 5
ERROR_FILE = "error.txt"   # Ray Tune's traceback file in a failed trial's folder


@dataclass(frozen=True)
class TrialError:
    """An errored trial as ``dptune status`` lists it: its message and its traceback file (None: the
    trial reported its error and ended, e.g. a divergence; nothing was raised)."""

    trial_id: str
    cell: str
    message: str
    traceback: str | None


@dataclass
class SweepStatus:
    """One reading of a sweep's state: the per-cell table and the totals."""

    table: pd.DataFrame
    spent: float          # trial-epochs done (ended trials' epochs and running trials' epochs so far)
    planned: float        # trial-epochs the plan allows (an upper bound)
    eta_s: float | None   # seconds left at the rate so far (None: no rate yet or nothing left)
    running: int
    pending: int
    unrun: int = 0        # the driver ended with this many planned trials not run (`dptune resume` runs them)
    metrics: tuple = ()   # the metrics the best column holds (those a store's trials selected on)
    added: int = 0        # trials bracketing and racing added beyond the plan so far (counted in ``planned``)
    errors: tuple = ()    # the errored trials (:class:`TrialError`), as many as the store holds

    @property
    def done(self) -> bool:
        return self.running == 0 and self.pending == 0

    def render(self) -> str:
        """The table and a closing line, as ``dptune status`` prints them."""
        cells = [[str(v) for v in row] for row in self.table.itertuples(index=False)]
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(COLUMNS)]

        def line(values: list[str]) -> str:
            return "  ".join(v.ljust(w) if c in ("cell", COLUMNS[6]) else v.rjust(w)
                             for v, w, c in zip(values, widths, COLUMNS)).rstrip()

        lines = [line(list(COLUMNS)), *map(line, cells)]
        share = self.spent / self.planned if self.planned else 1.0
        tail = f"trial-epochs {self.spent:g} of at most {self.planned:g} planned ({share:.0%})"
        if self.added:
            tail += f" (with {self.added} trial(s) bracketing or racing added beyond the plan)"
        if self.done:
            tail += "; nothing running or pending"
            if self.unrun:
                tail += f"; the sweep stopped with {self.unrun} planned trial(s) not run: `dptune resume` runs them"
        elif self.eta_s is not None:
            tail += f"; ETA ≤ {_duration(self.eta_s)} at the rate so far (the plan is an upper bound)"
        notes = [f"best: {METRICS[m].label if m in METRICS else m} is {NON_PRIVATE_LABEL} ({figure(m).reason})"
                 for m in non_private(list(self.metrics))]
        return "\n".join(lines + [tail] + notes + self._error_lines())

    def _error_lines(self) -> list[str]:
        if not self.errors:
            return []
        lines = [f"errored trials ({len(self.errors)}):"]
        for e in self.errors[:SHOWN_ERRORS]:
            lines.append(f"  {e.trial_id}  {e.cell}: {e.message}")
            if e.traceback:
                lines.append(f"    traceback: {e.traceback}")
        if len(self.errors) > SHOWN_ERRORS:
            lines.append(f"  … and {len(self.errors) - SHOWN_ERRORS} more: dptune query <experiment> "
                         "\"SELECT trial_id, cell, error FROM trials WHERE status = 'error'\"")
        return lines


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(round(seconds)), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m" if hours else f"{m}m{s:02d}s" if m else f"{s}s"


def best_setting(trials: pd.DataFrame) -> str:
    """A cell's best (C, B, η) so far as the sweep's closing lines give it: the best mean over seeds
    of its complete runs (finished, or clip-equivalent to one), stopped runs left out, by the signed
    score (higher is better, whatever the metric), shown in the metric's own value; "—" if none."""
    done = trials[trials["status"].isin(COMPLETE)] if len(trials) else trials
    if len(done):
        selected = selected_values(done)
        done = done[SETTING].assign(value=selected["value"], score=selected["score"]).dropna(subset=["value"])
    if not len(done):
        return "—"
    means = done.groupby(SETTING).agg(mean=("value", "mean"), score=("score", "mean"), size=("value", "size"))
    best = means["score"].idxmax()
    (c, b, lr), top = best, means.loc[best]
    return f"{top['mean']:.3f} (C={c:g}, B={int(b)}, η={lr:.3g}; {int(top['size'])} seed{'s' if top['size'] > 1 else ''})"


def read_status(path: str, now: float | None = None) -> SweepStatus:
    """The status of the sweep whose experiment folder (or store) is ``path``."""
    paths = ExperimentPaths(path.rstrip("/") or "/")
    plan = paths.saved_plan()
    if plan is None:
        raise UserError(f"{paths.root}: no sweep here (no saved plan; `dptune sweep` writes one when it starts)")
    store_fs, store_path = filesystem(paths.store)
    store_exists = store_fs.get_file_info(store_path).type == pafs.FileType.Directory
    trials = ResultsStore(paths.store).table("trials") if store_exists else pd.DataFrame()
    epochs = ResultsStore(paths.store).table("epochs") if store_exists else pd.DataFrame()
    live_fs, live_path = filesystem(paths.live)
    live_file = read_json(live_fs, live_path, "the live status") or {}
    live = live_file.get("running", {})
    ended = bool(live_file.get("ended"))   # the driver ended: the plan's upper bound was all it would run
    plan_fs, plan_path = filesystem(paths.plan)
    started = plan_fs.get_file_info(plan_path).mtime
    rows, spent_total, planned_total, running_total, pending_total = [], 0.0, 0.0, 0, 0
    brackets, added = paths.saved_bracketing(), 0   # trials bracketing and racing added beyond the plan, per cell
    for key, cell in plan["cells"].items():
        mine = trials[trials["cell"] == key] if "cell" in trials else trials.iloc[0:0]
        counts = mine["status"].value_counts() if "status" in mine else pd.Series(dtype=int)
        running = [r for r in live.values() if r.get("cell") == key]
        done_trials = int(counts.sum())
        extra = added_trials(brackets.get(key, {}))
        planned = int(cell.get("trials", done_trials + len(running))) + extra
        added += extra
        pending = 0 if ended else max(planned - done_trials - len(running), 0)
        spent = float(len(epochs[epochs["trial_id"].isin(mine["trial_id"])])) if len(mine) and "trial_id" in epochs \
            else 0.0
        spent += sum(r.get("epoch", 0) for r in running)
        best = best_setting(mine)
        budget = planned * float(cell.get("epochs", 0))
        rows.append({"cell": key, "finished": int(counts.get("finished", 0)), "running": len(running),
                     "pending": pending, "stopped": int(counts.get("stopped", 0)),
                     "errored": int(counts.get("error", 0)), COLUMNS[6]: best,
                     "trial-epochs": f"{spent:g}/{budget:g}"})
        spent_total, planned_total = spent_total + spent, planned_total + budget
        running_total, pending_total = running_total + len(running), pending_total + pending
    elapsed = ((now or time.time()) - started.timestamp()) if started is not None else None
    eta = None
    if elapsed and spent_total > 0 and (running_total or pending_total):
        eta = max(planned_total - spent_total, 0.0) / (spent_total / elapsed)
    metrics = tuple(sorted(set(trials["metric"].dropna()))) if "metric" in trials else ()
    errored = trials[trials["status"] == "error"] if "status" in trials else trials.iloc[0:0]
    return SweepStatus(pd.DataFrame(rows, columns=COLUMNS), spent_total, planned_total, eta, running_total,
                       pending_total, int(live_file.get("unrun", 0)) if ended else 0, metrics, added,
                       trial_errors(paths, errored))


def trial_errors(paths: ExperimentPaths, errored: pd.DataFrame) -> tuple[TrialError, ...]:
    """Each errored trial's message and traceback file: Ray Tune names a trial's folder
    ``<trainable>_<trial id>_…`` (a pack member's is its pack's, ``<pack id>-m<k>``)."""
    if not len(errored):
        return ()
    fs, root = paths.filesystem()
    folders = [info.base_name for info in fs.get_file_info(pafs.FileSelector(root))
               if info.type == pafs.FileType.Directory]
    out = []
    for row in errored.sort_values("trial_id").itertuples():
        own = str(row.trial_id).split("-m")[0]
        traceback = next((f"{paths.root.rstrip('/')}/{name}/{ERROR_FILE}" for name in folders
                          if f"_{own}_" in name and fs.get_file_info(f"{root}/{name}/{ERROR_FILE}").type
                          == pafs.FileType.File), None)
        out.append(TrialError(str(row.trial_id), str(row.cell), str(row.error or "no message recorded"), traceback))
    return tuple(out)
