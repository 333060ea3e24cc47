"""A pack: K copies of one model trained as one batched model (docs/architecture.md, "Packed trials").

Every module that owns trainable parameters is replaced by its packed form, whose parameters carry
a leading member dimension K; the batch of the packed model is the K members' batches one after
the other (row k·b + i is example i seen by member k). A packed layer sends the rows of member k
through member k's weights only, in one batched operation (``bmm``, a grouped convolution, one
normalisation), so that the K members cost one forward and one backward: the idea of HFTA (Wang et
al., MLSys 2021, "Horizontally fused training array"), here for DP training. Modules without
trainable parameters (activations, pooling, frozen backbone layers) see K·b rows and stay shared.

Because row (k, i) reaches only member k's slices, its per-example gradient over the whole packed
model is member k's per-example gradient: the book-keeping engine's norms and clipped sums of the
packed model are each member's own (``rules.packed``). ``packing`` builds a pack from K models.
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap
from torch.nn.utils.rnn import PackedSequence
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ...errors import UserError
from .rules.normalisation import llama_rms_norm
from .recurrent import rnn_forward


def _stack(modules: Sequence[nn.Module], name: str) -> nn.Parameter | None:
    tensors = [getattr(m, name) for m in modules]
    if tensors[0] is None:
        return None
    return nn.Parameter(torch.stack([t.detach().clone() for t in tensors]), requires_grad=tensors[0].requires_grad)


def by_member(x: torch.Tensor, members: int) -> torch.Tensor:
    """[K·b, *rest] → [K, b, *rest] (a view)."""
    return x.reshape(members, x.shape[0] // members, *x.shape[1:])


def member_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Member k's linear map on member k's rows, by one ``bmm``: x [K·b, …, d], weight [K, p, d] and bias
    [K, p] (or None) → [K·b, …, p]; a pack of one (or one shrunk to one member) by the plain ``linear``."""
    K, p = weight.shape[0], weight.shape[1]
    if K == 1:
        return F.linear(x, weight[0], None if bias is None else bias[0])
    xs, w = x.reshape(K, -1, x.shape[-1]), weight.transpose(1, 2)
    y = torch.bmm(xs, w) if bias is None else torch.baddbmm(bias.unsqueeze(1), xs, w)
    return y.reshape(*x.shape[:-1], p)


