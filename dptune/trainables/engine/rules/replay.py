"""Closed forms for modules whose parameters act only through linear maps inside a known
computation: ``nn.MultiheadAttention`` (its in-projections, sliced from ``in_proj_weight``, and
``out_proj``) and ``nn.RNN``/``nn.LSTM``/``nn.GRU`` (each layer's input, hidden and projection maps
at every step).

The module's forward is replayed in plain batched operations from its recorded inputs, with every
linear map ``a ↦ Wa + b`` tapped: a zero tensor added to its output, whose gradient (autograd, with
the recorded output gradients as cotangents) is that map's output gradient G. A weight (or a block
of rows of one) used at positions t then has per-example gradient Σ_t g_t a_tᵀ, and the linear-like
algebra of ``rules`` gives its exact norms (ghost or materialised, or a randomised estimate)
and its clipped sum as one matrix product — Opacus's DPLSTM and DPMultiheadAttention do the same
through their own Linear layers. Blocks of rows of one weight are disjoint, so their squared norms
add. A call the replay does not cover (attention with ``bias_k``/``add_zero_attn`` or an
``is_causal`` hint without a mask) goes to ``rules.composite`` instead.

A pack's recurrent layer (``packed_layers.PackedRNN``) is replayed the same way, in the same order
and with the same probes as each member's own layer: its maps applied per member, the per-sample
view per row (row k·b + i is member k's example i), the clipped sums per member.
"""
from __future__ import annotations

import inspect
import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence

from ....errors import UserError
from .composite import COMPOSITE, Composite, filled
from .base import Call, LayerGrads, NormContext, compute_dtype, scaled_sum, tensor_bytes
from .linear import linear_weight_grads
from ..packed_layers import PackedRNN, member_linear
from .packed import member_weight_sums, per_member
from ..recurrent import rnn_forward

#: A tapped block: (parameter name, first row, end row) — rows None: the whole parameter.
Block = tuple[str, Optional[int], Optional[int]]


class _NotReplayable(Exception):
    """This call uses a feature the replay does not cover."""


def _recurrent(module: nn.Module) -> bool:
    return isinstance(module, (nn.RNNBase, PackedRNN))


class Taps:
    """The linear maps of one replay: per weight block, its inputs A and its output taps. A pack's
    module (``members`` K) applies member k's block to member k's rows."""

    def __init__(self, module: nn.Module, names: Sequence[str]) -> None:
        self.params = dict(module.named_parameters())
        self.names = set(names)
        self.members = getattr(module, "members", None)
        self.uses: list[tuple[Block, Optional[Block], torch.Tensor, torch.Tensor]] = []  # (weight, bias, A, tap)

    def tensor(self, block: Optional[Block]) -> Optional[torch.Tensor]:
        if block is None:
            return None
        name, start, stop = block
        value = self.params[name].detach()
        rows = slice(start, stop)
        return value if start is None else value[:, rows] if self.members else value[rows]

    def linear(self, x: torch.Tensor, weight: Block, bias: Optional[Block]) -> torch.Tensor:
        """``F.linear`` of the block's weight and bias (per member in a pack), tapped when either is trained."""
        apply = member_linear if self.members else F.linear
        out = apply(x, self.tensor(weight), self.tensor(bias))
        if weight[0] not in self.names and (bias is None or bias[0] not in self.names):
            return out
        tap = torch.zeros_like(out, requires_grad=True)
        self.uses.append((weight, bias, x.detach(), tap))
        return out + tap


