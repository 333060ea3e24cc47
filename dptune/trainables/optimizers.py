"""Optimizers for the privatised gradient, by name."""
from __future__ import annotations

from typing import Iterable

import torch

OPTIMIZERS = ("sgd", "adam", "adamw")


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter], *, lr: float, momentum: float = 0.0,
                   weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """SGD (optional momentum), Adam or AdamW at learning rate ``lr``."""
    if not lr > 0:
        raise ValueError(f"learning_rate must be > 0; got {lr!r}")
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {name!r}")
