"""The one place that touches Ray Tune's reporting and checkpoint API (it changes between releases).

torch is imported where a checkpoint is written or read, not with this module: the sweep's driver
imports it (its store callback reads checkpoints) and should not load torch before its first trial."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from typing import Any, Iterator, TextIO

from ray import tune

from ..faults import fault_point
from ..store.layout import is_uri
from .ray_setup import quiet_trial_logs

STATE_FILE = "state.pt"
#: A trial's own log, in its folder beside Ray Tune's ``error.txt``: what its process prints
#: (libraries' progress bars and warnings included). The console shows it only under ``--verbose``
#: (Ray forwards the trials' output to the driver only then: ``launcher.start_ray``).
TRIAL_LOG = "output.log"


class _Tee:
    """A text stream writing to two (the process's own and the trial's log)."""

    def __init__(self, stream: TextIO, log: TextIO) -> None:
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.log.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.log.flush()
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:   # fileno, encoding, isatty: the process's own stream's
        return getattr(self.stream, name)


def trial_folder() -> str | None:
    """The trial's folder in the experiment where that is a local (or mounted) path; else its
    working directory on this node (an object store's experiment: Ray Tune's staging folder);
    None outside a Ray Tune trial."""
    with warnings.catch_warnings():   # outside a trial Ray warns, and returns None
        warnings.simplefilter("ignore")
        folder = tune.get_context().get_trial_dir()
    if folder is None:
        return None
    if is_uri(folder):
        return os.getcwd()
    os.makedirs(folder, exist_ok=True)
    return folder


@contextlib.contextmanager
def trial_output() -> Iterator[str | None]:
    """Everything the trial's process prints to ``sys.stdout``/``sys.stderr`` while inside also goes
    to :data:`TRIAL_LOG` in :func:`trial_folder` (appended: a retry adds to it); yields its path
    (None, and nothing captured, outside a Ray Tune trial)."""
    folder = trial_folder()
    if folder is None:
        yield None
        return
    path = os.path.join(folder, TRIAL_LOG)
    with open(path, "a", buffering=1, encoding="utf-8") as log, \
            contextlib.redirect_stdout(_Tee(sys.stdout, log)), contextlib.redirect_stderr(_Tee(sys.stderr, log)):
        yield path


def report(metrics: dict, state: dict | None = None) -> None:
    """Report one epoch's metrics, with a checkpoint of ``state`` when given."""
    quiet_trial_logs()   # one "checkpoint created" line per epoch is noise
    if state is None:
        tune.report(metrics)
        return
    import torch

    with tempfile.TemporaryDirectory() as directory:
        torch.save(state, os.path.join(directory, STATE_FILE))
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))
    fault_point("trial_checkpointed")


def train_report(metrics: dict, state: dict | None = None) -> None:
    """A Ray Train worker's report of one epoch (multi-worker trials): every worker reports, rank 0
    with a checkpoint of ``state``."""
    import ray.train

    quiet_trial_logs()
    if state is None:
        ray.train.report(metrics)
        return
    import torch

    with tempfile.TemporaryDirectory() as directory:
        torch.save(state, os.path.join(directory, STATE_FILE))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))
    fault_point("train_checkpointed")


def restore_state() -> dict[str, Any] | None:
    """The state saved with the trial's latest checkpoint, or None for a fresh trial."""
    return restorable_state(tune.get_checkpoint())


def restorable_state(checkpoint: tune.Checkpoint | None) -> dict[str, Any] | None:
    """The state a trial restores from ``checkpoint``; None when there is none, or when the
    checkpoint lacks its state file: Ray Tune registered it but its upload was cut (a storage
    outage), so the trial starts again from its beginning (seeded: it ends as an uninterrupted
    run would; nothing of the lost run was stored)."""
    try:
        return checkpoint_state(checkpoint)
    except FileNotFoundError as missing:
        reason = str(missing).splitlines()[0] if str(missing) else "a file is missing"
        print(f"dptune: checkpoint {checkpoint.path} is incomplete ({reason}); the trial starts again from its "
              "beginning", file=sys.stderr)
        return None


def checkpoint_state(checkpoint: tune.Checkpoint | None) -> dict[str, Any] | None:
    """The state saved in a given checkpoint (driver side, e.g. a finished trial's last one; or a
    Ray Train checkpoint of a multi-worker trial)."""
    if checkpoint is None:
        return None
    import torch

    with checkpoint.as_directory() as directory:
        return torch.load(os.path.join(directory, STATE_FILE), weights_only=True, map_location="cpu")

