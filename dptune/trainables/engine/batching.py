"""Helpers for batches that are a tensor or a dict of tensors (HF models), batched on dim 0."""
from __future__ import annotations

from typing import Callable, Iterator, Mapping, Union

import torch

Inputs = Union[torch.Tensor, Mapping[str, torch.Tensor]]


def batch_len(inputs: Inputs) -> int:
    """Number of examples in ``inputs``."""
    if isinstance(inputs, torch.Tensor):
        return inputs.shape[0]
    return next(iter(inputs.values())).shape[0]


def slice_batch(inputs: Inputs, start: int, stop: int) -> Inputs:
    """Rows ``start:stop`` of every tensor."""
    if isinstance(inputs, torch.Tensor):
        return inputs[start:stop]
    return {k: v[start:stop] for k, v in inputs.items()}


def select_rows(inputs: Inputs, index: torch.Tensor) -> Inputs:
    """The rows ``index`` of every tensor."""
    if isinstance(inputs, torch.Tensor):
        return inputs[index]
    return {k: v[index] for k, v in inputs.items()}


def to_device(inputs: Inputs, device: torch.device | str) -> Inputs:
    if isinstance(inputs, torch.Tensor):
        return inputs.to(device)
    return {k: v.to(device) for k, v in inputs.items()}


def micro_batches(inputs: Inputs, targets: torch.Tensor, size: int | None) -> Iterator[tuple[Inputs, torch.Tensor]]:
    """Split a logical batch into physical micro-batches of at most ``size`` rows (None: one)."""
    n = batch_len(inputs)
    size = n if size is None else size
    for start in range(0, n, max(size, 1)):
        yield slice_batch(inputs, start, start + size), targets[start:start + size]


def repeat_rows(inputs: Inputs, members: int) -> Inputs:
    """The batch once per member of a pack, member-major (row k·b + i is example i)."""
    if isinstance(inputs, torch.Tensor):
        return inputs.repeat(members, *(1,) * (inputs.dim() - 1))
    return {k: repeat_rows(v, members) for k, v in inputs.items()}


def members_shape(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A pack's [K] vector shaped to broadcast over [K, *shape]."""
    return value.reshape(-1, *(1,) * (like.dim() - 1)).to(like.dtype)


def model_outputs(model: Callable[..., object], inputs: Inputs) -> torch.Tensor:
    """Call ``model`` (a module or a functional call) on a tensor or on keyword tensors; return
    the logits (HF outputs carry them in ``.logits``)."""
    out = model(**inputs) if isinstance(inputs, Mapping) else model(inputs)
    return out.logits if hasattr(out, "logits") else out