class PackedLinear(nn.Module):
    """K ``nn.Linear`` layers: weight [K, out, in], bias [K, out]; y_k = x_k W_kᵀ + b_k by one ``bmm``."""

    def __init__(self, layers: Sequence[nn.Linear]) -> None:
        super().__init__()
        self.members = len(layers)
        self.in_features, self.out_features = layers[0].in_features, layers[0].out_features
        self.weight = _stack(layers, "weight")
        self.bias = _stack(layers, "bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return member_linear(x, self.weight, self.bias)


class PackedConv1D(nn.Module):
    """K ``Conv1D`` layers of transformers (GPT-2's linear maps, their weight stored [in, out]): weight
    [K, in, out], bias [K, out]; y_k = x_k W_k + b_k by one ``bmm``."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.members = len(layers)
        self.in_features, self.out_features = layers[0].weight.shape
        self.weight = _stack(layers, "weight")
        self.bias = _stack(layers, "bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return member_linear(x, self.weight.transpose(1, 2), self.bias)


class PackedConv2d(nn.Module):
    """K ``nn.Conv2d`` layers (zero padding; g groups each, depthwise included) as one convolution with
    K·g groups: the K members' rows side by side in the channels, member k's group j the packed group k·g + j."""

    def __init__(self, layers: Sequence[nn.Conv2d]) -> None:
        super().__init__()
        first = layers[0]
        self.members = len(layers)
        self.kernel_size, self.stride, self.padding, self.dilation = (first.kernel_size, first.stride,
                                                                      first.padding, first.dilation)
        self.groups = first.groups   # a member's own groups (the packed forward groups the K members besides)
        self.weight = _stack(layers, "weight")  # [K, out, in, kh, kw]
        self.bias = _stack(layers, "bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        K = self.members
        if K == 1:   # a pack of one (or one shrunk to one member): the plain convolution
            return F.conv2d(x, self.weight[0], None if self.bias is None else self.bias[0], self.stride, self.padding,
                            self.dilation, self.groups)
        b = x.shape[0] // K
        side = x.reshape(K, b, *x.shape[1:]).transpose(0, 1).reshape(b, K * x.shape[1], *x.shape[2:])
        y = F.conv2d(side, self.weight.reshape(-1, *self.weight.shape[2:]),
                     None if self.bias is None else self.bias.reshape(-1), self.stride, self.padding, self.dilation,
                     K * self.groups)
        return y.reshape(b, K, -1, *y.shape[2:]).transpose(0, 1).reshape(K * b, -1, *y.shape[2:])


class PackedNorm(nn.Module):
    """K LayerNorm, GroupNorm or RMSNorm layers (torch's, or the Llama family's: x / rms(x) in float32,
    cast back to x's dtype): one normalisation of all rows, then member k's affine (weight and bias
    [K, *shape])."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        first = layers[0]
        self.members = len(layers)
        self.kind = ("group" if isinstance(first, nn.GroupNorm) else "llama_rms" if llama_rms_norm(first)
                     else "rms" if isinstance(first, nn.RMSNorm) else "layer")
        self.group = self.kind == "group"
        self.eps = first.variance_epsilon if self.kind == "llama_rms" else first.eps
        self.num_groups = first.num_groups if self.group else None
        self.normalized_shape = (None if self.group else tuple(first.weight.shape) if self.kind == "llama_rms"
                                 else tuple(first.normalized_shape))
        self.weight = _stack(layers, "weight")
        self.bias = _stack(layers, "bias") if hasattr(first, "bias") else None

    def normalised(self, x: torch.Tensor) -> torch.Tensor:
        """x̂: the normalised input, before the affine (the same operations as the unpacked forward)."""
        if self.group:
            return F.group_norm(x, self.num_groups, None, None, self.eps)
        if self.kind == "llama_rms":
            xf = x.to(torch.float32)
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        if self.kind == "rms":
            return F.rms_norm(x, self.normalized_shape, None, self.eps)
        return F.layer_norm(x, self.normalized_shape, None, None, self.eps)

    def affine_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        """The shape of one member's weight as it broadcasts over that member's rows [b, ...]."""
        if self.group:   # [C] over [b, C, *spatial]
            return (1, x.shape[1]) + (1,) * (x.dim() - 2)
        return (1,) * (x.dim() - len(self.normalized_shape)) + self.normalized_shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        K = self.members
        xhat = by_member(self.normalised(x), K)   # [K, b, ...]
        shape = (K, *self.affine_shape(x))
        y = xhat * self.weight.reshape(shape) if self.weight is not None else xhat
        if self.bias is not None:
            y = y + self.bias.reshape(shape)
        return y.reshape(x.shape)


class PackedEmbedding(nn.Module):
    """K ``nn.Embedding`` tables [K, V, e], looked up as one table of K·V rows."""

    def __init__(self, layers: Sequence[nn.Embedding]) -> None:
        super().__init__()
        first = layers[0]
        self.members = len(layers)
        self.num_embeddings, self.embedding_dim, self.padding_idx = first.num_embeddings, first.embedding_dim, \
            first.padding_idx
        self.weight = _stack(layers, "weight")

    def offset_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Member k's ids shifted into its block of the K·V-row table."""
        K = self.members
        offsets = torch.arange(K, device=ids.device).reshape(K, *(1,) * ids.dim()) * self.num_embeddings
        return (by_member(ids, K) + offsets).reshape(ids.shape)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = F.embedding(self.offset_ids(ids), self.weight.reshape(-1, self.embedding_dim))
        if self.padding_idx is None:
            return out
        return torch.where((ids == self.padding_idx).unsqueeze(-1), out.detach(), out)  # no gradient to padding


class PackedMultiheadAttention(nn.Module):
    """K ``nn.MultiheadAttention`` layers used as self-attention (query, key and value one tensor,
    ``batch_first``, no dropout): member k's in-projection by one ``bmm`` (in_proj_weight [K, 3E, E]),
    attention per row (scaled dot products: no parameter), member k's out-projection (a
    ``PackedLinear``). The projection is kept as ``projected`` for the rule (``rules.packed``), which
    reads its gradient. Attention weights are not returned (None)."""

    def __init__(self, layers: Sequence[nn.MultiheadAttention]) -> None:
        super().__init__()
        first = layers[0]
        self.members, self.embed_dim, self.num_heads = len(layers), first.embed_dim, first.num_heads
        self.in_proj_weight = _stack(layers, "in_proj_weight")
        self.in_proj_bias = _stack(layers, "in_proj_bias")
        self.out_proj = PackedLinear([layer.out_proj for layer in layers])

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, None]:
        if not (query is key is value):
            raise UserError("a packed nn.MultiheadAttention is self-attention only (query, key and value one "
                            "tensor); set search.pack: off to train these configurations apart")
        qkv = self.project(query)
        self.__dict__["projected"] = qkv
        return self.out_proj(self.attend(qkv, key_padding_mask, attn_mask, is_causal)), None

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """[K·b, T, E] → each member's q, k, v projections of its rows [K·b, T, 3E]."""
        return member_linear(x, self.in_proj_weight, self.in_proj_bias)

    def attend(self, qkv: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
               attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        """Scaled dot-product attention of each row's heads: [K·b, T, 3E] → [K·b, T, E], before the out-projection."""
        E, heads = self.embed_dim, self.num_heads
        rows, T = qkv.shape[:2]
        q, k, v = qkv.reshape(rows, T, 3, heads, E // heads).permute(2, 0, 3, 1, 4)   # each [rows, heads, T, d]
        mask = _attention_mask(attn_mask, key_padding_mask, rows, heads, T, q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        return out.transpose(1, 2).reshape(rows, T, E)


class PackedRNN(nn.Module):
    """K ``nn.RNN``, ``nn.LSTM`` or ``nn.GRU`` layers (no dropout between layers) on padded input
    tensors: their parameters under the module's own names stacked [K, …]; the forward is
    ``recurrent.rnn_forward`` (the same equations, gate order and states as PyTorch's) with each
    linear map applied per member (``member_linear``). Returns (output, h_n) or (output, (h_n, c_n))
    as the module does, the K·b rows member-major."""

    def __init__(self, layers: Sequence[nn.RNNBase]) -> None:
        super().__init__()
        first = layers[0]
        self.members = len(layers)
        for attr in ("mode", "input_size", "hidden_size", "num_layers", "bidirectional", "proj_size", "batch_first",
                     "dropout"):
            setattr(self, attr, getattr(first, attr))
        for name, _ in first.named_parameters():
            setattr(self, name, _stack(layers, name))

    def forward(self, input: torch.Tensor, hx: object = None) -> tuple[torch.Tensor, object]:
        if isinstance(input, PackedSequence) or input.dim() != 3:
            raise UserError(f"a packed {type(self).__name__} takes a batched, padded input tensor (got "
                            f"{type(input).__name__} of {getattr(input, 'dim', lambda: '?')()} dimensions); set "
                            "search.pack: off to train these configurations apart")
        x = input if self.batch_first else input.transpose(0, 1)
        out, state = rnn_forward(self, {}, x, hx, None, self.linear)
        return (out if self.batch_first else out.transpose(0, 1)), state

    def linear(self, v: torch.Tensor, weight: str, bias: str | None) -> torch.Tensor:
        """One of the layer's maps (its weight's and bias's names) applied per member."""
        return member_linear(v, getattr(self, weight), getattr(self, bias) if bias else None)


class PackedUnit(nn.Module):
    """K copies of a module no packed form covers, taken as one unit as the unpacked engine takes it
    (``rules.composite``: a block that uses its own parameter around its sub-modules, such as
    ConvNeXt's layer scale ``gamma``; a layer of unknown algebra, such as timm's ``LayerNorm2d``): its
    sub-modules, parameters and buffers under their own names, the trainable parameters stacked
    [K, *shape] (the frozen ones and the buffers shared by the members). The forward is the
    module's own, once per member under ``torch.func.vmap`` over the member dimension (a
    ``functional_call`` of a copy on the meta device, which holds no memory): member k's rows through
    member k's parameters. An input tensor whose leading size is the call's rows (the largest leading
    size among its tensors) is split by member; any other input is shared."""

    def __init__(self, layers: Sequence[nn.Module], body: nn.Module | None = None) -> None:
        super().__init__()
        first = layers[0]
        self.members = len(layers)
        body = copy.deepcopy(first) if body is None else body   # the pack's own copy: its frozen tensors shared
        stacks: dict[int, nn.Parameter] = {}
        for name, p in first.named_parameters(remove_duplicate=False):
            if p.requires_grad:
                if id(p) not in stacks:   # a parameter reached under several names: one stack
                    stacks[id(p)] = nn.Parameter(torch.stack([m.get_parameter(name).detach().clone() for m in layers]))
                stack, (owner, _, local) = stacks[id(p)], name.rpartition(".")
                setattr(body.get_submodule(owner) if owner else body, local, stack)
        for name, child in body.named_children():
            self.add_module(name, child)
        for name, p in body.named_parameters(recurse=False):
            self.register_parameter(name, p)
        saved = body.state_dict(keep_vars=True)
        for name, b in body.named_buffers(recurse=False):
            self.register_buffer(name, b, persistent=name in saved)
        self.__dict__["template"] = copy.deepcopy(first).to("meta")
        self.__dict__["unit"] = type(first).__name__

    def tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """({name: stacked trainable parameter}, {name: frozen parameter or buffer}), by their names in the unit."""
        trainable, fixed = {}, dict(self.named_buffers())
        for n, p in self.named_parameters():   # one pass: every forward reads them
            (trainable if p.requires_grad else fixed)[n] = p
        return trainable, fixed

    def forward(self, *args: object, **kwargs: object) -> object:
        K = self.members
        leaves, spec = tree_flatten((args, kwargs))
        rows = max((v.shape[0] for v in leaves if isinstance(v, torch.Tensor) and v.dim() > 0), default=0)
        split = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == rows]
        trainable, fixed = self.tensors()

        def member(params: dict, *inputs: torch.Tensor) -> object:
            values = list(leaves)
            for i, x in zip(split, inputs):
                values[i] = x
            member_args, member_kwargs = tree_unflatten(values, spec)
            return functional_call(self.template, {**fixed, **params}, member_args, member_kwargs)

        out = vmap(member, randomness="error")(trainable, *(by_member(leaves[i], K) for i in split))
        return tree_map(lambda t: t.reshape(-1, *t.shape[2:]) if isinstance(t, torch.Tensor) else t, out)


def _attention_mask(attn_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None, rows: int, heads: int,
                    T: int, dtype: torch.dtype) -> torch.Tensor | None:
    """nn.MultiheadAttention's masks (bool: True is masked out; float: added) as one additive mask
    [rows, heads, T, T] (None: none)."""
    mask = None
    for m, shape in ((attn_mask, None), (key_padding_mask, (rows, 1, 1, T))):
        if m is None:
            continue
        m = torch.zeros_like(m, dtype=dtype).masked_fill(m, float("-inf")) if m.dtype == torch.bool else m.to(dtype)
        m = m.reshape(shape) if shape is not None else m.reshape(-1, heads, T, T) if m.dim() == 3 else m
        mask = m if mask is None else mask + m
    return mask


PACKED = (PackedLinear, PackedConv1D, PackedConv2d, PackedNorm, PackedEmbedding, PackedMultiheadAttention, PackedRNN,
          PackedUnit)
#: Set on a module of a pack whose own trainable parameters are per-example broadcasts (a ViT's class
#: token and position embedding, ``rules.broadcast.Broadcast``): the names stacked over the members.
PACKED_BROADCASTS = "packed_broadcasts"


def pack_broadcasts(module: nn.Module, layers: Sequence[nn.Module]) -> None:
    """Stack the trainable broadcast parameters of ``layers`` on ``module`` ([1, *rest] → [K, 1, *rest]),
    which keeps its own forward: every forward sees each as its rows' members' [K·b, *rest], the
    per-example expansion the unpacked engine hands the model, member k's value in member k's rows."""
    names = tuple(n for n, p in layers[0].named_parameters(recurse=False) if p.requires_grad)
    for name in names:
        setattr(module, name, _stack(layers, name))
    setattr(module, PACKED_BROADCASTS, names)
    module.register_forward_pre_hook(_expand_members)
    module.register_forward_hook(_restore_members)


def _expand_members(module: nn.Module, args: tuple) -> None:
    rows = args[0].shape[0]
    saved = {name: module._parameters[name] for name in getattr(module, PACKED_BROADCASTS)}
    for name, p in saved.items():
        module._parameters[name] = p.expand(p.shape[0], rows // p.shape[0], *p.shape[2:]).reshape(rows, *p.shape[2:])
    module.__dict__["_pack_saved"] = saved


def _restore_members(module: nn.Module, args: tuple, output: object) -> None:
    module._parameters.update(module.__dict__.pop("_pack_saved"))
