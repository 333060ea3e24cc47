"""Deliberately broken DP engines: the audit's known answers (``dptune audit --broken NAME``).

Each entry changes one part of a built :class:`~dptune.trainables.engine.dp_engine.DPEngine` the way a real bug would, so
that an audit of it should find an ε lower bound above the accountant's ε. They exist to show that
the audit (:mod:`.run`) can fail: run on a correct engine, it must stay below. Never train with
them.

- ``noise_div10``: the noise std is σC/10 instead of σC;
- ``clip_10x``: the clipped sum clips at 10·C while the noise and the normalisation use C;
- ``realised_batch``: ĝ is normalised by the realised batch size instead of the expected B (the
  leak is in one scalar shared by every example, which one run's canaries barely see);
- ``reused_noise``: one noise draw is added at every step.
"""
from __future__ import annotations

import torch

from ...registry import Registry
from ..engine.dp_engine import DPEngine, Sums
from ..engine.noise import GaussianNoise

BROKEN: Registry = Registry("broken engine")


@BROKEN.register("noise_div10")
def noise_div10(engine: DPEngine) -> None:
    engine.noise = GaussianNoise(engine.noise.std / 10, engine.noise.source)


@BROKEN.register("clip_10x")
def clip_10x(engine: DPEngine) -> None:
    engine._factors = lambda norms: engine.clip(norms, 10 * engine.clip_bound)


@BROKEN.register("realised_batch")
def realised_batch(engine: DPEngine) -> None:
    clipped_sum, realised = engine.clipped_sum, [1]

    def counted(inputs: object, targets: torch.Tensor) -> tuple[Sums, torch.Tensor]:
        realised[0] = max(len(targets), 1)
        return clipped_sum(inputs, targets)

    engine.clipped_sum = counted
    engine.normalise = lambda noisy: {n: s / (realised[0] * engine.clip_bound) for n, s in noisy.items()}


class _ReusedNoise(GaussianNoise):
    """The first draw, for every later call too."""

    def __init__(self, noise: GaussianNoise) -> None:
        super().__init__(noise.std, noise.source)
        self.first: Sums | None = None

    def __call__(self, sums: Sums) -> Sums:
        if self.first is None:
            self.first = {n: self.std * self.standard_normal(s) for n, s in sums.items()}
        return {n: s + self.first[n] for n, s in sums.items()}


@BROKEN.register("reused_noise")
def reused_noise(engine: DPEngine) -> None:
    engine.noise = _ReusedNoise(engine.noise)

