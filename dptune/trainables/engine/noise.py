"""The noise of the DP step: s = Σ_i c_i g_i + σ C ξ, ξ ~ N(0, I) (docs/architecture.md, "The DP step").

One part of :class:`~dptune.trainables.engine.dp_engine.DPEngine`, swappable on its own: it sees the clipped
sums and nothing per-sample, and draws from its own source: a run's ``noise`` stream
(:mod:`.randomness`: reproducible, or secure with the floating-point mitigation), a torch
generator, or torch's default one. The noise is drawn, and added, in at least float32 whatever
the parameters' dtype (a half-precision parameter gets float32 noise, rounded once at the end).
"""
from __future__ import annotations

import torch

from .randomness import Stream


class GaussianNoise:
    """Adds N(0, std²) to every coordinate of the clipped sums. ``std`` = σ·C; ``source``: a
    :class:`~.randomness.Stream`, a ``torch.Generator``, or None (torch's default generator)."""

    def __init__(self, std: float, source: Stream | torch.Generator | None = None) -> None:
        self.std = float(std)
        self.source = source

    def __call__(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.std == 0:
            return sums
        return {name: s + self.std * self.standard_normal(s) for name, s in sums.items()}

    def standard_normal(self, like: torch.Tensor) -> torch.Tensor:
        """ξ of ``like``'s shape on its device, in at least float32."""
        dtype = torch.promote_types(like.dtype, torch.float32)
        if isinstance(self.source, Stream):
            return self.source.normal(like.shape, dtype=dtype, device=like.device)
        if self.source is None:
            return torch.randn(like.shape, dtype=dtype, device=like.device)
        noise = torch.randn(like.shape, generator=self.source, dtype=dtype, device=self.source.device)
        return noise.to(like.device)
