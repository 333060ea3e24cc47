"""The default exact engine: book-keeping clipping through module hooks, one forward and one backward.

One forward with hooks keeps, for every module that owns trainable parameters, its inputs A and
the gradient edge of its output; one backward of Σ_i ℓ_i computes only the output gradients G of
those modules (no parameter gradient); per layer, ``rules`` turns (A, G) into per-sample
squared norms and, once the clipping factors c_i = factors(n_i) are known, into the clipped sum
Σ_i c_i g_i from the same A and G (Bu et al. 2023, "Differentially private optimization on large
model at small cost"). A module called several times contributes the sum of its calls.

A closed-form rule needs the batch on dim 0 of its module's first input and of its output (as in
batch-first models); a first input shared by the batch (leading dim 1, e.g. position ids) is
expanded to the batch first, which leaves the model's outputs unchanged. A parameter no closed
form covers goes to the outermost module above it with none, taken as one unit
(``rules.composite``); a parameter used by several modules (tied) gets the sum of its per-example
gradients over those uses before its norm (``plan_modules``), in closed form for token embeddings
tied to an output layer (``rules.tied``).

On the first batch the engine also checks that each parameter's batch gradient (one extra
backward, that batch only) equals the sum of what the rules saw. A parameter also used outside the
module that handles it (which would make its norm too small) is handed to the module above, as one
unit, and the batch done again — the smallest module that contains every use; refused if even the
whole model does not account for it. Modules that mix examples (BatchNorm) are refused up front.

Memory: besides what autograd keeps anyway, the engine holds the output gradients G of the
recorded modules until the clipped sums are formed (``explain()`` lists what each rule kept).
When G would not fit (``max_kept_bytes``, by default half the free memory after the forward), it
falls back to two backward passes that hold one layer's G at a time; smaller physical
micro-batches (``max_physical_batch_size``) bound both.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge

from ...errors import UserError
from .batching import Inputs, batch_len, model_outputs
from .rules.composite import COMPOSITE, detached
from .rules.replay import REPLAYED
from .rules import CLOSED_FORMS
from .rules.base import Call, LayerGrads, NormContext, Rule, materialised_rule, outermost, unit_of
from .rules.broadcast import BROADCAST, Broadcast
from .norm_estimators import RANDOMISED_WEIGHT_NORMS
from .rules.packed import PACKED_ATTENTION, PACKED_BROADCAST, PACKED_FORMS, PACKED_UNIT
from .per_sample import FactorFn, LossFn, trainable_parameters
from .precision import Precision
from .rules.tied import closed_tie, tied_embedding_head

#: Relative tolerance of the first-batch check that the hooks saw every use of every parameter, and
#: its floor, relative to the norm of the whole batch gradient (a parameter whose true gradient is 0,
#: e.g. an InstanceNorm scale before a mean over positions, compares rounding errors).
COVERAGE_RTOL = 1e-3
COVERAGE_FLOOR = 1e-9
#: In half precision (bf16 weights or autocast) autograd's batch gradient is itself rounded to a few
#: bits: the check's tolerance is then this many units of the coarsest dtype's rounding (bf16: 3%,
#: fp16: 0.4%) — a use the hooks miss still shows as a difference of its own size.
COVERAGE_ULPS = 4


@dataclass
class _Planned:
    """A module that handles trainable parameters (its own, or as a composite unit those of its
    sub-modules), the rule that handles it, and the parameters' names inside it with their names in
    the model. ``tied``: those of its names used by other planned modules too."""

    name: str
    module: nn.Module
    rule: Rule
    names: list[str]
    qualified: list[str]
    tied: set = field(default_factory=set)
    calls: list[Call] = field(default_factory=list)
    edges: list = field(default_factory=list)
    form: str = "unused"
    kept_bytes: int = 0
    expected: int = 0  # output gradients awaited in a backward (two-pass mode)
    arrived: int = 0  # output gradients received in this backward (two-pass mode)
    reduced: bool = False  # its norms are taken in this backward (two-pass mode)
    sq: torch.Tensor | None = None  # per-sample squared norms, once reduced (two-pass mode)
    batch_grads: dict = field(default_factory=dict)  # Σ_i g_i for the coverage check (two-pass mode)

    def local_to_model(self) -> dict[str, str]:
        return dict(zip(self.names, self.qualified))


def _closed_form(module: nn.Module, local: str) -> Rule | None:
    """The closed-form rule for ``module``'s own parameter ``local``, if any."""
    if BROADCAST.handles(module) and local in BROADCAST.parameter_names(module):
        return PACKED_BROADCAST if PACKED_BROADCAST.handles(module) else BROADCAST
    return next((r for r in (*PACKED_FORMS, *CLOSED_FORMS) if r.handles(module)), None)


