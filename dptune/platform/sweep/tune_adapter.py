"""The one place that touches Ray Tune's reporting and checkpoint API (it changes between releases).

torch is imported where a checkpoint is written or read, not with this module: the sweep's driver
imports it (its store callback reads checkpoints) and should not load torch before its first trial."""
from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from ray import tune

from ..faults import fault_point
from .ray_setup import quiet_trial_logs

STATE_FILE = "state.pt"


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

