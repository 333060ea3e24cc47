"""Building a pack from K models of one architecture, and checking it (docs/architecture.md, "Packed trials").

Each module that owns trainable parameters is replaced by its packed form (``packed_layers``), once
per module object under every name it is registered under; a module with none (a block using its
own parameter around its sub-modules, a layer of unknown algebra) is packed whole, with its
sub-modules, as a ``PackedUnit`` — the outermost such module, the unit the unpacked engine's
composite rule takes. A weight tied across layers (token embeddings and an output layer: the tie
whose per-member rule ``rules.tied`` knows; any tie inside one unit) stays one packed parameter. Before anything trains, :func:`check_members` checks the pack's invariant: every
trainable parameter of the source is exactly one packed parameter with the member dimension.
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import nn

from ...errors import UserError
from .rules.base import loaded_class, outermost, own_forward, unit_of
from .rules.broadcast import BROADCAST
from .rules.linear import linear_types
from .rules.normalisation import layer_norm_types, llama_rms_norm
from .packed_layers import (PACKED, PACKED_BROADCASTS, PackedConv1D, PackedConv2d, PackedEmbedding, PackedLinear,
                            PackedMultiheadAttention, PackedNorm, PackedRNN, PackedUnit, pack_broadcasts)
from .rules.tied import closed_tie


def _broadcast_owner(module: nn.Module) -> bool:
    """``module``'s own trainable parameters are all per-example broadcasts it adds to its input."""
    own = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
    return bool(own) and set(own) <= set(BROADCAST.parameter_names(module))


def _packed_form(module: nn.Module) -> type | None:
    """The packed class for a module whose algebra it repeats exactly, or None."""
    if own_forward(module, *linear_types()):
        return PackedLinear
    conv1d = loaded_class("transformers.pytorch_utils", "Conv1D")
    if conv1d is not None and own_forward(module, conv1d):
        return PackedConv1D
    if own_forward(module, nn.Conv2d) and module.padding_mode == "zeros" \
            and not isinstance(module.padding, str):
        return PackedConv2d
    if own_forward(module, *layer_norm_types(), nn.GroupNorm, nn.RMSNorm) or llama_rms_norm(module):
        return PackedNorm
    if own_forward(module, nn.MultiheadAttention) and module.batch_first and module._qkv_same_embed_dim \
            and module.dropout == 0 and module.bias_k is None and not module.add_zero_attn \
            and own_forward(module.out_proj, nn.Linear):
        return PackedMultiheadAttention
    if own_forward(module, nn.RNN, nn.LSTM, nn.GRU) and (module.num_layers == 1 or module.dropout == 0):
        return PackedRNN
    if own_forward(module, nn.Embedding) and module.max_norm is None and not module.scale_grad_by_freq \
            and not module.sparse:
        return PackedEmbedding
    return None


def _owners(model: nn.Module) -> list[str]:
    """Names of the modules that own trainable parameters directly (every name of a module
    registered under several)."""
    return [name for name, m in model.named_modules(remove_duplicate=False)
            if any(p.requires_grad for p in m.parameters(recurse=False))]


def packed_units(model: nn.Module) -> list[str]:
    """Names of the modules a pack takes whole (``PackedUnit``): the outermost of those owning a
    trainable parameter with no packed form (nor a per-example broadcast)."""
    return outermost(name for name in dict.fromkeys(_owners(model)) if _packed_form(model.get_submodule(name)) is None
                     and not _broadcast_owner(model.get_submodule(name)))


def _layout(model: nn.Module) -> list[tuple[str, str]]:
    """(name, how) for every module the pack replaces, each name under which it is registered:
    ``unit`` (packed whole) or ``form`` (its packed form, or its broadcasts stacked in place);
    owners inside a unit are the unit's."""
    units = packed_units(model)
    layout = []
    for name in _owners(model):
        unit = unit_of(name, units)
        if unit is None or unit == name:
            layout.append((name, "form" if unit is None else "unit"))
    return layout


