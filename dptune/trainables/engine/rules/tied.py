"""A weight shared by token embeddings and a linear output layer (the tied input and output
embeddings of language models): its per-example squared norms and clipped sum in closed form.

Example i's gradient of W [V, e] is the sum over its uses: the output layer's Σ_t δ_t h_tᵀ (inputs
h_t ∈ ℝ^e, output gradients δ_t ∈ ℝ^V) and the embedding's Σ_s 1_{id_s} g_sᵀ (token ids id_s,
output gradients g_s ∈ ℝ^e). Expanding the square,

    ‖g_i‖² = ‖Σ_t δ_t h_tᵀ‖² + ‖Σ_s 1_{id_s} g_sᵀ‖² + 2 Σ_{t,s} δ_t[id_s] (h_t · g_s):

the linear rule's norm (ghost or materialised), the embedding rule's (rows per example) and a cross
term of b·T·S entries — instead of the per-example V×e gradients of every use that the general path
for tied parameters (per-example vmap, summed over the uses) materialises. The clipped sum is the
sum of the two rules' clipped sums. Norms are exact whatever the weight estimator of the other
layers (the general path's are too).

In a pack (``packed_layers``: a ``PackedEmbedding`` and a ``PackedLinear`` holding one packed weight
[K, V, e]) the same three terms are taken per row (row k·b + i is member k's example i: its ids
looked up in member k's block of the K·V-row table, its output gradients over member k's V logits),
and the clipped sums per member.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .base import Call, LayerGrads, compute_dtype, tensor_bytes
from .embedding import embedding_clipped, embedding_sq_norms, embedding_uses
from .linear import exact_weight_grads
from ..packed_layers import PackedEmbedding, PackedLinear
from .packed import member_weight_sums


def _kind(module: nn.Module) -> str:
    """``embedding`` or ``linear`` for the uses the closed form knows (plain or packed), else ``other``."""
    if (type(module) is nn.Embedding and not module.scale_grad_by_freq and not module.sparse) \
            or type(module) is PackedEmbedding:
        return "embedding"
    return "linear" if type(module) in (nn.Linear, PackedLinear) else "other"


def closed_tie(uses: Sequence[tuple[nn.Module, str]]) -> bool:
    """Whether a tied parameter's uses, (module, its local name there), are all embeddings and
    plain linear layers (no subclass with its own forward) holding it as ``weight``, at least one
    of each kind, all of a pack or none."""
    kinds = {_kind(m) for m, local in uses if local == "weight"}
    packed = {isinstance(m, (PackedEmbedding, PackedLinear)) for m, _ in uses}
    return len(uses) >= 2 and all(local == "weight" for _, local in uses) and kinds == {"embedding", "linear"} \
        and len(packed) == 1


def tied_embedding_head(uses: Sequence[tuple[nn.Module, Sequence[Call]]], weight: torch.Tensor,
                        batch_size: int) -> LayerGrads:
    """The per-example view of ``weight`` [V, e] (a pack's: [K, V, e], per row) from the calls of its
    embedding and linear uses (``closed_tie``); ``clipped(c)`` → {"weight": Σ_i c_i g_i} (per member)."""
    K = weight.shape[0] if weight.dim() == 3 else None
    table = weight.reshape(-1, weight.shape[-1])   # a pack's K·V rows, member k's ids offset by k·V
    ids, Ge, keep, A, Gl, rows_of = [], [], [], [], [], []
    for module, calls in uses:
        if isinstance(module, (nn.Embedding, PackedEmbedding)):
            i, g, k = embedding_uses(module, calls, batch_size)
            ids.append(i), Ge.append(g), keep.append(k)
            rows_of.append(module.offset_ids(i) if K else i)
        else:
            A += [c.args[0].reshape(batch_size, -1, c.args[0].shape[-1]) for c in calls]
            Gl += [c.grad.reshape(batch_size, -1, c.grad.shape[-1]) for c in calls]
    dtype = compute_dtype(weight)
    sq = torch.zeros(batch_size, device=weight.device, dtype=dtype)
    head = embedded = None
    forms, kept = [], 0
    if A:
        A, Gl = torch.cat(A, dim=1), torch.cat(Gl, dim=1)  # [b, T, e], [b, T, V]
        head = exact_weight_grads(A, Gl)
        sq = sq + head.sq.to(dtype)
        forms.append(head.form)
        kept += tensor_bytes(A, Gl) + head.kept_bytes
    if ids:
        ids, Ge, keep, rows_of = (torch.cat(t, dim=1) for t in (ids, Ge, keep, rows_of))  # [b, S], [b, S, e], [b, S]
        embedded, rows = embedding_sq_norms(rows_of, Ge, keep, table.shape[0])
        sq = sq + embedded.to(dtype)
        forms.append("rows per example")
        kept += tensor_bytes(Ge, rows)
    if head is not None and embedded is not None:
        at_ids = torch.gather(Gl, 2, ids[:, None, :].expand(-1, Gl.shape[1], -1)).to(dtype)  # [b, T, S] δ_t[id_s]
        inner = torch.bmm(A.to(dtype), (Ge * keep[..., None]).to(dtype).transpose(1, 2))  # [b, T, S] h_t · g_s
        sq = sq + 2 * (at_ids * inner).sum(dim=(1, 2))
        forms.append("cross term")
        kept += tensor_bytes(at_ids, inner)

    def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
        total = torch.zeros_like(weight, dtype=dtype)
        if head is not None:
            total += member_weight_sums(c, head, K) if K else head.clipped(c).t()
        if embedded is not None:
            total += embedding_clipped(rows_of, Ge, keep, c, table).reshape(weight.shape)
        return {"weight": total}

    return LayerGrads(sq, clipped, f"tied embedding + output layer: {' + '.join(forms)}", kept)
