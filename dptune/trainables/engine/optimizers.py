"""Optimizers for the privatised gradient, by name (``registries.OPTIMIZERS`` names these builders)."""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from ...errors import UserError
from ...schema.option_registries import OPTIMIZERS
from .batching import members_shape


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


class PackedOptimizer:
    """A torch optimizer over the packed parameters at learning rate 1, each member's displacement
    then scaled by its own η_k. Exact for SGD (with momentum and weight decay), Adam and AdamW,
    whose updates are linear in the learning rate; retired members are left as they are."""

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rates: Sequence[float], active: torch.Tensor) -> None:
        for group in optimizer.param_groups:
            if group["lr"] != 1.0:
                raise UserError(f"the packed optimizer steps at learning rate 1 and scales per member; got {group['lr']}")
        self.optimizer = optimizer
        device = optimizer.param_groups[0]["params"][0].device
        self.learning_rates = torch.tensor([float(lr) for lr in learning_rates], dtype=torch.float64, device=device)
        self.active = active

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        before = [p.detach().clone() for p in params]
        self.optimizer.step()
        rates = self.learning_rates * self.active
        for p, old in zip(params, before):
            rate = members_shape(rates, p)
            p.copy_(old + rate * (p - old))

    def keep_members(self, rows: Sequence[int], active: torch.Tensor) -> None:
        """Shrink to the members ``rows`` (after the packed parameters shrank: :func:`.packing.keep_members`):
        their η and their slices of the optimizer's state; ``active``: the engine's new flags."""
        index = torch.tensor(list(rows), dtype=torch.long, device=self.learning_rates.device)
        members = len(self.learning_rates)
        self.learning_rates, self.active = self.learning_rates[index], active
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == members:
                    state[key] = value[index.to(value.device)]

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)
