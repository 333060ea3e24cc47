"""Linear-like layers: ``nn.Linear`` (and timm's) on 2-D or 3-D inputs, HF ``Conv1D`` and ``nn.Conv2d``
with groups = 1 through unfold; LoRA's factors are such Linears.

For per-sample inputs A_i ∈ ℝ^{T×d} and output gradients G_i ∈ ℝ^{T×p} the per-sample weight gradient
is M_i = A_iᵀG_i, so (Bu et al. 2023, "Differentially private optimization on large model at small
cost", book-keeping with mixed ghost norms):

- ‖M_i‖² = ⟨A_iA_iᵀ, G_iG_iᵀ⟩ (ghost, ~bT²(d+p) work, bT² memory) or ‖A_iᵀG_i‖² from M_i itself
  (materialised, ~bTdp work, bdp memory) — the cheaper one per layer, from the shapes; for T = 1
  simply ‖a_i‖²‖g_i‖²;
- Σ_i c_i M_i = Aᵀ·diag(c)·G over all examples and positions at once (one matrix product), or
  Σ_i c_i M_i from the materialised M_i.

Randomised weight-norm estimators (Hutchinson, Hutch++) plug into this rule."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from ..norm_estimators import RANDOMISED_WEIGHT_NORMS, gram_sq_norms
from .base import (Call, LayerGrads, NormContext, Rule, compute_dtype, loaded_class, own_forward, scaled_sum,
                   tensor_bytes, unfold_patches, wide)


#: Per-sample weight gradients are materialised only while they take at most this many bytes per
#: layer and micro-batch; above it the ghost form is used (memory O(bT²) instead of O(bdp)).
MATERIALISE_MAX_BYTES = 1 << 30


#: What writing and reading back one entry of a materialised per-sample gradient costs, in
#: multiply-adds (memory-bound; fitted on wrn16_4's convolutions, 1 CPU thread: 25–45).
MATERIALISE_ENTRY_COST = 32


def prefer_ghost(batch: int, T: int, d: int, p: int, itemsize: int) -> bool:
    """Ghost norms ⟨A_iA_iᵀ, G_iG_iᵀ⟩ (~bT²(d+p) work) rather than materialised M_i = A_iᵀG_i
    (~b·dp entries to write and read; the bTdp product both forms pay for the clipped sum), or
    when the materialised M_i would not fit ``MATERIALISE_MAX_BYTES``."""
    return T * T * (d + p) < MATERIALISE_ENTRY_COST * d * p or batch * d * p * itemsize > MATERIALISE_MAX_BYTES


class LinearLike(Rule):
    """Weight gradient Σ_t A_tᵀG_t: ``nn.Linear``, HF ``Conv1D`` and ``nn.Conv2d`` (groups = 1)."""

    name = "linear"

    @property
    def conv1d(self) -> type | None:
        """HF's ``Conv1D``, once transformers defined it (a model holding one has imported it)."""
        return loaded_class("transformers.pytorch_utils", "Conv1D")

    def handles(self, module: nn.Module) -> bool:
        if own_forward(module, *linear_types()):
            return True
        if self.conv1d is not None and own_forward(module, self.conv1d):
            return True
        return (own_forward(module, nn.Conv2d) and module.groups == 1 and module.padding_mode == "zeros"
                and not isinstance(module.padding, str))

    def _inputs_and_grads(self, module: nn.Module, call: Call) -> tuple[torch.Tensor, torch.Tensor]:
        """(A [b, T, d], G [b, T, p]) of one call."""
        x, g = call.args[0], call.grad
        if isinstance(module, nn.Conv2d):
            A = unfold_patches(x, module)  # [b, d, L]
            return A.transpose(1, 2), g.flatten(2).transpose(1, 2)  # [b, L, d], [b, L, p]
        return x.reshape(x.shape[0], -1, x.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])

    def _weight_from(self, module: nn.Module, M: torch.Tensor) -> torch.Tensor:
        """The weight-shaped gradient from M = Σ AᵀG [d, p]."""
        if self.conv1d is not None and isinstance(module, self.conv1d):
            return M  # Conv1D stores W as [d, p]
        return M.t().reshape(module.weight.shape)  # Linear [p, d], Conv2d [p, C, kh, kw]

    def per_sample(self, module, calls, names, ctx, batch_size):
        pairs = [self._inputs_and_grads(module, c) for c in calls]
        A = pairs[0][0] if len(pairs) == 1 else torch.cat([a for a, _ in pairs], dim=1)  # [b, T, d]
        G = pairs[0][1] if len(pairs) == 1 else torch.cat([g for _, g in pairs], dim=1)  # [b, T, p]
        weight, bias, sq = weight_and_bias(A, G, names, ctx, module)

        def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
            out = {}
            if weight is not None:
                out["weight"] = self._weight_from(module, weight.clipped(c))
            if bias is not None:
                out["bias"] = scaled_sum(c, bias)
            return out

        return LayerGrads(sq, clipped, weight.form if weight is not None else "bias only",
                          tensor_bytes(A, G, bias) + (weight.kept_bytes if weight is not None else 0))


