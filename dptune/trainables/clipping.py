"""Per-sample clipping factors, by name (``clip_fn``).

Each returns the factor c_i that scales g_i; every variant guarantees ‖c_i g_i‖ ≤ C, which is
what the accountant's sensitivity assumes.
"""
from __future__ import annotations

from typing import Callable

import torch

ClipFn = Callable[[torch.Tensor, float], torch.Tensor]
CLIP_FNS: dict[str, ClipFn] = {}
#: AUTO-S stability constant γ (Bu et al. 2023, "Automatic clipping").
AUTO_S_GAMMA = 0.01


def register_clip_fn(name: str) -> Callable[[ClipFn], ClipFn]:
    def decorate(fn: ClipFn) -> ClipFn:
        CLIP_FNS[name] = fn
        return fn

    return decorate


@register_clip_fn("flat")
def flat_clip(norms: torch.Tensor, clip_bound: float) -> torch.Tensor:
    """min(1, C/n_i) (Abadi et al. 2016)."""
    return (clip_bound / norms.clamp_min(1e-30)).clamp(max=1.0)


@register_clip_fn("auto_s")
def auto_s_clip(norms: torch.Tensor, clip_bound: float) -> torch.Tensor:
    """C/(n_i + γ): every gradient is normalised (AUTO-S); ‖c_i g_i‖ < C."""
    return clip_bound / (norms + AUTO_S_GAMMA)


def clip_factors(name: str, norms: torch.Tensor, clip_bound: float) -> torch.Tensor:
    try:
        return CLIP_FNS[name](norms, clip_bound)
    except KeyError:
        raise ValueError(f"clip_fn must be one of {', '.join(CLIP_FNS)}; got {name!r}") from None
