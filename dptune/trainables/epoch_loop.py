"""The one training loop: a run of K ≥ 1 members trained epoch by epoch to its last step.

A single trial (:class:`.training.Trainer`) is a run of one member, a pack (:class:`.pack_training.PackTrainer`)
a run of K members stepped by its lead trainer's own step and epoch; both are trained by :func:`fit`,
whichever calls them (``dptune train``, a Ray Tune trial, every Ray Train worker of a multi-worker
trial: :mod:`dptune.platform.sweep.dp_trial`), so restoring, divergence and the final report are handled once, here.
A member whose loss stops being finite is recorded as diverged with its message and retired (a
single trial then ends); the others go on.
"""
from __future__ import annotations

import math
from typing import Callable, Protocol

from tqdm.auto import tqdm

from ..errors import UserError
from ..schema.metrics import LOSSES


class TrialDiverged(UserError, FloatingPointError):
    """The evaluated loss became NaN or infinite (a trial is recorded as errored; ``dptune train``
    says so in one line: a smaller learning rate usually cures it)."""


#: Called after every epoch with each member's metrics of that epoch (None: retired before it).
EpochReport = Callable[[list], None]


def divergence(metrics: dict) -> str | None:
    """Why an epoch's metrics show a diverged run (a loss that is not finite), or None. Private
    selection evaluates nothing before its end: no loss, nothing to check."""
    for name in LOSSES:
        loss = metrics.get(name)
        if loss is not None and not math.isfinite(loss):
            return f"{name.replace('_', ' ')} became {loss} at epoch {metrics.get('epoch')}"
    return None


class Run(Protocol):
    """What :func:`fit` trains: members' histories and errors, an epoch step and a way to retire a member."""

    histories: list[list[dict]]
    errors: list[str | None]

    @property
    def done(self) -> bool:
        """Every member trained to the last step or retired."""

    def epoch_results(self, progress: tqdm | None = None) -> list[dict | None]:
        """Train to the next epoch boundary; each member's metrics (None: retired)."""

    def retire(self, k: int, why: str | None = None) -> None:
        """Member ``k`` trains no more (``why``: its error)."""

    def checkpoint(self) -> dict:
        """Everything a resumed run needs, histories included."""

    def restore(self, state: dict) -> None:
        """Resume from a :meth:`checkpoint`."""


def fit(run: Run, report: EpochReport | None = None, *, state: dict | None = None, restored: bool = False,
        progress: tqdm | None = None) -> list[list[dict]]:
    """Train ``run`` to its last step, calling ``report(epoch)`` after each epoch with every member's
    metrics of that epoch; a member whose loss stops being finite is recorded as diverged
    (``errors[k]``) and retired before that report. ``state`` (a :meth:`Run.checkpoint`) resumes the
    run where it was saved (``restored``: the caller restored it); one restored at its end reports its
    members' last epochs again, so its caller sees a final result. Returns the members' histories."""
    if state is not None:
        run.restore(state)
    if (restored or state is not None) and run.done and report is not None and any(run.histories):
        report([h[-1] if h else None for h in run.histories])
    while not run.done:
        epoch = run.epoch_results(progress)
        for k, metrics in enumerate(epoch):
            if metrics is None:
                continue
            run.histories[k].append(metrics)
            why = divergence(metrics)
            if why is not None:
                run.retire(k, why)
        if report is not None:
            report(epoch)
    return run.histories