@dataclass
class WeightGrads:
    """One weight applied as a ↦ Wa at positions t, from inputs A [b, T, d] and output gradients
    G [b, T, p]: per-sample squared norms ``sq`` [b] of M_i = Σ_t a_t g_tᵀ (exact: ghost or
    materialised, chosen from the shapes; or a randomised estimate), and ``clipped(c)`` = Σ_i c_i M_i
    [d, p]."""

    A: torch.Tensor
    G: torch.Tensor
    sq: torch.Tensor
    form: str
    M: torch.Tensor | None = None   # materialised per-sample gradients [b, d, p]

    @property
    def kept_bytes(self) -> int:
        return tensor_bytes(self.M)

    def clipped(self, c: torch.Tensor) -> torch.Tensor:
        if self.M is not None:
            return scaled_sum(c, self.M)
        c, A, G = wide(c, self.A, self.G)
        d, p = A.shape[2], G.shape[2]
        if d <= p:  # scale the narrower side by c, then one product over all (i, t)
            return (A * c[:, None, None]).reshape(-1, d).t() @ G.reshape(-1, p)
        return A.reshape(-1, d).t() @ (G * c[:, None, None]).reshape(-1, p)


def weight_and_bias(A: torch.Tensor, G: torch.Tensor, names: Sequence[str], ctx: NormContext,
                    module: nn.Module) -> tuple["WeightGrads | None", torch.Tensor | None, torch.Tensor]:
    """A linear-like layer's per-sample view from A [b, T, d] and G [b, T, p]: its weight's
    (``linear_weight_grads``, if "weight" is in ``names``), its bias's per-sample gradients [b, p]
    (if "bias" is), and their squared norms summed [b]."""
    weight = linear_weight_grads(A, G, ctx, module) if "weight" in names else None
    bias = G.sum(dim=1) if "bias" in names else None  # [b, p] per-sample bias gradients
    sq = torch.zeros(A.shape[0], device=G.device, dtype=compute_dtype(G))
    if weight is not None:
        sq = sq + weight.sq
    if bias is not None:
        sq = sq + bias.to(sq.dtype).pow(2).sum(dim=1)
    return weight, bias, sq


def linear_weight_grads(A: torch.Tensor, G: torch.Tensor, ctx: NormContext, module: nn.Module,
                        probes: torch.Generator | None = None) -> WeightGrads:
    """The per-sample view of a weight of ``module`` from A [b, T, d] and G [b, T, p]
    (``WeightGrads``), with the estimator of ``ctx``; its probes come from ``probes`` when given (a
    module with several weights draws them all from one generator), else ``ctx.probes(module)``."""
    if ctx.estimator != "exact":
        generator = probes if probes is not None else ctx.probes(module)
        return WeightGrads(A, G, RANDOMISED_WEIGHT_NORMS[ctx.estimator](A, G, ctx.sketch_k, generator), ctx.estimator)
    return exact_weight_grads(A, G)


def exact_weight_grads(A: torch.Tensor, G: torch.Tensor) -> WeightGrads:
    """``linear_weight_grads`` with exact norms: ghost or materialised, the cheaper from the shapes."""
    b, T, d = A.shape
    p = G.shape[2]
    dtype = compute_dtype(G)
    if T == 1:
        return WeightGrads(A, G, A.to(dtype).pow(2).sum(dim=(1, 2)) * G.to(dtype).pow(2).sum(dim=(1, 2)),
                           "ghost (T = 1)")
    if prefer_ghost(b, T, d, p, A.element_size()):
        return WeightGrads(A, G, gram_sq_norms(A, G), "ghost")
    M = torch.bmm(*wide(A.transpose(1, 2), G))  # [b, d, p]
    return WeightGrads(A, G, torch.linalg.vector_norm(M.flatten(1), dim=1, dtype=dtype).square(), "materialised", M)


def linear_types() -> tuple[type, ...]:
    """nn.Linear and library subclasses with its algebra (timm's Linear, when loaded: F.linear outside
    TorchScript)."""
    timm_linear = loaded_class("timm.layers.linear", "Linear")
    return (nn.Linear,) if timm_linear is None else (nn.Linear, timm_linear)
