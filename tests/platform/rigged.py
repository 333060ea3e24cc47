"""A rigged trainable for scheduler tests: accuracy known per epoch, ε spent from the accountant.

It reports exactly what the DP trainable reports to Ray Tune and the store (epoch, step, planned
steps, accuracy, ε spent after the steps taken so far) and checkpoints its history the same way,
without training: accuracy(C, epoch) = ``ACCURACY[C] + SLOPE·(epoch − 1)``, lowered by
``CELL_OFFSET[ε]`` so cells are not comparable with each other, and raised by ``SEED_STEP·seed`` so
each seed's row is its own.
"""
from __future__ import annotations

import math

from dptune.platform.sweep import tune_adapter
from dptune.privacy import epsilon_spent

#: First-epoch accuracy by clipping bound (grid order: C ascending).
ACCURACY = {0.1: 0.50, 0.2: 0.30, 0.4: 0.74, 0.8: 0.40, 1.6: 0.80, 3.2: 0.60, 6.4: 0.20, 12.8: 0.75}
SLOPE = 0.01
SEED_STEP = 0.001
CELL_OFFSET = {1.0: 0.0, 4.0: -0.45}
#: When set, every trial raises this message instead of reporting (read when Ray pickles the trainable).
FAIL_WITH: str | None = None


def accuracy(clip_bound: float, epsilon: float, epoch: int, seed: int = 0) -> float:
    return ACCURACY[round(clip_bound, 6)] + CELL_OFFSET[epsilon] + SLOPE * (epoch - 1) + SEED_STEP * seed


def epoch_step(epoch: int, steps: int, epochs: float) -> int:
    """Step count at the end of ``epoch``, as the Trainer counts it."""
    return min(steps, round(epoch * steps / epochs))


def rigged_trainable(config: dict) -> None:
    if FAIL_WITH is not None:
        raise RuntimeError(FAIL_WITH)
    train = config
    steps, q, sigma = int(config["steps"]), float(config["sample_rate"]), float(config["noise_multiplier"])
    state = tune_adapter.restore_state()
    history = state["history"] if state else []
    for epoch in range(len(history) + 1, math.ceil(train["epochs"]) + 1):
        step = epoch_step(epoch, steps, train["epochs"])
        acc = accuracy(train["clip_bound"], train["epsilon"], epoch, int(train.get("seed", 0)))
        metrics = {"test_accuracy": acc, "score": acc, "test_loss": 1 - acc, "epoch": epoch, "step": step,
                   "steps": steps, "epsilon_spent": epsilon_spent(sigma, train["delta"], q, step), "noise_multiplier": sigma,
                   "sample_rate": q, "noise_sqrt_steps": sigma * math.sqrt(steps), "train_time_s": 0.0}
        history.append(metrics)
        tune_adapter.report(metrics, state={"history": history})


#: The optimum (C*, B*, η*) of :func:`planted_trainable` (read when Ray pickles the trainable).
PLANTED = (1.0, 64, 0.5)


def planted_accuracy(clip_bound: float, batch_size: int, learning_rate: float) -> float:
    """Accuracy peaked at :data:`PLANTED` in log space, each axis deciding its own optimum."""
    return 0.9 - sum(0.02 * math.log2(v / s) ** 2 for v, s in zip((clip_bound, batch_size, learning_rate), PLANTED))


def planted_trainable(config: dict) -> None:
    """One report per epoch of :func:`planted_accuracy` (the same every epoch), as the DP trainable reports."""
    steps, q, sigma = int(config["steps"]), float(config["sample_rate"]), float(config["noise_multiplier"])
    acc = planted_accuracy(config["clip_bound"], config["batch_size"], config["learning_rate"])
    history = []
    for epoch in range(1, math.ceil(config["epochs"]) + 1):
        step = epoch_step(epoch, steps, config["epochs"])
        metrics = {"test_accuracy": acc, "score": acc, "test_loss": 1 - acc, "epoch": epoch, "step": step,
                   "steps": steps, "epsilon_spent": epsilon_spent(sigma, config["delta"], q, step), "noise_multiplier": sigma,
                   "sample_rate": q, "noise_sqrt_steps": sigma * math.sqrt(steps), "train_time_s": 0.0,
                   "fully_clipped": 0}
        history.append(metrics)
        tune_adapter.report(metrics, state={"history": history})
