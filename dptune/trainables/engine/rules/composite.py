"""Exact per-sample gradients of any module, taken as one unit: from the module's recorded inputs
and output gradients alone, ``torch.func.vmap`` over examples of a ``vjp`` through a
``functional_call`` of the module (its own parameters and its sub-modules', tuple outputs and
recurrent states included).

The book-keeping engine gives this rule the smallest module that contains every use of a
parameter no closed form covers: a user's block that uses its own parameter in an expression
around a sub-module, a leaf module of unknown algebra, a module found to use a parameter outside
its own module, attention that ``rules.replay`` does not cover; and each use of a tied parameter.
The per-example gradients are materialised ([b, *shape] per parameter): the closed forms and the
replay rule stay the fast paths. Recurrent layers inside such a unit run ``recurrent.rnn_forward``
in the replay (their fused kernels have no batching rule; on their own they go to ``rules.replay``).

Where the batch sits: dim 1 of a sequence-first ``MultiheadAttention``'s query, key and value; dim
0 of every other input tensor whose leading size is the batch's (any other input is shared by the
batch) and of every output. A wrong guess cannot pass silently: the engine's first-batch check
compares Σ_i g_i with the batch gradient.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import nn
from torch.func import functional_call, vjp, vmap
from torch.nn.utils.rnn import PackedSequence
from torch.utils._pytree import tree_flatten, tree_unflatten

from ....errors import UserError
from .base import Call, Rule, materialised_rule, tensor_bytes
from ..precision import Precision
from ..recurrent import rnn_forward


@dataclass
class _View:
    """One call as a per-example function: ``forward(params, *inputs)`` gives the tracked outputs of
    one example (batch of 1) from its slices of ``inputs`` (batched at ``in_dims``); ``cotangents``
    are the outputs' gradients, batched at ``out_dims``."""

    forward: Callable[..., tuple]
    inputs: list
    in_dims: list
    cotangents: list
    out_dims: list


def detached(value: object) -> object:
    """``value`` (tensors in tuples, lists, dicts, named tuples such as ``PackedSequence``) detached."""
    leaves, spec = tree_flatten(value)
    return tree_unflatten([v.detach() if isinstance(v, torch.Tensor) else v for v in leaves], spec)


def filled(call: Call) -> list[torch.Tensor]:
    """The call's output gradients, zeros for an output that got none; contiguous (autograd hands
    out expanded ones, e.g. a mean's, on which some batched backward kernels go wrong: InstanceNorm's)."""
    return [g.contiguous() if g is not None else torch.zeros(shape, dtype=dtype, device=device)
            for g, (shape, dtype, device) in zip(call.grads, call.shapes)]


def kept_bytes(calls: Sequence[Call]) -> int:
    """What a unit's calls hold for its rule: their input tensors and output gradients."""
    return sum(tensor_bytes(*[a for a in tree_flatten(c.args)[0] if isinstance(a, torch.Tensor)], *filled(c))
               for c in calls)


