"""Per-sample gradients at a trial's checkpoint, for the non-private C* diagnostic (Theorem 5.2 of
"On optimal hyperparameters for DP deep transfer learning", ICLR 2026).

A Ray Tune checkpoint of the dptune trainable is a folder ``checkpoint_NNNNNN`` holding
``state.pt`` = {"trainer": Trainer.state_dict(), "history": …} (see :mod:`dptune.platform.sweep.tune_adapter`); the
trainer state carries the resolved config, so the model, data split and σ are rebuilt from it.
The gradients are those of private training examples: NOT differentially private.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ...errors import UserError, NotFound
from ...schema import TrainConfig
from ...trainables.engine.batching import to_device
from ...trainables.data.splits import take
from ...trainables.engine.per_sample import VmapNormEngine
from ...trainables.training import Trainer
from ..sweep.tune_adapter import STATE_FILE


@dataclass
class CheckpointGradients:
    """Flattened per-sample gradients of the trainable parameters at one checkpoint."""

    grads: np.ndarray          # [n, d] float32
    labels: np.ndarray         # [n]
    noise_multiplier: float    # the trial's σ
    clip_bound: float          # the trial's C
    batch_size: int            # the trial's expected B
    step: int
    config: dict
    source: str


def find_state(path: str, trial_id: str | None = None) -> str:
    """The ``state.pt`` of a checkpoint given a file, a checkpoint folder, a trial folder (its latest
    checkpoint) or an experiment folder with ``trial_id``."""
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise NotFound(f"no checkpoint at {path!r}")
    if trial_id:
        trials = sorted(d for d in glob.glob(os.path.join(path, f"*_{trial_id}_*")) if os.path.isdir(d))
        if not trials:
            raise NotFound(f"no trial folder for trial {trial_id!r} under {path!r}")
        path = trials[0]
    if os.path.isfile(os.path.join(path, STATE_FILE)):
        return os.path.join(path, STATE_FILE)
    checkpoints = sorted(glob.glob(os.path.join(path, "checkpoint_*", STATE_FILE)))
    if not checkpoints:
        raise NotFound(f"no {STATE_FILE} under {path!r} (give a checkpoint or trial folder, or an "
                                "experiment folder with --trial)")
    return checkpoints[-1]


@dataclass
class TrainedState:
    """What a checkpoint holds of one trial: its model's tensors (trainable weights and buffers, by
    their names in the unpacked model), its config and its step; ``member``: its index in a pack."""

    model: dict
    config: dict
    step: int
    source: str
    member: int | None = None


def trained_state(path: str, trial_id: str | None = None, *, device: str = "cpu") -> TrainedState:
    """One trial's state from a checkpoint (see :func:`find_state` for ``path``): a trial trained alone
    (``trainer``), or a member of a pack (``pack``; trial id ``<pack trial id>-m<k>``, whose checkpoint
    is its pack's: member k's slice of every packed weight, the pack's shared buffers)."""
    member = re.fullmatch(r"(.+)-m(\d+)", trial_id or "")
    try:
        source = find_state(path, trial_id)
        member = None
    except NotFound:
        if member is None:
            raise
        source = find_state(path, member.group(1))
    state = torch.load(source, map_location=device, weights_only=True)
    if "pack" in state:
        pack = state["pack"]
        if member is None:
            raise UserError(f"{source!r} is a pack's checkpoint: name one of its {len(pack['configs'])} members "
                            f"(trial id <pack>-m<k>)")
        k = int(member.group(2))
        if not 0 <= k < len(pack["configs"]):
            raise NotFound(f"no member {k} in the pack of {len(pack['configs'])} at {source!r}")
        model = {**{n: t[k] for n, t in pack["model"].items()}, **pack.get("buffers", {})}
        return TrainedState(model, pack["configs"][k], int(pack.get("step", 0)), source, k)
    trainer_state = state.get("trainer", state)
    if "config" not in trainer_state or "model" not in trainer_state:
        raise UserError(f"{source!r} is not a dptune trainer checkpoint (no config or model weights)")
    return TrainedState(trainer_state["model"], trainer_state["config"], int(trainer_state.get("step", 0)), source)


def checkpoint_gradients(path: str, *, trial_id: str | None = None, examples: int | None = None, seed: int = 0,
                         micro_batch: int = 256, device: str = "cpu") -> CheckpointGradients:
    """Per-sample gradients of ``examples`` training examples (default: the trial's expected batch
    size B, the sum Theorem 5.2 is about), drawn uniformly without replacement with ``seed``."""
    state = trained_state(path, trial_id, device=device)
    cfg = TrainConfig.from_dict({**state.config, "device": device})
    if not cfg.private:
        raise UserError("the checkpoint is of a non-private trial (no clipping, no σ): C* is undefined")
    trainer = Trainer(cfg)
    trainer.model.load_state_dict(state.model, strict=state.member is None)
    n = min(examples or cfg.batch_size, trainer.n_train)
    generator = torch.Generator().manual_seed(seed)
    idx = torch.randperm(trainer.n_train, generator=generator)[:n]
    engine = VmapNormEngine(trainer.model, nn.CrossEntropyLoss(reduction="none"))
    chunks, labels = [], []
    for start in range(0, n, micro_batch):
        x, y = take(trainer.data.train, idx[start:start + micro_batch])
        grads = engine.per_sample_grads(to_device(x, trainer.device), y.to(trainer.device))
        chunks.append(torch.cat([g.flatten(1) for g in grads.values()], dim=1).float().cpu().numpy())  # [b, d]
        labels.append(y.cpu().numpy())
    return CheckpointGradients(np.concatenate(chunks), np.concatenate(labels), trainer.plan.noise_multiplier,
                               cfg.clip_bound, cfg.batch_size, state.step, cfg.to_dict(), state.source)
