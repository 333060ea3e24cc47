"""``nn.Embedding``: per-sample norms and clipped sums from the rows each example looks up."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .base import Call, LayerGrads, Rule, compute_dtype, own_forward, scaled_rows, tensor_bytes


class Embedding(Rule):
    """``nn.Embedding``: the per-example gradient is G summed over each example's equal tokens."""

    name = "embedding"

    def handles(self, module: nn.Module) -> bool:
        return own_forward(module, nn.Embedding) and not module.scale_grad_by_freq and not module.sparse

    def per_sample(self, module, calls, names, ctx, batch_size):
        ids, G, keep = embedding_uses(module, calls, batch_size)
        sq, rows = embedding_sq_norms(ids, G, keep, module.num_embeddings)

        def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"weight": embedding_clipped(ids, G, keep, c, module.weight)}

        return LayerGrads(sq, clipped, "rows per example", tensor_bytes(ids, G, rows))


def embedding_uses(module: nn.Embedding, calls: Sequence[Call], batch_size: int) -> tuple[torch.Tensor, ...]:
    """(token ids [b, S], output gradients [b, S, e], which positions reach the weight [b, S]: not
    ``padding_idx``) of an embedding's calls."""
    ids = torch.cat([c.args[0].reshape(batch_size, -1) for c in calls], dim=1)
    G = torch.cat([c.grad.reshape(batch_size, -1, module.embedding_dim) for c in calls], dim=1)
    keep = ids != module.padding_idx if module.padding_idx is not None else torch.ones_like(ids, dtype=torch.bool)
    return ids, G, keep


def embedding_sq_norms(ids: torch.Tensor, G: torch.Tensor, keep: torch.Tensor,
                       vocabulary: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example squared norms [b] of an embedding's weight gradient: G summed over each example's
    equal tokens, one row per (example, token id) (also returned, [u, e])."""
    b = ids.shape[0]
    example = torch.arange(b, device=ids.device)[:, None].expand_as(ids)  # [b, S]
    keys = (example * vocabulary + ids)[keep]  # [n] one key per (example, token id)
    unique, slot = torch.unique(keys, return_inverse=True)
    dtype = compute_dtype(G)
    rows = torch.zeros(len(unique), G.shape[-1], device=G.device, dtype=dtype)
    rows.index_add_(0, slot, G[keep].to(dtype))
    sq = torch.zeros(b, device=G.device, dtype=dtype)
    sq.index_add_(0, unique // vocabulary, rows.pow(2).sum(dim=1))
    return sq, rows


def embedding_clipped(ids: torch.Tensor, G: torch.Tensor, keep: torch.Tensor, c: torch.Tensor,
                      weight: torch.Tensor) -> torch.Tensor:
    """Σ_i c_i g_i of an embedding's weight (shaped like ``weight``, in at least float32)."""
    scaled = scaled_rows(c, G)[keep]  # [n, e]
    return torch.zeros(weight.shape, dtype=scaled.dtype, device=scaled.device).index_add_(0, ids[keep], scaled)