#: The rules that take a module with its sub-modules' parameters as one unit (besides ``COMPOSITE``,
#: the rule of a unit none of these takes).
UNIT_RULES = (REPLAYED, PACKED_ATTENTION, PACKED_UNIT)


def plan_modules(model: nn.Module, widened: frozenset[str] = frozenset()) -> list[_Planned]:
    """The modules that handle the trainable parameters, with their rules.

    A parameter whose module has a closed form is that module's; one whose module has none goes to
    the outermost such module above it, taken as one unit (``rules.composite``: a block that uses its
    parameter around a sub-module, a leaf of unknown algebra; ``rules.replay`` for attention and
    recurrent layers, their sub-modules' parameters included); so does one below a module of ``widened`` (names of modules found to use a
    parameter outside its own module). A parameter used by several modules (tied) is planned with
    each; the engine adds its per-example gradients over those uses before its norm."""
    first_name: dict[int, str] = {}
    owners: dict[int, list[tuple[str, nn.Module, str]]] = {}
    for mod_name, module in model.named_modules(remove_duplicate=False):
        first_name.setdefault(id(module), mod_name)
        for local, p in module.named_parameters(recurse=False):
            if p.requires_grad:
                entries = owners.setdefault(id(p), [])
                if all(m is not module for _, m, _ in entries):
                    entries.append((first_name[id(module)], module, local))
    canonical = {id(p): n for n, p in trainable_parameters(model).items()}
    units = {mod_name: module for entries in owners.values() for mod_name, module, local in entries
             if _closed_form(module, local) is None}
    units.update({name: model.get_submodule(name) for name in widened})
    units.update({name: m for name, m in model.named_modules() if any(r.handles(m) for r in UNIT_RULES)
                  and any(p.requires_grad for p in m.parameters())})
    outer = {u: units[u] for u in outermost(units)}
    planned: dict[tuple[int, str], _Planned] = {}
    for pid, entries in owners.items():
        uses: dict[tuple[int, str], tuple[str, nn.Module, Rule, str]] = {}
        for mod_name, module, local in entries:
            unit = unit_of(mod_name, outer)
            if unit is None:
                rule = _closed_form(module, local)
                uses.setdefault((id(module), rule.name), (mod_name, module, rule, local))
            else:
                inner = mod_name[len(unit):].lstrip(".") if unit else mod_name
                rule = next((r for r in UNIT_RULES if r.handles(outer[unit])), COMPOSITE)
                uses.setdefault((id(outer[unit]), rule.name),
                                (unit, outer[unit], rule, f"{inner}.{local}" if inner else local))
        for key, (name, module, rule, local) in uses.items():
            entry = planned.setdefault(key, _Planned(name, module, rule, [], []))
            entry.names.append(local)
            entry.qualified.append(canonical[pid])
            if len(uses) > 1:
                entry.tied.add(local)
    return list(planned.values())


