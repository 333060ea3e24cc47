"""The noise of the DP step: s = Σ_i c_i g_i + σ C ξ, ξ ~ N(0, I) (docs/architecture.md, "The DP step").

One part of :class:`~dptune.trainables.engine.DPEngine`, swappable on its own: it sees the clipped
sums and nothing per-sample, and its generator is its own stream.
"""
from __future__ import annotations

import torch


class GaussianNoise:
    """Adds N(0, std²) to every coordinate of the clipped sums, drawn from ``generator`` (its own
    stream; seed it for reproducible runs) or torch's default one. ``std`` = σ·C."""

    def __init__(self, std: float, generator: torch.Generator | None = None) -> None:
        self.std = float(std)
        self.generator = generator

    def __call__(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.std == 0:
            return sums
        return {name: s + self.std * self._standard_normal(s) for name, s in sums.items()}

    def _standard_normal(self, like: torch.Tensor) -> torch.Tensor:
        if self.generator is None:
            return torch.randn_like(like)
        noise = torch.randn(like.shape, generator=self.generator, dtype=like.dtype, device=self.generator.device)
        return noise.to(like.device)
