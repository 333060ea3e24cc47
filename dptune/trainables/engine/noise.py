"""The noise of the DP step: s = Σ_i c_i g_i + σ C ξ, ξ ~ N(0, I) (docs/architecture.md, "The DP step").

One part of :class:`~dptune.trainables.engine.dp_engine.DPEngine`, swappable on its own: it sees the clipped
sums and nothing per-sample, and draws from its own source: a run's ``noise`` stream
(:mod:`.randomness`: reproducible, or secure with the floating-point mitigation), a torch
generator, or torch's default one. The noise is drawn, and added, in at least float32 whatever
the parameters' dtype (a half-precision parameter gets float32 noise, rounded once at the end).

A pack's sums carry the member dimension [K, *shape]: member k's noise std is σ_k C_k, and ξ is one
draw of [*shape] shared by the members (reproducible runs: exactly what each member draws alone from
the seed) or K independent draws (secure runs).
"""
from __future__ import annotations

import torch

from .batching import members_shape
from .randomness import Stream


class GaussianNoise:
    """Adds N(0, std²) to every coordinate of the clipped sums. ``std`` = σ·C, or a pack's [K]
    vector σ_k C_k (``shared``: one ξ for all members); ``source``: a :class:`~.randomness.Stream`, a
    ``torch.Generator``, or None (torch's default generator)."""

    def __init__(self, std: float | torch.Tensor, source: Stream | torch.Generator | None = None, *,
                 shared: bool = True) -> None:
        self.members = isinstance(std, torch.Tensor)
        self.std = std if self.members else float(std)
        self.source = source
        self.shared = shared

    def __call__(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.members:
            return {name: s + members_shape(self.std, s) * self.standard_normal(s) for name, s in sums.items()}
        if self.std == 0:
            return sums
        return {name: s + self.std * self.standard_normal(s) for name, s in sums.items()}

    def standard_normal(self, like: torch.Tensor) -> torch.Tensor:
        """ξ of ``like``'s shape on its device, in at least float32 (a pack's shared ξ: one draw
        of a member's shape, seen by every member)."""
        dtype = torch.promote_types(like.dtype, torch.float32)
        shape = like.shape[1:] if self.members and self.shared else like.shape
        if isinstance(self.source, Stream):
            xi = self.source.normal(shape, dtype=dtype, device=like.device)
        elif self.source is None:
            xi = torch.randn(shape, dtype=dtype, device=like.device)
        else:
            xi = torch.randn(shape, generator=self.source, dtype=dtype, device=self.source.device).to(like.device)
        return xi.expand(like.shape)