class _Uncovered(Exception):
    """The first-batch check found parameters whose batch gradient the rules do not account for."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(", ".join(names))
        self.names = names


class BookKeepingEngine:
    """Per-sample norms and clipped sums through module hooks (see the module docstring).

    ``estimator`` (a ``norm_estimator``: "exact", ghost or materialised norms; "hutchinson" or
    "hutchpp") is used for the weights of the linear-like layers; ``sketch_k`` is the number of probes k of the randomised estimators;
    ``generator`` draws the probes (fresh for every micro-batch and layer, unless ``start_step``
    fixes them per logical batch and layer).

    ``precision`` (a :class:`~.precision.Precision` or its name): the forward runs under its
    autocast and, for fp16, the backward on the loss times its static scale (norms and factors
    undo it, in float32).

    ``max_kept_bytes`` bounds the output gradients G the engine may hold at once (None: half the
    device's free memory, read after the forward). Above it the engine falls back to two backward
    passes: the first reduces each layer to its per-sample norms as soon as its G arrives and
    drops G, the second backpropagates Σ_i c_i ℓ_i for the clipped sum (Opacus's ghost clipping:
    autograd's saved activations and one layer's G at a time, at ~1.5× the work).
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, *, estimator: str = "exact", sketch_k: int | None = None,
                 generator: torch.Generator | None = None, max_kept_bytes: int | None = None,
                 precision: Precision | str = "fp32") -> None:
        if estimator != "exact" and estimator not in RANDOMISED_WEIGHT_NORMS:
            raise UserError(f"estimator must be one of {', '.join(['exact', *RANDOMISED_WEIGHT_NORMS])}; "
                            f"got {estimator!r}")
        self.model = model
        self.loss_fn = loss_fn
        self.precision = precision if isinstance(precision, Precision) else Precision(precision)
        self.ctx = NormContext(estimator, sketch_k, generator, precision=self.precision)
        self.params = trainable_parameters(model)
        self.widened: frozenset[str] = frozenset()
        self.planned = plan_modules(model)
        self.ctx.layers = {id(e.module): i for i, e in enumerate(self.planned)}
        self.checked = False
        self.max_kept_bytes = max_kept_bytes
        self.mode = "book-keeping"
        self._streaming: Callable[[_Planned], None] | None = None   # two-pass mode: each layer's reduction
        self._sums: dict[str, torch.Tensor] = {}
        self._factors: torch.Tensor | None = None
        self._tied: dict[str, torch.Tensor] = {}   # tied parameter → its per-example gradients, summed over uses
        self._tied_uses: dict[str, list] = {}  # tied embedding/output weight → (module, calls) of its uses
        self._batch_size = 0

    def start_step(self, seed: int | None) -> None:
        """Draw the randomised estimators' probes of the coming logical batch per layer from
        ``seed`` (the same for all its micro-batches and workers); None: fresh on every call."""
        self.ctx.step_seed = seed

    # ---- forward: record inputs and output edges --------------------------------------------------

    @contextlib.contextmanager
    def _recording(self, batch_size: int) -> Iterator[None]:
        """Hooks on the planned modules for the duration of one forward pass."""

        def broadcast_input(entry: _Planned, module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
            # An input shared by the batch (e.g. position ids [1, T]) is expanded to the batch, so
            # that the output's gradient stays per example; the result is the same broadcast.
            if batch_size > 1 and args and isinstance(args[0], torch.Tensor) and args[0].dim() > 0 \
                    and args[0].shape[0] == 1:
                return (args[0].expand(batch_size, *args[0].shape[1:]), *args[1:]), kwargs
            return None

        def record(entry: _Planned, module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            where = ", ".join(entry.qualified)
            outputs = entry.rule.outputs(module, output, where)
            if not any(t.requires_grad for t in outputs):
                return  # no gradient flows to its parameters through this call
            entry.rule.check_call(module, args, kwargs, outputs, batch_size, where)
            self._track(entry, Call(detached(args), detached(kwargs)), outputs)

        def expand_parameters(entry: _Planned, module: nn.Module, args: tuple, kwargs: dict) -> None:
            # The model sees each broadcast parameter as its per-example expansion [b, *shape[1:]].
            for local in entry.names:
                p = module._parameters[local]
                expanded = p.expand(batch_size, *p.shape[1:])
                module._parameters[local] = expanded
                self._track(entry, Call((local,), {}), [expanded])

        def restore_parameters(entry: _Planned, params: dict) -> None:
            for local, p in params.items():
                entry.module._parameters[local] = p

        handles, restores = [], []
        for e in self.planned:
            if isinstance(e.rule, Broadcast):
                saved = {n: e.module._parameters[n] for n in e.names}
                handles.append(e.module.register_forward_pre_hook(functools.partial(expand_parameters, e),
                                                                  with_kwargs=True))
                restores.append(functools.partial(restore_parameters, e, saved))
            else:
                if e.rule.expands_shared_input:
                    handles.append(e.module.register_forward_pre_hook(functools.partial(broadcast_input, e),
                                                                      with_kwargs=True))
                handles.append(e.module.register_forward_hook(functools.partial(record, e), with_kwargs=True))
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            for restore in restores:
                restore()

    def _track(self, entry: _Planned, call: Call, outputs: list[torch.Tensor]) -> None:
        """Keep ``call`` with the gradient edges of its outputs; each G is delivered by a tensor hook."""
        entry.calls.append(call)
        call.grads = [None] * len(outputs)
        call.shapes = [(t.shape, t.dtype, t.device) for t in outputs]
        call.out_bytes = sum(t.numel() * t.element_size() for t in outputs)
        for j, output in enumerate(outputs):
            if output.requires_grad:
                entry.edges.append(get_gradient_edge(output))
                entry.expected += 1
                output.register_hook(functools.partial(self._arrived, entry, call, j))

    def _arrived(self, entry: _Planned, call: Call, j: int, grad: torch.Tensor) -> None:
        """Tensor hook: the gradient of output j of one call (before any in-place change of it)."""
        call.grads[j] = grad.detach()
        if self._streaming is not None:
            entry.arrived += 1
            if entry.arrived == entry.expected:
                self._streaming(entry)

    def _layer(self, entry: _Planned, batch_size: int) -> LayerGrads | None:
        """``entry``'s per-sample view of its untied parameters (None if it has none or got no
        gradient); its tied parameters' per-example gradients are added to ``self._tied``."""
        calls = [c for c in entry.calls if c.received]
        if not calls:
            return None
        tied = [n for n in entry.names if n in entry.tied]
        kept, form = 0, ""
        closed = [n for n in tied if closed_tie(self._uses(entry.qualified[entry.names.index(n)]))]
        for local in closed:  # its norm is taken once every use is in (``_tied_layer``)
            q = entry.qualified[entry.names.index(local)]
            self._tied_uses.setdefault(q, []).append(
                (entry.module, [Call(c.args, {}, list(c.grads)) for c in calls]))
        if closed:
            form = f"tied {', '.join(closed)}: closed form with its other uses (embedding + output layer)"
        vmapped = [n for n in tied if n not in closed]
        if vmapped:
            for local, g in COMPOSITE.per_example(entry.module, calls, vmapped, batch_size, self.ctx.precision).items():
                q = entry.qualified[entry.names.index(local)]
                self._tied[q] = self._tied[q] + g if q in self._tied else g
                kept += g.numel() * g.element_size()
            uses = sorted({e.name or "<root>" for n in vmapped for e, _ in
                           self._uses(entry.qualified[entry.names.index(n)], entries=True)})
            form = "; ".join(f for f in (form, f"tied {', '.join(vmapped)}: per-example vmap, summed over its "
                                         f"uses ({', '.join(uses)})") if f)
        own = [n for n in entry.names if n not in entry.tied]
        grads = entry.rule.per_sample(entry.module, calls, own, self.ctx, batch_size) if own else None
        entry.form = "; ".join(f for f in (grads.form if grads else "", form) if f)
        entry.kept_bytes = kept + (grads.kept_bytes if grads else 0)
        return grads

    def _uses(self, qualified: str, entries: bool = False) -> list:
        """The planned uses of a parameter: (module, its local name there), or (entry, local name)."""
        return [(e if entries else e.module, local) for e in self.planned
                for local, q in zip(e.names, e.qualified) if q == qualified]

    def _tied_layer(self) -> list[tuple[dict[str, str], LayerGrads]]:
        """The tied parameters as more layers: a tied embedding and output layer in closed form
        (``rules.tied``), the others from their summed per-example gradients."""
        layers = [({"weight": q}, tied_embedding_head(uses, self.params[q], self._batch_size))
                  for q, uses in self._tied_uses.items()]
        if self._tied:
            layers.append(({q: q for q in self._tied}, materialised_rule(self._tied, "tied", 0)))
        return layers

    def _reduce(self, entry: _Planned) -> None:
        """Two-pass mode, first pass: one layer's per-sample norms (and, first batch, its Σ_i g_i);
        drop its G (its inputs A stay for the second pass)."""
        entry.reduced = True
        grads = self._layer(entry, self._batch_size)
        if grads is not None:
            entry.sq = grads.sq
            if not self.checked:
                entry.batch_grads = grads.clipped(torch.ones_like(grads.sq))
        for call in entry.calls:
            call.clear()

    def _reduce_clipped(self, entry: _Planned) -> None:
        """Two-pass mode, second pass: one layer's Σ_i c_i g_i from its rule and its (A, G), so no
        example counts for more than its norm says, whatever path the batch took; drop A and G."""
        calls = [c for c in entry.calls if c.received]
        own = [n for n in entry.names if n not in entry.tied]
        if calls and own:
            grads = entry.rule.per_sample(entry.module, calls, own, self.ctx, self._batch_size)
            self._add(self._sums, entry.local_to_model(), grads.clipped(self._factors))
        for call in entry.calls:
            call.args, call.kwargs, call.grads = (), {}, []

    def _add(self, sums: dict[str, torch.Tensor], names: dict[str, str], grads: dict[str, torch.Tensor]) -> None:
        """Add a layer's gradients (fresh tensors from its rule) to ``sums``; the first one of a
        parameter is taken as it is (no zeros to fill and add to: a pass over every parameter)."""
        for local, g in grads.items():
            q = names[local]
            p = self.params[q]
            g = g.reshape(p.shape).to(torch.promote_types(p.dtype, torch.float32))   # never rounded to half
            if q in sums:
                sums[q] += g
            else:
                sums[q] = g

    def _all(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``sums`` with zeros for the parameters no layer gave gradient, in the parameters' order."""
        return {n: sums[n] if n in sums else torch.zeros_like(p, dtype=torch.promote_types(p.dtype, torch.float32))
                for n, p in self.params.items()}

    # ---- one micro-batch ----------------------------------------------------------------------------

    def clipped_sum(self, inputs: Inputs, targets: torch.Tensor,
                    factors: FactorFn) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(Σ_i c_i g_i per trainable parameter, per-sample norms n_i) with c = factors(n).

        On the first batch, a parameter whose batch gradient the rules do not account for (used
        outside the module that handles it) is handed to the module above that one, as one unit,
        and the batch is done again, until it is accounted for; refused if even the whole model is
        not enough."""
        while True:
            try:
                return self._clipped_sum(inputs, targets, factors)
            except _Uncovered as uncovered:
                self._widen(uncovered.names)

    def _widen(self, names: list[str]) -> None:
        """Re-plan with the module above each handler of ``names`` taken as one unit."""
        handlers = {e.name for e in self.planned if set(e.qualified) & set(names)}
        if "" in handlers or not handlers:
            raise UserError(", ".join(map(self._with_uses, names)) + ": no per-example gradient, even with the "
                            "whole model as one unit: their batch gradient is not the sum of per-example ones (a "
                            "use that mixes examples, or randomness the replay cannot draw again)")
        self.widened |= {h.rsplit(".", 1)[0] if "." in h else "" for h in handlers}
        self.planned = plan_modules(self.model, self.widened)
        self.ctx.layers = {id(e.module): i for i, e in enumerate(self.planned)}

    def _clipped_sum(self, inputs: Inputs, targets: torch.Tensor,
                     factors: FactorFn) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        self._batch_size = batch_len(inputs)
        self._reset()
        try:
            with self._recording(self._batch_size), self.precision.autocast(targets.device):
                outputs = model_outputs(self.model, inputs)
                losses = self.loss_fn(outputs, targets)  # [b]
            if self.precision.loss_scale != 1:   # fp16: the backward sees S·ℓ_i (``_norms`` and ``_factors`` undo S)
                losses = losses * self.precision.loss_scale
            kept = sum(c.out_bytes for e in self.planned for c in e.calls)
            if kept <= self._budget(losses.device):
                self.mode = "book-keeping"
                return self._book_keeping(losses, factors)
            self.mode = "two backward passes"
            return self._two_passes(losses, factors)
        finally:
            self._reset()  # release the stored activations and gradients

    def _reset(self) -> None:
        self._streaming, self._sums, self._factors, self._tied, self._tied_uses = None, {}, None, {}, {}
        for entry in self.planned:
            entry.calls, entry.edges, entry.sq, entry.batch_grads = [], [], None, {}
            entry.expected = entry.arrived = 0
            entry.reduced = False

    def _budget(self, device: torch.device) -> float:
        """Bytes of output gradients the engine may keep (``max_kept_bytes``, else half the free memory)."""
        if self.max_kept_bytes is not None:
            return self.max_kept_bytes
        return 0.5 * free_memory(device)

    def _book_keeping(self, losses: torch.Tensor, factors: FactorFn) -> tuple[dict, torch.Tensor]:
        """One backward to the recorded outputs; norms and clipped sums from the same A and G."""
        reference = None
        if not self.checked:  # the coverage check's reference, first batch only
            reference = torch.autograd.grad(losses.sum(), list(self.params.values()), retain_graph=True,
                                            allow_unused=True)
            for entry in self.planned:
                for call in entry.calls:
                    call.clear()  # the hooks fired for the reference too: start again
        edges = [edge for entry in self.planned for edge in entry.edges]
        if edges:  # G reaches each call through its tensor hook
            torch.autograd.grad(losses.sum(), edges, allow_unused=True, materialize_grads=False)
        layers = []
        for entry in self.planned:
            grads = self._layer(entry, len(losses))
            if grads is not None:
                layers.append((entry.local_to_model(), grads))
        layers += self._tied_layer()
        if reference is not None:
            recon = {n: torch.zeros_like(p) for n, p in self.params.items()}
            for names, grads in layers:
                self._add(recon, names, grads.clipped(torch.ones_like(grads.sq)))
            self._check_coverage(recon, dict(zip(self.params, reference)), {q for names, _ in layers for q in names.values()})
        norms = self._norms([grads.sq for _, grads in layers], losses)
        c = self._factors_of(factors, norms)  # [b]
        sums: dict[str, torch.Tensor] = {}
        for names, grads in layers:
            self._add(sums, names, grads.clipped(c))
        return self._all(sums), norms

    def _two_passes(self, losses: torch.Tensor, factors: FactorFn) -> tuple[dict, torch.Tensor]:
        """Norms layer by layer during a first backward (each G dropped as it is used), then the
        clipped sums layer by layer during a second backward to the recorded outputs, from the same
        rules as the norms (Opacus's ghost clipping takes the clipped sum from autograd instead, which
        counts a use of a parameter the hooks do not see and so can exceed C for that example).
        Tied parameters keep their summed per-example gradients between the passes (a tied
        embedding and output layer: the inputs and output gradients of its uses).
        Every step checks that no parameter got gradient from a module whose hooks did not fire."""
        params = list(self.params.values())
        self._streaming = self._reduce
        batch = torch.autograd.grad(losses.sum(), params, retain_graph=True, allow_unused=True)
        self._streaming = None
        for entry in self.planned:
            if entry.calls and not entry.reduced:
                self._reduce(entry)  # some of its outputs got no gradient
        tied = self._tied_layer()
        if not self.checked:
            recon = {n: torch.zeros_like(p) for n, p in self.params.items()}
            for e in self.planned:
                self._add(recon, e.local_to_model(), e.batch_grads)
            for names, grads in tied:
                self._add(recon, names, grads.clipped(torch.ones_like(grads.sq)))
            self._check_coverage(recon, dict(zip(self.params, batch)),
                                 {q for e in self.planned if e.batch_grads for q in e.qualified}
                                 | {q for names, _ in tied for q in names.values()})
        reached = dict(zip(self.params, batch))
        unseen = [q for e in self.planned if not e.calls for q in e.qualified
                  if reached.get(q) is not None and bool(reached[q].abs().max() > 0)]
        if unseen:
            raise UserError("these parameters get gradient the hooks do not see (used outside their module, e.g. by "
                            "a functional call on some inputs, which the first batch did not take): "
                            + ", ".join(unseen))
        norms = self._norms([e.sq for e in self.planned if e.sq is not None] + [g.sq for _, g in tied], losses)
        self._factors = self._factors_of(factors, norms)  # [b]
        self._sums = {}
        for names, grads in tied:
            self._add(self._sums, names, grads.clipped(self._factors))
        for entry in self.planned:
            entry.arrived = 0
        edges = [edge for entry in self.planned for edge in entry.edges]
        self._streaming = self._reduce_clipped
        if edges:
            torch.autograd.grad(losses.sum(), edges, allow_unused=True, materialize_grads=False)
        self._streaming = None
        for entry in self.planned:   # a layer some of whose outputs got no gradient
            if any(c.received for c in entry.calls):
                self._reduce_clipped(entry)
        return self._all(self._sums), norms

    def _norms(self, squares: list[torch.Tensor], losses: torch.Tensor) -> torch.Tensor:
        """n_i = √(Σ over layers of the per-sample squared norms) [b], in at least float32 whatever the
        model's dtype (a half-precision norm rounds below the true one, and fp16 overflows above
        65504), the loss scale undone."""
        sq = torch.zeros(len(losses), device=losses.device, dtype=torch.promote_types(losses.dtype, torch.float32))
        for part in squares:
            sq = sq + part.to(sq.dtype)
        return sq.clamp_min(0).sqrt() / self.precision.loss_scale

    def _factors_of(self, factors: FactorFn, norms: torch.Tensor) -> torch.Tensor:
        """c_i = factors(n_i) for the true norms, divided by the loss scale: the rules multiply the
        scaled gradients S·g_i by c_i, which gives factors(n_i)·g_i (in float32)."""
        return factors(norms).detach() / self.precision.loss_scale

    def _check_coverage(self, recon: dict[str, torch.Tensor], reference: dict[str, torch.Tensor | None],
                        seen: set[str]) -> None:
        """Each parameter's batch gradient equals Σ_i g_i from its rules (c = 1, ``recon``; ``seen``:
        the parameters some rule gave gradient); else refuse it. A batch whose gradient is not finite
        (an example's NaN) proves nothing: the next one is checked."""
        if not all(bool(torch.isfinite(g).all()) for g in (*recon.values(), *reference.values()) if g is not None):
            return
        total = math.sqrt(sum(float(g.double().pow(2).sum()) for g in reference.values() if g is not None))
        coarse = [self.precision.dtype, *(p.dtype for p in self.params.values())]
        rtol = max([COVERAGE_RTOL] + [COVERAGE_ULPS * torch.finfo(d).eps for d in coarse
                                      if d in (torch.bfloat16, torch.float16)])
        missing = [q for q, g in recon.items()
                   if not _close(g if q in seen else None, reference.get(q), COVERAGE_FLOOR * total, rtol)]
        if missing:
            raise _Uncovered(missing)
        self.checked = True

    def _with_uses(self, qualified: str) -> str:
        """A parameter's name, with the modules that use it when it is tied."""
        uses = [e.name or "<root>" for e in self.planned if qualified in e.qualified]
        return qualified if len(uses) < 2 else f"{qualified} (tied: used by {', '.join(uses)})"

    def explain(self) -> list[dict]:
        """Per recorded module of the last micro-batch: its parameters, the rule, the form used for
        the per-sample norms, the bytes the rule kept for them (besides autograd's own) and the
        engine's mode (book-keeping, or two backward passes when G would not fit)."""
        return [{"module": e.name or "<root>", "parameters": ", ".join(e.names), "rule": e.rule.name,
                 "form": e.form, "kept_bytes": e.kept_bytes, "mode": self.mode} for e in self.planned]


def free_memory(device: torch.device) -> float:
    """Free bytes on ``device``: CUDA's free memory, else the host's MemAvailable (inf if unknown)."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return math.inf


def _close(recon: torch.Tensor | None, reference: torch.Tensor | None, floor: float,
           rtol: float = COVERAGE_RTOL) -> bool:
    """The rule's batch gradient matches autograd's (None: no gradient) within ``rtol``, or differs
    by less than ``floor``."""
    ref = torch.zeros(()) if reference is None else reference.to(torch.promote_types(reference.dtype, torch.float32))
    got = torch.zeros((), dtype=ref.dtype) if recon is None else recon.to(ref.dtype)
    if recon is not None and reference is not None:
        got = got.reshape(ref.shape)
    diff = float((got - ref).norm())
    return diff <= max(rtol * max(float(ref.norm()), float(got.norm())), floor)
