"""Named points of the sweep driver's cycle where a test can kill or pause it: fault injection with
explicit synchronisation instead of sleeps and wall-time guesses.

Production code calls :func:`fault_point` at each named point; unless ``DPTUNE_FAULTS`` is set it
returns at once. ``DPTUNE_FAULTS`` is a comma-separated list of ``<point>@<k>=<action>``: on the
k-th time this process passes ``<point>``,

- ``kill``: the process SIGKILLs itself there (a driver that dies at exactly that point);
- ``raise``: it raises :class:`FaultInjected` there (an unexpected error, e.g. of a trial's code);
- ``pause``: it writes ``<point>@<k>.paused`` in ``DPTUNE_FAULT_DIR`` and waits until the test
  creates ``<point>@<k>.go`` there (e.g. while the test stops a storage server).

The points (where they are called): ``trial_recorded`` (the store callback has written a trial's
rows), ``storage_retry`` (a store write or checkpoint read failed and is about to be retried),
``searcher_saved`` (Ray Tune's snapshot of the searcher is written, the trial list just before it),
and in the durable write of every file (:mod:`dptune.platform.store.durable`): ``durable_written`` (the bytes, not yet
fsynced), ``durable_synced`` (fsynced, not renamed), ``durable_renamed`` (renamed, the folder not
yet fsynced); ``compact_deleted`` (a compaction deleted one of the files it merged). In a trial's
own process: ``trial_entered`` (its Tune function was called, :mod:`dptune.platform.sweep.trial_function`),
``trial_checkpointed`` (a one-process trial reported an epoch
with its checkpoint) and ``train_checkpointed`` (rank 0 of a multi-worker trial did): a test pauses
the trial there and kills its node or a worker while it is certainly mid-trial. A trial's processes
see ``DPTUNE_FAULTS`` when Ray was started with it in the environment.
"""
from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

ENV, DIR_ENV = "DPTUNE_FAULTS", "DPTUNE_FAULT_DIR"
ACTIONS = ("kill", "raise", "pause")
_passed: Counter = Counter()


class FaultInjected(RuntimeError):
    """The error a ``raise`` fault raises: one that no check of dptune's foresaw."""


def faults() -> dict[tuple[str, int], str]:
    """The faults ``DPTUNE_FAULTS`` asks for: {(point, k): action}."""
    out = {}
    for item in filter(None, (part.strip() for part in os.environ.get(ENV, "").split(","))):
        where, _, action = item.partition("=")
        point, _, k = where.partition("@")
        if action not in ACTIONS or not k.isdigit():
            raise ValueError(f"{ENV}: each fault is <point>@<k>=<{'|'.join(ACTIONS)}>; got {item!r}")
        out[(point, int(k))] = action
    return out


def fault_point(point: str) -> None:
    """Pass the named point: a no-op unless ``DPTUNE_FAULTS`` names it (see the module docstring)."""
    if ENV not in os.environ:
        return
    _passed[point] += 1
    action = faults().get((point, _passed[point]))
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "raise":
        raise FaultInjected(f"fault injected at {point}@{_passed[point]}")
    elif action == "pause":
        folder = Path(os.environ[DIR_ENV])
        name = f"{point}@{_passed[point]}"
        (folder / f"{name}.paused").touch()
        while not (folder / f"{name}.go").exists():
            time.sleep(0.01)
