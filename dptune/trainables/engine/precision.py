"""Mixed precision of a run (``precision``: fp32, bf16 or fp16): what runs in half precision and what never does.

The master weights stay float32 (the model loaders build them so) and only the forward and the
backward of training run under ``torch.autocast`` in bf16 or fp16 — one place, :meth:`Precision.autocast`,
that the book-keeping engine (single trials and packs alike) and the non-private baseline enter.
Per-example norms, clipping factors, clipped sums and noise are computed in float32 or wider
whatever the model's dtype (the layer rules promote their inputs; no norm or factor is ever cast
to half precision), so every example's contribution is bounded by C as the accountant assumes.

fp16 (a range of ±65504) backpropagates a loss multiplied by a **static** scale
(:data:`FP16_LOSS_SCALE`), so that small gradients do not underflow; norms and clipped sums are
divided by it again (in float32). A step is never skipped (a skipped step would depend on the data
and change T): an example whose scaled gradient overflows gets a non-finite norm and contributes
nothing, counted as today (``nonfinite_examples``), like any example whose norm is not finite.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ContextManager

import torch

from ...schema.option_registries import PRECISIONS

#: The autocast dtype of each ``precision`` (None: no autocast, float32 throughout).
DTYPES = dict(zip(PRECISIONS, (None, torch.bfloat16, torch.float16)))
#: fp16's static loss scale: gradients of a per-example loss are O(1) per coordinate at the logits,
#: so 2⁸ leaves them 256× headroom below fp16's largest value and lifts small ones 256× above its
#: smallest normal value.
FP16_LOSS_SCALE = 2.0 ** 8


@dataclass(frozen=True)
class Precision:
    """What ``precision`` runs in half precision (see the module docstring)."""

    name: str = "fp32"

    def __post_init__(self) -> None:
        if self.name not in DTYPES:
            raise ValueError(f"precision must be one of {', '.join(DTYPES)}; got {self.name!r}")

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype (None for fp32)."""
        return DTYPES[self.name]

    @property
    def loss_scale(self) -> float:
        """What the loss is multiplied by before a backward (1 but for fp16)."""
        return FP16_LOSS_SCALE if self.name == "fp16" else 1.0

    def backward(self, loss: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """The gradients of a (non-private) ``loss`` computed under :meth:`autocast`: backpropagated
        times the loss scale, returned divided by it (float32, like the parameters)."""
        grads = torch.autograd.grad(loss * self.loss_scale if self.loss_scale != 1 else loss, params,
                                    allow_unused=True)
        return [g if g is None or self.loss_scale == 1 else g / self.loss_scale for g in grads]

    def autocast(self, device: torch.device | str) -> ContextManager:
        """The context of a training forward (and the replays of it a layer rule makes)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device).type, dtype=self.dtype)
