"""The book-keeping engine's rules for the layers of a pack (``packed_layers``).

Row r = k·b + i of a packed layer's input and output gradient is example i of member k, so each
row's per-sample squared norm is computed exactly as the unpacked layer's rule computes it (the
same functions, on K·b rows: exact, Hutchinson and Hutch++ alike, with the same probes per step
and layer), and the clipped sum Σ_i c_ki g_ki is formed per member: one batched product over the
K members, shaped like the packed parameter [K, ...].
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.utils._pytree import tree_map

from .base import (Call, LayerGrads, NormContext, Rule, compute_dtype, materialised_rule, scaled_rows, tensor_bytes,
                   unfold_patches, wide)
from .broadcast import Broadcast
from .composite import Composite, kept_bytes
from .conv import Conv2d
from .embedding import embedding_clipped, embedding_sq_norms
from .linear import LinearLike, WeightGrads, linear_weight_grads, prefer_ghost, weight_and_bias
from ..packed_layers import (PACKED_BROADCASTS, PackedConv1D, PackedConv2d, PackedEmbedding, PackedLinear, PackedMultiheadAttention,
                            PackedNorm, PackedUnit, by_member)


def per_member(c: torch.Tensor, per_sample: torch.Tensor, members: int) -> torch.Tensor:
    """Σ_i c_ki g_ki for each member k: [K·b] factors and [K·b, *shape] gradients → [K, *shape], in
    at least float32."""
    c, per_sample = wide(c, per_sample)
    return torch.einsum("kb,kb...->k...", by_member(c, members), by_member(per_sample, members))


def _materialised(per_sample: dict[str, torch.Tensor], members: int, form: str, kept: int = 0) -> LayerGrads:
    """A LayerGrads from per-row gradients {name: [K·b, *shape]}, summed per member."""
    dtype = compute_dtype(next(iter(per_sample.values())))
    sq = sum(torch.linalg.vector_norm(g.flatten(1), dim=1, dtype=dtype).square() for g in per_sample.values())

    def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: per_member(c, g, members) for n, g in per_sample.items()}

    return LayerGrads(sq, clipped, form, kept + tensor_bytes(*per_sample.values()))


def member_weight_sums(c: torch.Tensor, weight: WeightGrads, members: int) -> torch.Tensor:
    """Σ_i c_ki A_kiᵀ G_ki of a linear map's weight for each member k, as [K, p, d] (the weight's layout)."""
    if weight.M is not None:
        M = per_member(c, weight.M, members)  # [K, d, p]
    else:
        d, p = weight.A.shape[2], weight.G.shape[2]
        scaled = scaled_rows(c, weight.A).reshape(members, -1, d)
        M = torch.bmm(scaled.transpose(1, 2), weight.G.to(scaled.dtype).reshape(members, -1, p))
    return M.transpose(1, 2)


def _packed_weight_and_bias(module: nn.Module, A: torch.Tensor, G: torch.Tensor, names: Sequence[str], ctx: NormContext,
                     form: str, prefix: str = "") -> LayerGrads:
    """A weight applied as a ↦ Wa per member, from A [K·b, T, d] and G [K·b, T, p], and a bias
    added at every position: the clipped weight sum per member is [K, d, p]. The parameters are
    ``<prefix>weight`` and ``<prefix>bias`` of ``module``."""
    K = module.members
    names = [n.removeprefix(prefix) for n in names]
    weight, bias, sq = weight_and_bias(A, G, names, ctx, module)   # per row: [K·b]

    def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {}
        if weight is not None:
            sums = member_weight_sums(c, weight, K)   # [K, p, d]; a Conv1D stores its weight [K, d, p]
            sums = sums.transpose(1, 2) if isinstance(module, PackedConv1D) else sums
            out[prefix + "weight"] = sums.reshape(getattr(module, prefix + "weight").shape)
        if bias is not None:
            out[prefix + "bias"] = per_member(c, bias, K)
        return out

    return LayerGrads(sq, clipped, (weight.form if weight is not None else "bias only") + f", {form}",
                      tensor_bytes(A, G, bias) + (weight.kept_bytes if weight is not None else 0))


class PackedLinearRule(Rule):
    """``PackedLinear`` (and ``PackedConv1D``): the linear rule per row, the clipped weight sums by one ``bmm``."""

    name = "packed linear"

    def handles(self, module: nn.Module) -> bool:
        return isinstance(module, (PackedLinear, PackedConv1D))

    def per_sample(self, module, calls, names, ctx, batch_size):
        A = torch.cat([c.args[0].reshape(batch_size, -1, module.in_features) for c in calls], dim=1)
        G = torch.cat([c.grad.reshape(batch_size, -1, module.out_features) for c in calls], dim=1)
        return _packed_weight_and_bias(module, A, G, names, ctx, "packed")


class PackedAttentionRule(Rule):
    """``PackedMultiheadAttention`` as one unit, as the replay rule (``rules.replay``) takes an
    ``nn.MultiheadAttention``: its linear maps — the q, k and v rows of the in-projection (A the
    attention's input, G the projection's gradient) and the out-projection (A the attended values,
    recomputed from the input, G the output's gradient) — by the linear rule per row, in the replay's
    order and with its probes, so that each member's norms equal its own model's; the clipped sums
    per member."""

    name = "packed multi-head attention"

    def handles(self, module: nn.Module) -> bool:
        return isinstance(module, PackedMultiheadAttention)

    def outputs(self, module: nn.Module, output: object, where: str) -> list[torch.Tensor]:
        return [output[0], module.projected]

    def per_sample(self, module, calls, names, ctx, batch_size):
        E, K = module.embed_dim, module.members
        blocks = [("in_proj_", slice(i * E, (i + 1) * E)) for i in range(3)] + [("out_proj.", slice(None))]
        pairs: dict[int, list] = {j: [] for j in range(len(blocks))}
        for call in calls:
            x, (G_out, G_qkv) = call.args[0], call.grads
            with torch.no_grad():
                attended = module.attend(module.project(x), *(call.kwargs.get(k) for k in
                                                              ("key_padding_mask", "attn_mask")),
                                         bool(call.kwargs.get("is_causal", False)))
            for j in range(3):
                pairs[j].append((x, G_qkv[..., blocks[j][1]]))
            pairs[3].append((attended, G_out))
        probes = ctx.probes(module) if ctx.estimator != "exact" else None
        weights, biases = {}, {}
        for j, (prefix, _) in enumerate(blocks):
            A = torch.cat([a.reshape(batch_size, -1, a.shape[-1]) for a, _ in pairs[j]], dim=1)
            G = torch.cat([g.reshape(batch_size, -1, g.shape[-1]) for _, g in pairs[j]], dim=1)
            if prefix + "weight" in names:
                weights[j] = linear_weight_grads(A, G, ctx, module, probes)
            if prefix + "bias" in names:
                biases[j] = G.sum(dim=1)   # [K·b, p]
        parts = [w.sq for w in weights.values()] + [wide(b)[0].pow(2).sum(dim=1) for b in biases.values()]
        sq = sum(parts[1:], parts[0])
        params = dict(module.named_parameters())

        def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
            out = {n: torch.zeros_like(params[n], dtype=compute_dtype(params[n])) for n in names}
            for j, w in weights.items():
                prefix, rows = blocks[j]
                out[prefix + "weight"][:, rows] += member_weight_sums(c, w, K)
            for j, b in biases.items():
                prefix, rows = blocks[j]
                out[prefix + "bias"][:, rows] += per_member(c, b, K)
            return out

        kept = sum(w.kept_bytes + tensor_bytes(w.A, w.G) for w in weights.values()) + tensor_bytes(*biases.values())
        return LayerGrads(sq, clipped, "per linear map, packed", kept)


class PackedConv2dRule(Rule):
    """``PackedConv2d``: per-row weight gradients by the unpacked convolution rule's forms (the rows
    folded into groups; unfolded grams; the unfolded linear form for randomised estimators), each
    where the unpacked rule takes it: a grouped convolution materialised, with exact norms."""

    name = "packed conv2d"

    def __init__(self) -> None:
        self.conv = Conv2d(LinearLike())

    def handles(self, module: nn.Module) -> bool:
        return isinstance(module, PackedConv2d)

    def per_sample(self, module, calls, names, ctx, batch_size):
        K, w = module.members, module.weight   # [K, p, C, kh, kw]
        if ctx.estimator != "exact" and "weight" in names and module.groups == 1:
            A = torch.cat([unfold_patches(c.args[0], module).transpose(1, 2) for c in calls], dim=1)  # [K·b, L, d]
            G = torch.cat([c.grad.flatten(2).transpose(1, 2) for c in calls], dim=1)  # [K·b, L, p]
            return _packed_weight_and_bias(module, A, G, names, ctx, "packed, unfolded")
        positions = sum(c.grad[0, 0].numel() for c in calls)
        bias = sum(c.grad.sum(dim=(2, 3)) for c in calls) if "bias" in names else None  # [K·b, p]
        ghost = "weight" in names and module.groups == 1 and prefer_ghost(batch_size, positions, w[0, 0].numel(),
                                                                          w.shape[1], w.element_size())
        if not ghost:
            per_sample = {"bias": bias} if bias is not None else {}
            if "weight" in names:
                per_sample["weight"] = sum(self._per_row_weight(module, c) for c in calls)
            return _materialised(per_sample, K, "materialised (grouped conv), packed")
        sq = self.conv._ghost_sq_norms(module, calls)
        if bias is not None:
            sq = sq + bias.to(sq.dtype).pow(2).sum(dim=1)

        def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
            out = {"weight": sum(self._member_weight_grad(module, call, c) for call in calls)}
            if bias is not None:
                out["bias"] = per_member(c, bias, K)
            return out

        return LayerGrads(sq, clipped, "ghost (unfolded grams), packed", tensor_bytes(bias) + sum(tensor_bytes(c.grad) for c in calls))

    def _per_row_weight(self, module: PackedConv2d, call: Call) -> torch.Tensor:
        """[K·b, p, C/g, kh, kw]: each row's weight gradient, the rows (each of g groups) folded into groups."""
        x, g, w = call.args[0], call.grad, module.weight
        rows = x.shape[0]
        folded = self.conv._weight_grad(module, x.reshape(1, -1, *x.shape[2:]), g.reshape(1, -1, *g.shape[2:]),
                                        rows * module.groups, (rows * w.shape[1], *w.shape[2:]))
        return folded.reshape(rows, *w.shape[1:])

    def _member_weight_grad(self, module: PackedConv2d, call: Call, c: torch.Tensor) -> torch.Tensor:
        """Σ_i c_ki g_ki of the weight [K, p, C, kh, kw]: the native weight gradient of the grouped
        convolution, fed (c·G) with the members side by side in the channels."""
        K, w = module.members, module.weight
        x, g = call.args[0], scaled_rows(c, call.grad)
        b = x.shape[0] // K
        side_x = x.reshape(K, b, *x.shape[1:]).transpose(0, 1).reshape(b, -1, *x.shape[2:])
        side_g = g.reshape(K, b, *g.shape[1:]).transpose(0, 1).reshape(b, -1, *g.shape[2:])
        return self.conv._weight_grad(module, side_x, side_g, K, (K * w.shape[1], *w.shape[2:])).reshape(w.shape)