class Replayed(Composite):
    """The replay rule (see the module docstring); falls back to the composite rule."""

    name = "replay"

    def handles(self, module: nn.Module) -> bool:
        return _recurrent(module) or (isinstance(module, nn.MultiheadAttention)
                                      and module.bias_k is None and not module.add_zero_attn)

    def outputs(self, module: nn.Module, output: object, where: str) -> list[torch.Tensor]:
        """An RNN's output (a packed one as its packed data) and final states; attention's outputs."""
        if _recurrent(module):
            out, state = output
            data = out.data if isinstance(out, PackedSequence) else out
            return [data, *(state if isinstance(state, tuple) else (state,))]
        return super().outputs(module, output, where)

    def check_call(self, module, args, kwargs, outputs, batch_size, where):
        recurrent = _recurrent(module)
        if module.training and module.dropout > 0 and (not recurrent or module.num_layers > 1):
            raise UserError(f"{where}: {type(module).__name__} with dropout = {module.dropout}; its replay cannot "
                            "draw the same masks: set dropout to 0")

    def per_sample(self, module, calls, names, ctx, batch_size):
        try:
            uses = [use for call in calls for use in self._tapped(module, call, names, ctx)]
        except _NotReplayable:
            return COMPOSITE.per_sample(module, calls, names, ctx, batch_size)
        return _combine(module, uses, names, ctx)

    def _tapped(self, module: nn.Module, call: Call, names: Sequence[str], ctx: NormContext) -> list:
        """(weight block, bias block, A [b, T, d], G [b, T, p]) of every tapped use in one call, the
        replay under the training forward's autocast."""
        taps = Taps(module, names)
        with torch.enable_grad(), ctx.precision.autocast(call.shapes[0][2]):
            outputs = (_replay_rnn if _recurrent(module) else _replay_attention)(module, call, taps)
            cotangents = filled(call)
            pairs = [(o, g) for o, g in zip(outputs, cotangents) if o.requires_grad]
            grads = torch.autograd.grad([o for o, _ in pairs], [t for *_, t in taps.uses],
                                        grad_outputs=[g for _, g in pairs], allow_unused=True) if pairs else ()
        return [(w, b, _positions(a), _positions(torch.zeros_like(t) if g is None else g))
                for (w, b, a, t), g in zip(taps.uses, grads)]


def _positions(t: torch.Tensor) -> torch.Tensor:
    """[b, *positions, d] → [b, T, d]."""
    return t.reshape(t.shape[0], -1, t.shape[-1])


def _combine(module: nn.Module, uses: list, names: Sequence[str], ctx: NormContext) -> LayerGrads:
    """Per-sample norms and clipped sums of ``names`` from the tapped uses of their blocks."""
    by_weight: dict[Block, list] = {}
    by_bias: dict[Block, list] = {}
    for weight, bias, A, G in uses:
        if weight[0] in names:
            by_weight.setdefault(weight, []).append((A, G))
        if bias is not None and bias[0] in names:
            by_bias.setdefault(bias, []).append(G.sum(dim=1))  # [b, p]
    probes = ctx.probes(module) if ctx.estimator != "exact" else None
    weights = {block: linear_weight_grads(torch.cat([a for a, _ in pairs], dim=1),
                                          torch.cat([g for _, g in pairs], dim=1), ctx, module, probes)
               for block, pairs in by_weight.items()}
    biases = {block: sum(parts) for block, parts in by_bias.items()}
    first = next(iter(weights.values())).G if weights else next(iter(biases.values()))
    sq = torch.zeros(first.shape[0], device=first.device, dtype=compute_dtype(first))
    for w in weights.values():
        sq = sq + w.sq
    for b in biases.values():
        sq = sq + b.to(sq.dtype).pow(2).sum(dim=1)
    params = dict(module.named_parameters())
    K = getattr(module, "members", None)

    def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {n: torch.zeros_like(params[n], dtype=compute_dtype(params[n])) for n in names}
        for (name, start, stop), w in weights.items():
            rows = slice(start, stop)
            if K:
                out[name][:, rows] += member_weight_sums(c, w, K)
            else:
                out[name][rows] += w.clipped(c).t()
        for (name, start, stop), b in biases.items():
            rows = slice(start, stop)
            if K:
                out[name][:, rows] += per_member(c, b, K)
            else:
                out[name][rows] += scaled_sum(c, b)
        return out

    kept = sum(w.kept_bytes + tensor_bytes(w.A, w.G) for w in weights.values()) + tensor_bytes(*biases.values())
    forms = sorted({w.form for w in weights.values()}) or ["bias only"]
    return LayerGrads(sq, clipped, f"{', '.join(forms)} per linear map", kept)


