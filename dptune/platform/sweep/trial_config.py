"""A trial's config: one flat mapping, planned by ``search_spaces`` and read here by everyone.

Ray Tune sees every setting of a trial as a top-level key, so its ResultGrid, progress table and
schedulers can use them, and the trainable reads the same mapping: the trainer's ``TrainConfig``
fields (C, B, η, ε, δ, epochs, ``model``, ``dataset``, the trial options, ``noise_multiplier``,
…) and the plan's figures (:data:`~dptune.search_spaces.planner.PLAN_FIELDS`: ``cell``,
``sample_rate``, ``steps``, ``noise_sqrt_steps``, ``lr_multiplier``, the axis labels and the
private-selection figures)::

    {"cell": "digits/cnn/E=8/delta=1e-05/eps=1", "epsilon": 1.0, "delta": 1e-05, "epochs": 8.0,
     "model": "cnn", "dataset": "digits", "clip_bound": 1.0, "batch_size": 64,
     "learning_rate": 1.41, "seed": 0, "optimizer": "sgd", "noise_multiplier": 2.3, "steps": 180, …}

A pack's Ray Tune config (:mod:`dptune.platform.sweep.packs`) is ``{"pack": [member trial configs]}``.
"""
from __future__ import annotations

from ...search_spaces.planner import PLAN_FIELDS
from ...schema import TrainConfig

#: The key of a pack's Ray Tune config: its members' trial configs.
PACK = "pack"


def member_configs(config: dict) -> list[dict]:
    """The trial configs a Ray Tune config stands for: a pack's members, or itself."""
    return list(config[PACK]) if PACK in config else [config]


def train_options(config: dict) -> dict:
    """The training options of a trial config (everything but the plan's figures)."""
    return {k: v for k, v in config.items() if k not in PLAN_FIELDS}


def plan_figures(config: dict) -> dict:
    """The plan's figures of a trial config (cell, q, T, σ√T, η multiplier, labels, selection)."""
    return {k: config[k] for k in PLAN_FIELDS if k in config}


def train_config(config: dict) -> TrainConfig:
    """The ``TrainConfig`` of a trial config (unknown keys refused)."""
    return TrainConfig.from_dict(train_options(config))


def resolved(config: dict) -> dict:
    """The trial config with every training default filled in (stored with each row); a config
    the trainer refuses is kept as given, so its errored row still shows what was asked."""
    try:
        return {**train_config(config).to_dict(), **plan_figures(config)}
    except (TypeError, ValueError):
        return dict(config)
