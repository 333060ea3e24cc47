"""The sampling schedule that accounting and training share: q = B/N and T = ⌈E·N/B⌉.

Poisson sampling with expected batch size B out of N examples samples each example with
probability q = B/N; E epochs are T = ⌈E·N/B⌉ steps. The planner, the noise curves of the
analysis and the trainer all take q and T from here, so σ is always calibrated for the q and T
the trainer runs.
"""
from __future__ import annotations

import math

from ..errors import UserError


def sample_rate(batch_size: int, dataset_size: int) -> float:
    """q = B/N, the Poisson sampling probability of an expected batch size B out of N examples."""
    return batch_size / dataset_size


def epoch_end_steps(epochs: float, steps: int) -> list[int]:
    """The step count at the end of each epoch 1, …, ⌈E⌉ of a run of ``steps`` steps over ``epochs``
    epochs (the last ends at T): where a run reports, and where its ε is accounted."""
    return [min(steps, round(epoch * steps / epochs)) for epoch in range(1, math.ceil(epochs) + 1)]


def accounted_steps(epochs: float, steps: int) -> list[int]:
    """The distinct step counts, after at least one step, at which a run's ε is accounted (its epoch
    ends): the one list the plan caches ε for and the trainer reads it at."""
    return sorted({t for t in epoch_end_steps(epochs, steps) if t > 0})


#: The most steps one run may take: far beyond any real DP run (a million epochs of a 100-example set).
MAX_STEPS = 10 ** 8


def num_steps(epochs: float, dataset_size: int, batch_size: int) -> int:
    """T = ⌈E·N/B⌉, the optimizer steps of E epochs over N examples at expected batch size B; refused
    above :data:`MAX_STEPS` (an epochs value of 1e300 is a typo, and no accountant composes it)."""
    if not epochs * dataset_size / batch_size <= MAX_STEPS:
        raise UserError(f"epochs: {epochs:g} epochs of N = {dataset_size} at B = {batch_size} take "
                        f"{epochs * dataset_size / batch_size:.3g} steps; at most {MAX_STEPS:,} are allowed")
    return math.ceil(epochs * dataset_size / batch_size)