class PackedNormRule(Rule):
    """``PackedNorm``: per-row gradients Σ_positions x̂ ⊙ G (weight) and Σ_positions G (bias)."""

    name = "packed normalisation"

    def handles(self, module: nn.Module) -> bool:
        return isinstance(module, PackedNorm)

    def per_sample(self, module, calls, names, ctx, batch_size):
        grads: dict[str, torch.Tensor] = {}
        for call in calls:
            x = call.args[0]
            with ctx.precision.autocast(x.device):   # x̂ as the training forward computed it
                xhat = module.normalised(x)
            xhat, G = wide(xhat, call.grad)
            if module.group:
                dims = tuple(range(2, x.dim()))
            else:
                dims = tuple(range(1, x.dim() - len(module.normalized_shape)))
            parts = {"weight": (xhat * G).sum(dim=dims) if dims else xhat * G, "bias": G.sum(dim=dims) if dims else G}
            for n in names:
                grads[n] = grads[n] + parts[n] if n in grads else parts[n]
        return _materialised(grads, module.members, "closed form, packed")


class PackedEmbeddingRule(Rule):
    """``PackedEmbedding``: the embedding rule on the K·V-row table (member k's ids offset by k·V)."""

    name = "packed embedding"

    def handles(self, module: nn.Module) -> bool:
        return isinstance(module, PackedEmbedding)

    def per_sample(self, module, calls, names, ctx, batch_size):
        raw = torch.cat([c.args[0].reshape(batch_size, -1) for c in calls], dim=1)
        ids = module.offset_ids(raw)
        G = torch.cat([c.grad.reshape(batch_size, -1, module.embedding_dim) for c in calls], dim=1)
        keep = raw != module.padding_idx if module.padding_idx is not None else torch.ones_like(raw, dtype=torch.bool)
        table = module.weight.reshape(-1, module.embedding_dim)
        sq, rows = embedding_sq_norms(ids, G, keep, table.shape[0])

        def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"weight": embedding_clipped(ids, G, keep, c, table).reshape(module.weight.shape)}

        return LayerGrads(sq, clipped, "rows per example, packed", tensor_bytes(ids, G, rows))