def trainable_names(model: nn.Module) -> dict[int, list[str]]:
    """Every trainable ``Parameter`` object of ``model`` (by id) with all the names that reach it: more
    than one when its module is registered under several names or the weight is tied across layers."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.requires_grad:
            names.setdefault(id(p), []).append(name)
    return names


def _uses(model: nn.Module, names: Sequence[str]) -> list[tuple[nn.Module, str]]:
    """The distinct (module, local name) pairs through which ``names`` reach one parameter."""
    uses: dict[tuple[int, str], tuple[nn.Module, str]] = {}
    for name in names:
        owner, _, local = name.rpartition(".")
        module = model.get_submodule(owner)
        uses.setdefault((id(module), local), (module, local))
    return list(uses.values())


def packing_problems(model: nn.Module) -> list[str]:
    """Why ``model`` cannot be packed: each weight tied across layers other than token embeddings
    tied to an output layer (the tie the pack's rules know, ``rules.tied``) or uses inside one unit
    (``packed_units``). A module registered under several names is packed once."""
    problems = []
    units = packed_units(model)
    for names in trainable_names(model).values():
        uses = _uses(model, names)
        within = {owner if (unit := unit_of(owner, units)) is None else unit
                  for owner in (name.rpartition(".")[0] for name in names)}
        if len(uses) > 1 and len(within) > 1 and not closed_tie(uses):
            problems.append(f"{' = '.join(names)} (a weight tied across layers: a pack keeps ties only between "
                            "token embeddings and an output layer)")
    return problems


def check_members(source: nn.Module, packed: nn.Module, members: int) -> None:
    """The pack's invariant, checked before its first step: every trainable ``Parameter`` object of
    ``source`` maps to exactly one packed parameter with the member dimension [K, *shape], under every
    name that reaches it, and the packed model trains nothing else (a parameter left shared by the
    members would take every member's examples while each adds noise for its own C only)."""
    packed_params = dict(packed.named_parameters(remove_duplicate=False))
    image: dict[int, int] = {}
    for pid, names in trainable_names(source).items():
        shape = tuple(source.get_parameter(names[0]).shape)
        targets = {id(packed_params[n]) for n in names if n in packed_params}
        ok = (len(targets) == 1 and all(n in packed_params for n in names)
              and tuple(packed_params[names[0]].shape) == (members, *shape))
        if not ok:
            raise UserError(f"pack invariant: {' = '.join(names)} {shape} is not one packed parameter of shape "
                            f"({members}, {', '.join(map(str, shape))}) in the pack")
        image[targets.pop()] = pid
    extra = [n for n, p in packed_params.items() if p.requires_grad and id(p) not in image]
    if extra or len(image) != len(trainable_names(source)):
        raise UserError(f"pack invariant: trainable parameters that belong to no single member: "
                        f"{', '.join(extra) or 'two source parameters share one packed parameter'}")


def pack_models(models: Sequence[nn.Module]) -> nn.Module:
    """One packed model from K models of the same architecture (their weights become the members').
    Frozen modules are shared (taken from the first model). Refuses, naming them, the weights tied
    across layers that the pack has no rule for (:func:`packing_problems`); then checks the pack's
    invariant (:func:`check_members`) before anything trains."""
    problems = packing_problems(models[0])
    if problems:
        raise UserError(f"model cannot be packed: {'; '.join(problems)}; set search.pack: off to train its configurations apart")
    packed = copy.deepcopy(models[0])
    done: dict[int, nn.Module] = {}   # a source module → its packed form, set under each of its names
    for name, how in _layout(models[0]):
        layers = [m.get_submodule(name) for m in models]
        if id(layers[0]) not in done:
            if how == "unit":   # packed whole, from the pack's own copy (its frozen tensors stay shared)
                done[id(layers[0])] = PackedUnit(layers, packed.get_submodule(name))
            elif (form := _packed_form(layers[0])) is None:   # a broadcast owner: packed in place
                pack_broadcasts(packed.get_submodule(name), layers)
                done[id(layers[0])] = packed.get_submodule(name)
                continue
            else:
                done[id(layers[0])] = form(layers)
        if not name:   # the whole model is one unit
            packed = done[id(layers[0])]
            continue
        parent, _, leaf = name.rpartition(".")
        setattr(packed.get_submodule(parent) if parent else packed, leaf, done[id(layers[0])])
    _retie(models[0], packed)
    check_members(models[0], packed, len(models))
    return packed


def _retie(source: nn.Module, packed: nn.Module) -> None:
    """A weight tied across layers in ``source`` is one packed parameter in ``packed``: the first
    name's stack, set under every other name (each layer stacked its own copy)."""
    for names in trainable_names(source).values():
        first = packed.get_parameter(names[0])
        for name in names[1:]:
            owner, _, local = name.rpartition(".")
            setattr(packed.get_submodule(owner), local, first)


def packed_parameters(packed: nn.Module) -> list[nn.Parameter]:
    """The parameters of a pack that carry the member dimension, each once (a tied weight is one)."""
    return list({id(p): p for _, p in _member_parameters(packed)}.values())


def _member_parameters(packed: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of each parameter with the member dimension, under every name that reaches it
    (a packed layer's own, a unit's trainable ones at any depth, a module's stacked broadcasts)."""
    out = []
    for name, m in packed.named_modules(remove_duplicate=False):
        if isinstance(m, PackedUnit):
            stacked = m.tensors()[0]
        elif isinstance(m, PACKED):
            stacked = dict(m.named_parameters(recurse=False))
        else:
            stacked = {n: m.get_parameter(n) for n in getattr(m, PACKED_BROADCASTS, ())}
        out += [(f"{name}.{local}" if name else local, p) for local, p in stacked.items()]
    return out


def keep_members(packed: nn.Module, rows: Sequence[int]) -> None:
    """Shrink a pack to its members ``rows`` (indices into the member dimension), in place: each
    packed parameter keeps their slices — the same ``Parameter`` objects, so an optimizer's state
    keyed on them stays theirs — and each packed layer its new K. The frozen modules are untouched."""
    index = torch.tensor(list(rows), dtype=torch.long)
    with torch.no_grad():
        for p in packed_parameters(packed):
            p.grad = None
            p.data = p.data[index.to(p.device)]
    for m in packed.modules():
        if isinstance(m, PACKED):
            m.members = len(index)


def load_member(packed: nn.Module, model: nn.Module, k: int) -> nn.Module:
    """Copy member ``k``'s weights into ``model`` (an unpacked model of the same architecture)."""
    with torch.no_grad():
        for name, p in _member_parameters(packed):
            model.get_parameter(name).copy_(p[k])
    return model