class Composite(Rule):
    """Any module as one unit (see the module docstring)."""

    name = "unit (vmap)"
    expands_shared_input = False

    def handles(self, module: nn.Module) -> bool:
        return True

    def outputs(self, module: nn.Module, output: object, where: str) -> list[torch.Tensor]:
        """Every floating-point tensor of the output (tuples, dicts, named tuples: flattened)."""
        return [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]

    def check_call(self, module, args, kwargs, outputs, batch_size, where):
        return None  # the batch dims are read per call (``_input_dims``, ``_output_dims``)

    def per_sample(self, module, calls, names, ctx, batch_size):
        grads = self.per_example(module, calls, names, batch_size, ctx.precision)
        return materialised_rule(grads, f"per-example vmap ({type(module).__name__})", kept_bytes(calls))

    def per_example(self, module: nn.Module, calls: Sequence[Call], names: Sequence[str],
                    batch_size: int, precision: Precision = Precision(), params: dict | None = None,
                    fixed: dict | None = None) -> dict[str, torch.Tensor]:
        """{name: [b, *shape]}: the per-example gradients of ``module``'s parameters ``names`` (dotted
        paths inside it), summed over its calls; each call replayed under ``precision``'s autocast, as
        the training forward ran it. ``params`` (by those names) and ``fixed`` (other parameters and
        buffers) replace the module's own tensors in the replay (a pack member's, ``rules.packed``)."""
        params = {n: module.get_parameter(n).detach() for n in names} if params is None else params
        total: dict[str, torch.Tensor] = {}
        for call in calls:
            view = self._view(module, call, batch_size, fixed or {})

            def example(cotangents: tuple, inputs: tuple, _view: _View = view) -> dict:
                _, pullback = vjp(lambda p: _view.forward(p, *inputs), params)
                return pullback(tuple(g.unsqueeze(d) for g, d in zip(cotangents, _view.out_dims)))[0]

            try:
                with precision.autocast(call.shapes[0][2]):
                    grads = vmap(example, in_dims=(tuple(view.out_dims), tuple(view.in_dims)),
                                 randomness="error")(tuple(view.cotangents), tuple(view.inputs))
            except UserError:
                raise
            except Exception as exc:  # e.g. dropout inside the unit, an op without a batching rule
                raise UserError(f"no per-sample gradient for {type(module).__name__} ({', '.join(names)}): "
                                 f"{type(exc).__name__}: {exc}") from exc
            for n, g in grads.items():
                total[n] = total[n] + g if n in total else g
        return total

    def _view(self, module: nn.Module, call: Call, batch_size: int, fixed: dict) -> _View:
        """Inputs batched on dim 0 (or where ``_input_dims`` says), outputs on dim 0."""
        leaves, spec = tree_flatten((call.args, call.kwargs))
        dims = _input_dims(module, call, leaves, batch_size)
        batched = [i for i, d in enumerate(dims) if d is not None]
        out_dims = _output_dims(module, call)
        for shape, d in zip([s for s, _, _ in call.shapes], out_dims):
            if len(shape) <= d or shape[d] != batch_size:
                raise UserError(f"{type(module).__name__}: an output of shape {tuple(shape)} has no batch "
                                f"dimension (dim {d}); its parameters have no per-example gradient")

        def forward(params: dict, *inputs: torch.Tensor) -> tuple:
            values = list(leaves)
            for i, x in zip(batched, inputs):
                values[i] = x.unsqueeze(dims[i])
            args, kwargs = tree_unflatten(values, spec)
            with replayed_recurrent_layers(module):
                return tuple(self.outputs(module, functional_call(module, {**fixed, **params}, args, kwargs), ""))

        return _View(forward, [leaves[i] for i in batched], [dims[i] for i in batched], filled(call), out_dims)


@contextlib.contextmanager
def replayed_recurrent_layers(unit: nn.Module) -> Iterator[None]:
    """Inside ``unit``, every RNN/LSTM/GRU runs ``recurrent.rnn_forward`` (plain ops, which vmap
    batches) instead of its fused kernel (which it cannot) for the duration of the block."""
    layers = [m for m in unit.modules() if isinstance(m, nn.RNNBase)]
    for layer in layers:
        layer.forward = functools.partial(_plain_rnn, layer)   # an instance attribute shadows the class's
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def _plain_rnn(layer: nn.RNNBase, x: torch.Tensor, hx: object = None) -> tuple[torch.Tensor, object]:
    """``layer``'s forward by ``rnn_forward`` on its current weights (a ``functional_call``'s own)."""
    if isinstance(x, PackedSequence) or x.dim() != 3:
        raise UserError(f"{type(layer).__name__} inside a unit: packed or unbatched input has no per-example "
                        "replay there (give the recurrent layer's parameters no expression outside it)")
    if layer.training and layer.dropout > 0 and layer.num_layers > 1:
        raise UserError(f"{type(layer).__name__} with dropout = {layer.dropout} inside a unit: its replay cannot "
                        "draw the same masks: set dropout to 0")
    weights = {name: getattr(layer, name) for name in layer._flat_weights_names}
    out, final = rnn_forward(layer, weights, x if layer.batch_first else x.transpose(0, 1), hx)
    return (out if layer.batch_first else out.transpose(0, 1)), final


def _input_dims(module: nn.Module, call: Call, leaves: list, batch_size: int) -> list[int | None]:
    """Per flattened input leaf: the batch dim, or None (not a tensor, or shared by the batch)."""
    dims: list[int | None] = [0 if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch_size else None
                              for v in leaves]
    if isinstance(module, nn.MultiheadAttention):
        bound = inspect.signature(module.forward).bind(*call.args, **call.kwargs).arguments
        mask = bound.get("attn_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 3:
            raise UserError("MultiheadAttention: a 3-D attn_mask mixes examples and heads on dim 0; pass a 2-D "
                            "attn_mask with a key_padding_mask instead")
        sequence_first = set() if module.batch_first else {id(bound[k]) for k in ("query", "key", "value")}
        for i, v in enumerate(leaves):
            if v is mask:
                dims[i] = None  # [L, S]: shared by the batch
            elif id(v) in sequence_first and v.dim() == 3:
                dims[i] = 1
    return dims


def _output_dims(module: nn.Module, call: Call) -> list[int]:
    """Per tracked output: its batch dim (a sequence-first attention's output on dim 1)."""
    if isinstance(module, nn.MultiheadAttention) and not module.batch_first:
        return [1] + [0] * (len(call.shapes) - 1)
    return [0] * len(call.shapes)


COMPOSITE = Composite()