class PackedBroadcast(Broadcast):
    """A pack's broadcast parameters (``packed_layers.pack_broadcasts``): row k·b + i's gradient of the
    expansion is member k's per-example gradient; the clipped sums are per member [K, 1, *rest]."""

    name = "packed broadcast"

    def handles(self, module: nn.Module) -> bool:
        return hasattr(module, PACKED_BROADCASTS) and super().handles(module)

    def per_sample(self, module, calls, names, ctx, batch_size):
        grads = {call.args[0]: call.grad.unsqueeze(1) for call in calls}   # [K·b, 1, *rest]
        members = module._parameters[getattr(module, PACKED_BROADCASTS)[0]].shape[0]
        return _materialised({n: grads[n] for n in names if n in grads}, members, "per-example expansion, packed")


class PackedUnitRule(Composite):
    """``PackedUnit``: the composite rule (``rules.composite``) per member — member k's per-example
    gradients replayed on its own rows through its own parameters (its slices of the stacks), as
    its own model's unit is replayed — the clipped sums per member."""

    name = "packed unit (vmap)"

    def handles(self, module: nn.Module) -> bool:
        return isinstance(module, PackedUnit)

    def per_sample(self, module, calls, names, ctx, batch_size):
        K = module.members
        b = batch_size // K
        trainable, fixed = module.tensors()
        members = []   # each member's own materialised rule (no copy of its per-example gradients into one)
        for k in range(K):
            member = [_member_call(call, slice(k * b, (k + 1) * b), batch_size) for call in calls]
            grads = self.per_example(module.template, member, names, b, ctx.precision,
                                     params={n: trainable[n][k].detach() for n in names}, fixed=fixed)
            members.append(materialised_rule(grads, "", 0))

        def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
            sums = [rule.clipped(c_k) for rule, c_k in zip(members, by_member(c, K))]
            return {n: torch.stack([s[n] for s in sums]) for n in names}

        return LayerGrads(torch.cat([rule.sq for rule in members]), clipped,
                          f"per-example vmap ({module.unit}), packed",
                          kept_bytes(calls) + sum(rule.kept_bytes for rule in members))


def _member_call(call: Call, rows: slice, batch_size: int) -> Call:
    """The part of a packed unit's call that is one member's: its rows of every input and output
    gradient whose leading size is the call's ``batch_size`` (the rest is shared by the members)."""
    def part(v: object) -> object:
        return v[rows] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch_size else v

    args, kwargs = tree_map(part, (call.args, call.kwargs))
    grads = [part(g) for g in call.grads]
    shapes = [((rows.stop - rows.start, *shape[1:]), dtype, device) for shape, dtype, device in call.shapes]
    return Call(args, kwargs, grads, shapes)


PACKED_BROADCAST = PackedBroadcast()
#: The packed layers' rules (``book_keeping`` tries them before the unpacked closed forms).
PACKED_ATTENTION = PackedAttentionRule()
PACKED_UNIT = PackedUnitRule()
PACKED_FORMS: list[Rule] = [PackedLinearRule(), PackedConv2dRule(), PackedNormRule(), PackedEmbeddingRule(),
                            PACKED_ATTENTION, PACKED_UNIT]
