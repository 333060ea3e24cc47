"""``nn.Conv2d`` (any groups, zero padding): per-sample weight gradients with the batch folded into the
groups, or ghost norms of the unfolded input."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .base import (Call, LayerGrads, Rule, compute_dtype, materialised_rule, own_forward, scaled_rows, scaled_sum,
                   tensor_bytes, unfold_patches, wide)
from .linear import LinearLike, prefer_ghost


class Conv2d(Rule):
    """``nn.Conv2d`` with zero padding, in one of two exact forms chosen by ``prefer_ghost``:

    - materialised: the per-sample weight gradients from one convolution backward with the batch
      folded into the groups (the work of the batch weight gradient, no unfold), then norms and
      Σ_i c_i g_i from them — for many positions and few channels;
    - ghost (groups = 1): norms ⟨A_iᵀA_i, G_iᵀG_i⟩ from the unfolded input A_i [d, L] and G_i [p, L],
      and Σ_i c_i g_i as the native batch weight gradient of (c_i G_i) — for few positions and
      wide channels.

    Randomised weight estimators go to the linear-like rule's unfolded form."""

    name = "conv2d"

    def __init__(self, fallback: LinearLike) -> None:
        self.fallback = fallback

    def handles(self, module: nn.Module) -> bool:
        return (own_forward(module, nn.Conv2d) and module.padding_mode == "zeros"
                and not isinstance(module.padding, str))

    def _weight_grad(self, module: nn.Module, x: torch.Tensor, g: torch.Tensor, groups: int,
                     weight_shape: tuple[int, ...]) -> torch.Tensor:
        """The convolution's weight gradient for input x and output gradient g (no input gradient),
        in at least float32."""
        x, g = wide(x, g)
        shape_only = g.new_empty(weight_shape)  # only its shape is read
        return torch.ops.aten.convolution_backward(
            g, x, shape_only, None, module.stride, module.padding, module.dilation, False, (0, 0), groups,
            (False, True, False))[1]

    def _per_sample_weight(self, module: nn.Module, call: Call) -> torch.Tensor:
        """[b, *weight.shape] per-sample weight gradients of one call: the batch folded into groups."""
        x, g, w = call.args[0], call.grad, module.weight  # [b, C, H, W], [b, p, H', W']
        b = x.shape[0]
        folded = self._weight_grad(module, x.reshape(1, -1, *x.shape[2:]), g.reshape(1, -1, *g.shape[2:]),
                                   b * module.groups, (b * w.shape[0], *w.shape[1:]))  # [b·p, C/groups, kh, kw]
        return folded.reshape(b, *w.shape)

    def _ghost_sq_norms(self, module: nn.Module, calls: Sequence[Call]) -> torch.Tensor:
        """‖Σ_calls A_iᵀG_i‖² as ⟨AᵀA, GᵀG⟩ over the positions of all calls [b]."""
        A = torch.cat([unfold_patches(c.args[0], module)
                       for c in calls], dim=2)  # [b, d, L]
        G = torch.cat([c.grad.flatten(2) for c in calls], dim=2)  # [b, p, L]
        dtype = compute_dtype(G)
        A, G = A.to(dtype), G.to(dtype)
        return (torch.bmm(A.transpose(1, 2), A) * torch.bmm(G.transpose(1, 2), G)).sum(dim=(1, 2))

    def per_sample(self, module, calls, names, ctx, batch_size):
        w = module.weight
        if ctx.estimator != "exact" and "weight" in names and self.fallback.handles(module):
            return self.fallback.per_sample(module, calls, names, ctx, batch_size)
        positions = sum(c.grad[0, 0].numel() for c in calls)  # L over all calls
        ghost = "weight" in names and module.groups == 1 and prefer_ghost(
            batch_size, positions, w[0].numel(), w.shape[0], w.element_size())
        bias = sum(c.grad.sum(dim=(2, 3)) for c in calls) if "bias" in names else None  # [b, p]
        if not ghost:
            per_sample = {"bias": bias} if bias is not None else {}
            if "weight" in names:
                per_sample["weight"] = sum(self._per_sample_weight(module, c) for c in calls)
            return materialised_rule(per_sample, "materialised (grouped conv)", 0)
        sq = self._ghost_sq_norms(module, calls)
        if bias is not None:
            sq = sq + bias.to(sq.dtype).pow(2).sum(dim=1)

        def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
            out = {"weight": sum(self._weight_grad(module, call.args[0], scaled_rows(c, call.grad),
                                                   module.groups, tuple(w.shape)) for call in calls)}
            if bias is not None:
                out["bias"] = scaled_sum(c, bias)
            return out

        return LayerGrads(sq, clipped, "ghost (unfolded grams, native weight gradient)",
                          tensor_bytes(bias) + sum(tensor_bytes(c.grad) for c in calls))