def _replay_rnn(module: nn.RNNBase, call: Call, taps: Taps) -> list[torch.Tensor]:
    """An RNN/LSTM/GRU call replayed by ``rnn_forward`` with its maps tapped; the outputs in the
    order of ``Composite.outputs`` (a packed output as its packed data)."""
    x = call.args[0]
    hx = call.args[1] if len(call.args) > 1 else call.kwargs.get("hx")
    packed = isinstance(x, PackedSequence)
    if packed:
        padded, lengths = pad_packed_sequence(x, batch_first=True)
    else:
        padded, lengths = (x if module.batch_first else x.transpose(0, 1)), None

    def linear(v: torch.Tensor, weight: str, bias: Optional[str]) -> torch.Tensor:
        return taps.linear(v, (weight, None, None), (bias, None, None) if bias else None)

    out, final = rnn_forward(module, {}, padded, hx, lengths, linear)
    if packed:  # back to the packed layout: the steps of each time, longest examples first
        out = out[x.sorted_indices] if x.sorted_indices is not None else out
        out = torch.cat([out[:n, t] for t, n in enumerate(x.batch_sizes.tolist())])
    elif not module.batch_first:
        out = out.transpose(0, 1)
    return [out, *(final if isinstance(final, tuple) else (final,))]


def _replay_attention(module: nn.MultiheadAttention, call: Call, taps: Taps) -> list[torch.Tensor]:
    """A MultiheadAttention call replayed with explicit softmax attention (as
    ``F.multi_head_attention_forward`` computes it when it returns weights)."""
    bound = inspect.signature(module.forward).bind(*call.args, **call.kwargs)
    bound.apply_defaults()
    a = bound.arguments
    if a["is_causal"] and a["attn_mask"] is None:
        raise _NotReplayable("is_causal without attn_mask")
    q, k, v = a["query"], a["key"], a["value"]
    if q.dim() != 3:
        raise _NotReplayable("unbatched input")
    if not module.batch_first:
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    E, H = module.embed_dim, module.num_heads
    hd = E // H
    has_bias = module.in_proj_bias is not None

    def bias(i: int) -> Optional[Block]:
        return ("in_proj_bias", i * E, (i + 1) * E) if has_bias else None

    if module._qkv_same_embed_dim:
        Q, K, V = (taps.linear(t, ("in_proj_weight", i * E, (i + 1) * E), bias(i)) for i, t in enumerate((q, k, v)))
    else:
        Q, K, V = (taps.linear(t, (f"{n}_proj_weight", None, None), bias(i))
                   for i, (n, t) in enumerate(zip("qkv", (q, k, v))))
    b, L, S = Q.shape[0], Q.shape[1], K.shape[1]
    Q, K, V = (t.reshape(b, -1, H, hd).transpose(1, 2) for t in (Q, K, V))  # [b, H, ·, hd]
    scores = Q @ K.transpose(-2, -1) / math.sqrt(hd)  # [b, H, L, S]
    for mask, shape in ((a["attn_mask"], (1, 1, L, S)), (a["key_padding_mask"], (b, 1, 1, S))):
        if mask is None:
            continue
        if mask.dim() == 3:
            raise _NotReplayable("3-D attn_mask")
        mask = mask.reshape(shape)
        scores = scores.masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1)
    out = (weights @ V).transpose(1, 2).reshape(b, L, E)
    out = taps.linear(out, ("out_proj.weight", None, None),
                      ("out_proj.bias", None, None) if module.out_proj.bias is not None else None)
    if not module.batch_first:
        out = out.transpose(0, 1)
    if not a["need_weights"]:
        return [out]
    return [out, weights.mean(dim=1) if a["average_attn_weights"] else weights]


REPLAYED = Replayed()
