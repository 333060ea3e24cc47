"""Per-sample clipping factors c_i, by name (``clip_fn``).

Each returns the factor c_i that scales g_i; every variant guarantees ‖c_i g_i‖ ≤ C, which is
what the accountant's sensitivity assumes.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...schema.option_registries import CLIP_FNS

ClipFn = Callable[[torch.Tensor, float], torch.Tensor]
#: AUTO-S stability constant γ (Bu et al. 2023, "Automatic clipping").
AUTO_S_GAMMA = 0.01


def flat_clip(norms: torch.Tensor, clip_bound: float) -> torch.Tensor:
    """min(1, C/n_i) (Abadi et al. 2016)."""
    return (clip_bound / norms.clamp_min(1e-30)).clamp(max=1.0)


def auto_s_clip(norms: torch.Tensor, clip_bound: float) -> torch.Tensor:
    """C/(n_i + γ): every gradient is normalised (AUTO-S); ‖c_i g_i‖ < C."""
    return clip_bound / (norms + AUTO_S_GAMMA)


def clip_factors(name: str, norms: torch.Tensor, clip_bound: float) -> torch.Tensor:
    """c = ``CLIP_FNS[name]``(n, C); an unknown name raises ValueError listing the registered ones."""
    return CLIP_FNS.get(name)(norms, clip_bound)
