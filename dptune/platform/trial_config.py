"""The flat Ray Tune config of a trial, and the trial spec ``{"train": …, "meta": …}`` it comes from.

Ray Tune sees every setting of a trial as a top-level key, so its ResultGrid, progress table,
loggers and schedulers can use them: C, B, η, ε, δ, epochs, ``backbone``, ``dataset``, the trial
options (``optimizer``, ``peft``, ``model_options``, ``max_length``, …), ``noise_multiplier``, and
the plan's figures (``cell``, ``sample_rate``, ``steps``, ``noise_sqrt_steps``, ``lr_multiplier``,
``backbone_label``, ``dataset_label``)::

    {"cell": "digits/cnn/E=8/delta=1e-05/eps=1", "epsilon": 1.0, "delta": 1e-05, "epochs": 8.0,
     "backbone": "cnn", "dataset": "digits", "clip_bound": 1.0, "batch_size": 64,
     "learning_rate": 1.41, "seed": 0, "optimizer": "sgd", "noise_multiplier": 2.3, "steps": 180, …}

The training config's ``model`` is ``backbone`` here; everything else keeps its name. The two
forms convert both ways without loss (:func:`flatten`, :func:`unflatten`).
"""
from __future__ import annotations

from ..search_spaces.planner import META_FIELDS

#: Training-config fields renamed in the flat config.
RENAMED = {"model": "backbone"}
#: Meta fields that are also training-config fields (same value in both parts).
SHARED = ("noise_multiplier",)


def flatten(spec: dict) -> dict:
    """The flat Ray Tune config of a trial spec ``{"train": …, "meta": …}``."""
    train, meta = spec["train"], spec.get("meta", {})
    unknown = sorted(set(meta) - set(META_FIELDS))
    if unknown:
        raise ValueError(f"unknown trial meta field(s) {', '.join(unknown)}; allowed: {', '.join(META_FIELDS)}")
    clash = sorted(k for k in meta if k not in SHARED and RENAMED.get(k, k) in {RENAMED.get(t, t) for t in train})
    if clash:
        raise ValueError(f"trial meta field(s) {', '.join(clash)} clash with training options")
    flat = {RENAMED.get(k, k): v for k, v in train.items()}
    for k in SHARED:
        if k in meta and k in train and train[k] is not None and meta[k] != train[k]:
            raise ValueError(f"{k} differs between the training config ({train[k]}) and the plan ({meta[k]})")
    return {**meta, **flat}


def unflatten(config: dict) -> dict:
    """The trial spec ``{"train": …, "meta": …}`` of a flat Ray Tune config (a config of the older
    nested form ``{"trial": spec}`` is returned as it is)."""
    if set(config) == {"trial"}:
        return config["trial"]
    back = {v: k for k, v in RENAMED.items()}
    meta = {k: config[k] for k in META_FIELDS if k in config}
    train = {back.get(k, k): v for k, v in config.items() if k not in META_FIELDS or k in SHARED}
    return {"train": train, "meta": meta}
