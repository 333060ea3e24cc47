"""Deliberately broken DP engines: the audit's known answers (``dptune audit --broken NAME``).

Each entry changes one part of a built :class:`~dptune.trainables.engine.dp_engine.DPEngine` (a single model's
or a pack's, but ``realised_batch``: a single model's) the way a real bug would, so
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

from ...errors import UserError
from ...registry import Registry
from ..engine.dp_engine import DPEngine, Sums

BROKEN: Registry = Registry("broken engine")


@BROKEN.register("noise_div10")
def noise_div10(engine: DPEngine) -> None:
    draw = engine.noise.standard_normal
    engine.noise.standard_normal = lambda like: draw(like) / 10


@BROKEN.register("clip_10x")
def clip_10x(engine: DPEngine) -> None:
    factors = engine._factors   # flat clipping at C of n/10 is clipping at 10·C of n
    engine._factors = lambda norms: factors(norms / 10)


@BROKEN.register("realised_batch")
def realised_batch(engine: DPEngine) -> None:
    if engine.packed:
        raise UserError("broken engine realised_batch: a single trial's engine only")
    clipped_sums, realised = engine._clipped_sums, [1]   # what private_gradient calls

    def counted(inputs: object, targets: torch.Tensor) -> tuple[Sums, torch.Tensor]:
        realised[0] = max(len(targets), 1)
        return clipped_sums(inputs, targets)

    engine._clipped_sums = counted
    engine.normalise = lambda noisy: {n: s / (realised[0] * engine.clip_bound) for n, s in noisy.items()}


@BROKEN.register("reused_noise")
def reused_noise(engine: DPEngine) -> None:
    source = engine.noise
    draw, first = source.standard_normal, {}

    def reused(like: torch.Tensor) -> torch.Tensor:   # the first draw of each shape, at every step
        key = tuple(like.shape)
        if key not in first:
            first[key] = draw(like)
        return first[key]

    source.standard_normal = reused

