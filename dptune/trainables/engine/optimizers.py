"""Optimizers for the privatised gradient, by name (``registries.OPTIMIZERS`` names these builders)."""
from __future__ import annotations

from typing import Iterable

import torch

from ...errors import UserError
from ...schema.option_registries import OPTIMIZERS


def sgd(params: Iterable[torch.nn.Parameter], *, lr: float, momentum: float,
        weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def adam(params: Iterable[torch.nn.Parameter], *, lr: float, momentum: float,
         weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)  # momentum: Adam's own β₁


def adamw(params: Iterable[torch.nn.Parameter], *, lr: float, momentum: float,
          weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter], *, lr: float, momentum: float = 0.0,
                   weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """SGD (optional momentum), Adam or AdamW at learning rate ``lr``."""
    if not lr > 0:
        raise UserError(f"learning_rate must be > 0; got {lr!r}")
    return OPTIMIZERS.get(name)(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
