"""How much memory a pack needs, so that it never asks for more than its device holds.

A pack of K members holds, beyond the shared frozen weights, K copies of what one trial holds per
trainable parameter — the weights, their gradient, the optimizer's state, the clipped sums and the
noise — and, per pass, the activations of K·b rows. :func:`estimate` measures both on the lead
model before anything is packed: the per-member bytes from its trainable parameters and the
optimizer's own state (one real step on a scratch parameter counts its slots), the per-row bytes
from what autograd keeps for the backward of a real forward of a few training examples (doubled:
book-keeping also keeps the output gradients of the layers it clips). :meth:`PackMemory.plan`
then bounds the rows of one packed pass (micro-batches are exact: the same sums, only more passes)
and refuses, before any step, a pack whose members' state alone would not fit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ...errors import UserError
from .batching import Inputs, batch_len, model_outputs
from .optimizers import make_optimizer

#: The share of the device's free memory a pack plans to use: the rest is for what the estimate
#: does not see (the allocator's slack, the evaluation's unpacked copy, the data on the device).
MEMORY_SHARE = 0.5
#: Per-sample tensors the engine keeps per trainable parameter and member besides the weights and
#: the optimizer's state: the gradient, the clipped sum and the noise drawn for it.
ENGINE_COPIES = 3


def optimizer_slots(name: str, momentum: float, weight_decay: float) -> int:
    """How many tensors of a parameter's shape the optimizer keeps per parameter (SGD 0, with
    momentum 1; Adam 2): counted on one real step of a scratch parameter."""
    p = nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    optimizer = make_optimizer(name, [p], lr=1.0, momentum=momentum, weight_decay=weight_decay)
    optimizer.step()
    return sum(1 for v in optimizer.state[p].values() if torch.is_tensor(v) and v.shape == p.shape)


def saved_bytes_per_row(model: nn.Module, loss_fn, inputs: Inputs, targets: torch.Tensor) -> float:
    """Bytes autograd keeps for the backward of one forward, per example row: what a real forward
    of ``inputs`` saves, each storage once, parameters not counted. The random streams are left
    as they were (dropout draws from a forked generator)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    devices = [targets.device] if targets.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.enable_grad(), \
            torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        loss_fn(model_outputs(model, inputs), targets).sum()
    return sum(seen.values()) / max(1, batch_len(inputs))


@dataclass(frozen=True)
class PackMemory:
    """A pack's memory: ``member_bytes`` per member (weights and per-parameter state), ``row_bytes``
    per example row of one pass (activations kept for the backward, and the output gradients)."""

    member_bytes: int
    row_bytes: int

    def bytes(self, members: int, rows: int) -> int:
        """What ``members`` members need with ``rows`` rows each in one pass."""
        return members * (self.member_bytes + rows * self.row_bytes)

    def members_that_fit(self, budget: float) -> int:
        """The most members that fit in ``budget`` bytes with one row each per pass."""
        return int(budget // (self.member_bytes + self.row_bytes))

    def plan(self, members: int, budget: float, model: str, budget_is: str = "") -> int:
        """The most rows per member in one pass that keep the pack within ``budget`` bytes (what
        that is: ``budget_is``, for the error); a clear error, before any step, when even one row
        each does not fit."""
        if self.members_that_fit(budget) < members:
            fit = self.members_that_fit(budget)
            advice = (f"set search.pack: {fit} (at most {fit} members per pack)" if fit >= 2
                      else "set search.pack: off")
            raise UserError(f"a pack of {members} members of {model} needs {_size(self.bytes(members, 1))} (weights, "
                            f"optimizer state and one example each: {_size(self.member_bytes)} + "
                            f"{_size(self.row_bytes)} per example per member), more than the "
                            f"{_size(budget)} planned for it{f' ({budget_is})' if budget_is else ''}; {advice}")
        return int((budget / members - self.member_bytes) // self.row_bytes)


def estimate(model: nn.Module, loss_fn, inputs: Inputs, targets: torch.Tensor, *, optimizer: str,
             momentum: float, weight_decay: float) -> PackMemory:
    """A pack's memory from its lead ``model`` and a few training examples (see the module docstring)."""
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    copies = 1 + ENGINE_COPIES + optimizer_slots(optimizer, momentum, weight_decay)
    row = 2 * saved_bytes_per_row(model, loss_fn, inputs, targets)
    return PackMemory(member_bytes=copies * trainable, row_bytes=max(1, math.ceil(row)))


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} GiB"
