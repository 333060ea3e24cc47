"""Per-sample squared norms of linear-layer weight gradients, without per-sample gradients where possible.

For a linear layer with per-sample inputs A_i ∈ ℝ^{T×d} and output gradients G_i ∈ ℝ^{T×p}, the
per-sample weight gradient is M_i = A_iᵀG_i and ‖M_i‖²_F = tr(G_iᵀA_iA_iᵀG_i) (from
"Efficient DP-SGD for LLMs with randomized clipping", ICML 2026; docs/architecture.md, "Randomized
clipping"). All functions take A: [B, T, d], G: [B, T, p] and return [B].

- ``ghost_sq_norms``: exact, ⟨A_iA_iᵀ, G_iG_iᵀ⟩ (O(BT²) memory) when 2T² ≤ pd, else ‖A_iᵀG_i‖²
  materialised (O(Bdp)).
- ``hutchinson_sq_norms``: unbiased, ‖A_iᵀ(G_iP)‖², P ∈ ℝ^{p×k} with N(0, 1/k) entries; O(Bk(T+d)+pk).
- ``hutchpp_sq_norms``: unbiased, lower variance: the top of M_iᵀM_i's spectrum exactly through a
  sketch Q = orth(M_iᵀM_iS), the rest by Hutchinson. About 3× the products of Hutchinson.

The randomised estimates are private only with the accounting of ``dptune.privacy.randomized``.
Sketches are drawn from ``generator`` (fresh on each call: each step and each layer).
"""
from __future__ import annotations

import math

import torch


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """At least float32 (norm estimates in half precision lose the small examples)."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _gaussian(rows: int, cols: int, like: torch.Tensor, dtype: torch.dtype,
              generator: torch.Generator | None) -> torch.Tensor:
    """A [rows, cols] standard Gaussian matrix on ``like``'s device, drawn from ``generator``."""
    device = generator.device if generator is not None else like.device
    return torch.randn(rows, cols, generator=generator, device=device, dtype=dtype).to(like.device)


def gram_sq_norms(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Exact ‖A_iᵀG_i‖²_F in the ghost form ⟨A_iA_iᵀ, G_iG_iᵀ⟩: O(BT²) memory."""
    dtype = compute_dtype(A, G)
    gram_a = A.to(dtype) @ A.to(dtype).transpose(1, 2)  # [B, T, T]
    gram_g = G.to(dtype) @ G.to(dtype).transpose(1, 2)  # [B, T, T]
    return (gram_a * gram_g).sum(dim=(1, 2))


def materialised_sq_norms(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Exact ‖A_iᵀG_i‖²_F from the per-sample gradients themselves: O(Bdp) memory."""
    dtype = compute_dtype(A, G)
    M = A.to(dtype).transpose(1, 2) @ G.to(dtype)  # [B, d, p] per-sample weight gradients
    return torch.linalg.vector_norm(M, dim=(1, 2)).pow(2)


def ghost_sq_norms(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """Exact ‖A_iᵀG_i‖²_F: the ghost form when 2T² ≤ pd, else materialised (the cheaper one)."""
    T, d, p = A.shape[1], A.shape[2], G.shape[2]
    return gram_sq_norms(A, G) if 2 * T * T <= p * d else materialised_sq_norms(A, G)


def hutchinson_sq_norms(A: torch.Tensor, G: torch.Tensor, k: int,
                        generator: torch.Generator | None = None) -> torch.Tensor:
    """Hutchinson estimate of ‖A_iᵀG_i‖²_F with k probes: ‖A_iᵀ(G_iP)‖²_F, P_uv ~ N(0, 1/k).

    Unbiased (E[PPᵀ] = I); relative variance ≤ 2/k. One P per call, shared by the batch.
    """
    dtype = compute_dtype(A, G)
    P = _gaussian(G.shape[2], k, G, dtype, generator) / math.sqrt(k)  # [p, k]
    GP = G.to(dtype) @ P  # [B, T, k]
    return (A.to(dtype).transpose(1, 2) @ GP).pow(2).sum(dim=(1, 2))  # [B, d, k] → [B]


def hutchpp_sq_norms(A: torch.Tensor, G: torch.Tensor, k: int,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Hutch++ estimate of ‖M_i‖²_F, M_i = A_iᵀG_i (Meyer et al. 2021):
    Q = orth(M_iᵀM_iS), n̂_i = ‖M_iQ‖² + (1/k)‖M_i(I − QQᵀ)P‖², S, P ∈ ℝ^{p×k} standard Gaussian.

    Unbiased; exact when rank(M_i) ≤ k (and always when p ≤ k).
    """
    dtype = compute_dtype(A, G)
    A, G = A.to(dtype), G.to(dtype)
    S = _gaussian(G.shape[2], k, G, dtype, generator)  # [p, k]
    P = _gaussian(G.shape[2], k, G, dtype, generator)  # [p, k]
    At = A.transpose(1, 2)  # [B, d, T]
    MS = At @ (G @ S)  # [B, d, k]
    MtMS = G.transpose(1, 2) @ (A @ MS)  # [B, p, k]
    Q = torch.linalg.qr(MtMS).Q  # [B, p, min(p, k)] orthonormal columns
    MQ = At @ (G @ Q)  # [B, d, min(p, k)]
    head = MQ.pow(2).sum(dim=(1, 2))  # ‖M_iQ‖², exact
    MP = At @ (G @ P)  # [B, d, k]
    residual = MP - MQ @ (Q.transpose(1, 2) @ P)  # M_i(I − QQᵀ)P: [B, d, k]
    return head + residual.pow(2).sum(dim=(1, 2)) / k


#: The randomised weight-gradient norm estimators, by ``norm_estimator``: fn(A, G, k, generator) -> [B]
#: squared norms. ``exact`` is not among them: its norms are ghost or materialised, whichever the
#: shapes make cheaper (``rules.linear.exact_weight_grads``).
RANDOMISED_WEIGHT_NORMS = {
    "hutchinson": hutchinson_sq_norms,
    "hutchpp": hutchpp_sq_norms,
}
