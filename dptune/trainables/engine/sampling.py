"""Poisson sampling of logical batches, as the accountant assumes.

Each of the N examples joins a batch independently with probability q = B/N, so batch sizes are
Binomial(N, q): empty and oversized batches are normal and must be processed as they come.
Membership compares 62-bit integers with ⌊q·2⁶²⌋ (:func:`~.randomness.membership`): the realised
rate is at most the accounted q, never above it.
"""
from __future__ import annotations

import torch

from ...errors import UserError
from .randomness import SeededStream, Stream, membership


class PoissonSampler:
    """Draws index tensors of Poisson-sampled batches from a run's ``sampler`` stream (by default the
    reproducible one of ``seed``; :mod:`.randomness`).

    ``state_dict``/``load_state_dict`` save and restore a reproducible stream, so a resumed run draws
    the same batches as an uninterrupted one; a secure stream saves nothing (the resumed run draws
    fresh secret batches).
    """

    def __init__(self, num_examples: int, sample_rate: float, *, seed: int = 0, stream: Stream | None = None) -> None:
        if num_examples < 1:
            raise UserError(f"num_examples must be >= 1; got {num_examples}")
        if not 0.0 < sample_rate <= 1.0:
            raise UserError(f"sample_rate must be in (0, 1]; got {sample_rate}")
        self.num_examples = num_examples
        self.sample_rate = sample_rate
        self.stream = stream or SeededStream(seed, "sampler", torch.device("cpu"))

    def sample(self) -> torch.Tensor:
        """Indices of one batch (sorted, possibly empty)."""
        return membership(self.stream, self.num_examples, self.sample_rate)

    def state_dict(self) -> dict:
        return self.stream.state()

    def load_state_dict(self, state: dict) -> None:
        self.stream.load(state)
