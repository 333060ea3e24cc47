"""The default exact engine: book-keeping clipping through module hooks, one forward and one backward.

One forward with hooks keeps, for every module that owns trainable parameters, its inputs A and
the gradient edge of its output; one backward of Σ_i ℓ_i computes only the output gradients G of
those modules (no parameter gradient); per layer, ``layer_rules`` turns (A, G) into per-sample
squared norms and, once the clipping factors c_i = factors(n_i) are known, into the clipped sum
Σ_i c_i g_i from the same A and G (Bu et al. 2023, "Differentially private optimization on large
model at small cost"). A module called several times contributes the sum of its calls.

Every hooked module must see the batch on dim 0 of its first input and of its output (as in
batch-first models); a first input shared by the batch (leading dim 1, e.g. position ids) is
expanded to the batch first, which leaves the model's outputs unchanged.

A trainable parameter owned by a non-leaf module that no rule handles, or shared by several
modules, is refused when the engine is built, all of them listed. On the first batch the engine
also checks that each parameter's batch gradient (one extra backward, that batch only) equals the
sum of what its module's rule saw, so a parameter also used outside its module (which would make
its norm too small) is refused too.

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

from ..errors import UserError
from .batching import Inputs, batch_len, model_outputs
from .layer_rules import BROADCAST, RULES, Call, NormContext, Rule
from .norm_estimators import WEIGHT_NORMS
from .per_sample import FactorFn, LossFn, trainable_parameters

#: Relative tolerance of the first-batch check that the hooks saw every use of every parameter.
COVERAGE_RTOL = 1e-3


@dataclass
class _Planned:
    """A module with trainable parameters of its own, the rule that handles it, and its trainable
    parameter names (local) with their names in the model."""

    name: str
    module: nn.Module
    rule: Rule
    names: list[str]
    qualified: list[str]
    calls: list[Call] = field(default_factory=list)
    edges: list = field(default_factory=list)
    form: str = "unused"
    kept_bytes: int = 0
    arrived: int = 0  # output gradients received in this backward (two-pass mode)
    sq: torch.Tensor | None = None  # per-sample squared norms, once reduced (two-pass mode)
    batch_grads: dict = field(default_factory=dict)  # Σ_i g_i for the coverage check (two-pass mode)


def plan_modules(model: nn.Module) -> list[_Planned]:
    """The modules that own trainable parameters and their rules; raises ValueError listing every
    trainable parameter no rule can give a per-sample norm."""
    owners: dict[int, list[tuple[str, nn.Module, str]]] = {}
    for mod_name, module in model.named_modules(remove_duplicate=False):
        for local, p in module.named_parameters(recurse=False):
            if p.requires_grad:
                entries = owners.setdefault(id(p), [])
                if all(m is not module for _, m, _ in entries):
                    entries.append((mod_name, module, local))
    problems, planned = [], {}
    for entries in owners.values():
        mod_name, module, local = entries[0]
        qualified = f"{mod_name}.{local}" if mod_name else local
        if len(entries) > 1:
            problems.append(f"{qualified}: shared by modules {', '.join(e[0] or '<root>' for e in entries)}; "
                            "their per-sample gradients add up before the norm (untie or freeze it)")
            continue
        if BROADCAST.handles(module) and local in BROADCAST.parameter_names(module):
            rule: Rule | None = BROADCAST
        else:
            rule = next((r for r in RULES if r.handles(module)), None)
        if rule is None:
            problems.append(f"{qualified}: owned by {type(module).__name__}, which has sub-modules and no "
                            "per-sample rule (wrap the parameter in its own leaf module, or freeze it)")
            continue
        entry = planned.setdefault((id(module), rule.name), _Planned(mod_name, module, rule, [], []))
        entry.names.append(local)
        entry.qualified.append(qualified)
    if problems:
        raise UserError("no per-sample norm for these trainable parameters:\n  " + "\n  ".join(problems))
    return list(planned.values())


class BookKeepingEngine:
    """Per-sample norms and clipped sums through module hooks (see the module docstring).

    ``estimator`` ("ghost" exact, "hutchinson" or "hutchpp") is used for the weights of the
    linear-like layers; ``sketch_k`` is the number of probes k of the randomised estimators;
    ``generator`` draws the probes (fresh for every micro-batch and layer, unless ``start_step``
    fixes them per logical batch and layer).

    ``max_kept_bytes`` bounds the output gradients G the engine may hold at once (None: half the
    device's free memory, read after the forward). Above it the engine falls back to two backward
    passes: the first reduces each layer to its per-sample norms as soon as its G arrives and
    drops G, the second backpropagates Σ_i c_i ℓ_i for the clipped sum (Opacus's ghost clipping:
    autograd's saved activations and one layer's G at a time, at ~1.5× the work).
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, *, estimator: str = "ghost", sketch_k: int | None = None,
                 generator: torch.Generator | None = None, max_kept_bytes: int | None = None) -> None:
        if estimator not in WEIGHT_NORMS:
            raise UserError(f"estimator must be one of {', '.join(WEIGHT_NORMS)}; got {estimator!r}")
        self.model = model
        self.loss_fn = loss_fn
        self.ctx = NormContext(estimator, sketch_k, generator)
        self.params = trainable_parameters(model)
        self.planned = plan_modules(model)
        self.ctx.layers = {id(e.module): i for i, e in enumerate(self.planned)}
        self.checked = False
        self.max_kept_bytes = max_kept_bytes
        self.mode = "book-keeping"
        self._streaming: Callable[[_Planned], None] | None = None   # two-pass mode: each layer's reduction
        self._sums: dict[str, torch.Tensor] = {}
        self._factors: torch.Tensor | None = None

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
            if not isinstance(output, torch.Tensor):
                raise UserError(f"{', '.join(entry.qualified)}: {type(module).__name__} returns "
                                 f"{type(output).__name__}, not one tensor; no per-sample rule")
            if not output.requires_grad:
                return  # no gradient flows to its parameters through this call
            if not (args and isinstance(args[0], torch.Tensor) and args[0].shape[:1] == output.shape[:1]
                    == (batch_size,)):
                raise UserError(f"{', '.join(entry.qualified)}: the engine needs the batch on dim 0 of "
                                 f"{type(module).__name__}'s first input and output")
            call = Call(tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args), dict(kwargs))
            self._track(entry, call, output)

        def expand_parameters(entry: _Planned, module: nn.Module, args: tuple, kwargs: dict) -> None:
            # The model sees each broadcast parameter as its per-example expansion [b, *shape[1:]].
            for local in entry.names:
                p = module._parameters[local]
                expanded = p.expand(batch_size, *p.shape[1:])
                module._parameters[local] = expanded
                self._track(entry, Call((local,), {}), expanded)

        def restore_parameters(entry: _Planned, params: dict) -> None:
            for local, p in params.items():
                entry.module._parameters[local] = p

        handles, restores = [], []
        for e in self.planned:
            if e.rule is BROADCAST:
                saved = {n: e.module._parameters[n] for n in e.names}
                handles.append(e.module.register_forward_pre_hook(functools.partial(expand_parameters, e),
                                                                  with_kwargs=True))
                restores.append(functools.partial(restore_parameters, e, saved))
            else:
                handles += [e.module.register_forward_pre_hook(functools.partial(broadcast_input, e),
                                                               with_kwargs=True),
                            e.module.register_forward_hook(functools.partial(record, e), with_kwargs=True)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            for restore in restores:
                restore()

    def _track(self, entry: _Planned, call: Call, output: torch.Tensor) -> None:
        """Keep ``call`` with its output's gradient edge; its G is delivered by a tensor hook."""
        entry.calls.append(call)
        entry.edges.append(get_gradient_edge(output))
        call.out_bytes = output.numel() * output.element_size()
        output.register_hook(functools.partial(self._arrived, entry, call))

    def _arrived(self, entry: _Planned, call: Call, grad: torch.Tensor) -> None:
        """Tensor hook: the output gradient G of one call (before any in-place change of the output)."""
        call.grad = grad.detach().unsqueeze(1) if entry.rule is BROADCAST else grad.detach()
        if self._streaming is not None:
            entry.arrived += 1
            if entry.arrived == len(entry.calls):
                self._streaming(entry)

    def _reduce(self, entry: _Planned) -> None:
        """Two-pass mode, first pass: one layer's per-sample norms (and, first batch, its Σ_i g_i);
        drop its G (its inputs A stay for the second pass)."""
        calls = [c for c in entry.calls if c.grad is not None]
        if calls:
            grads = entry.rule.per_sample(entry.module, calls, entry.names, self.ctx, len(calls[0].grad))
            entry.sq, entry.form, entry.kept_bytes = grads.sq, grads.form, grads.kept_bytes
            if not self.checked:
                entry.batch_grads = grads.clipped(torch.ones_like(grads.sq))
        for call in entry.calls:
            call.grad = None

    def _reduce_clipped(self, entry: _Planned) -> None:
        """Two-pass mode, second pass: one layer's Σ_i c_i g_i from its rule and its (A, G), so no
        example counts for more than its norm says, whatever path the batch took; drop A and G."""
        calls = [c for c in entry.calls if c.grad is not None]
        if calls:
            grads = entry.rule.per_sample(entry.module, calls, entry.names, self.ctx, len(calls[0].grad))
            for local, g in grads.clipped(self._factors).items():
                qualified = entry.qualified[entry.names.index(local)]
                self._sums[qualified] += g.reshape(self._sums[qualified].shape).to(self._sums[qualified].dtype)
        for call in entry.calls:
            call.args, call.grad = (), None

    # ---- one micro-batch ----------------------------------------------------------------------------

    def clipped_sum(self, inputs: Inputs, targets: torch.Tensor,
                    factors: FactorFn) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(Σ_i c_i g_i per trainable parameter, per-sample norms n_i) with c = factors(n)."""
        batch_size = batch_len(inputs)
        for entry in self.planned:
            entry.calls, entry.edges, entry.arrived, entry.sq, entry.batch_grads = [], [], 0, None, {}
        try:
            with self._recording(batch_size):
                outputs = model_outputs(self.model, inputs)
            losses = self.loss_fn(outputs, targets)  # [b]
            kept = sum(c.out_bytes for e in self.planned for c in e.calls)
            if kept <= self._budget(losses.device):
                self.mode = "book-keeping"
                return self._book_keeping(losses, factors)
            self.mode = "two backward passes"
            return self._two_passes(losses, factors)
        finally:
            self._streaming, self._sums, self._factors = None, {}, None
            for entry in self.planned:  # release the stored activations and gradients
                entry.calls, entry.edges, entry.sq, entry.batch_grads = [], [], None, {}

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
                    call.grad = None  # the hooks fired for the reference too: start again
        edges = [edge for entry in self.planned for edge in entry.edges]
        if edges:  # G reaches each call through its tensor hook
            torch.autograd.grad(losses.sum(), edges, allow_unused=True, materialize_grads=False)
        layers = []
        for entry in self.planned:
            calls = [c for c in entry.calls if c.grad is not None]
            if calls:
                grads = entry.rule.per_sample(entry.module, calls, entry.names, self.ctx, len(losses))
                entry.form, entry.kept_bytes = grads.form, grads.kept_bytes
                layers.append((entry, grads))
        if reference is not None:
            self._check_coverage({e.qualified[e.names.index(local)]: g for e, grads in layers
                                  for local, g in grads.clipped(torch.ones_like(grads.sq)).items()},
                                 dict(zip(self.params, reference)))
        norms = self._norms([grads.sq for _, grads in layers], losses)
        c = factors(norms).detach()  # [b]
        sums = {n: torch.zeros_like(p) for n, p in self.params.items()}
        for entry, grads in layers:
            for local, g in grads.clipped(c).items():
                qualified = entry.qualified[entry.names.index(local)]
                sums[qualified] += g.reshape(sums[qualified].shape).to(sums[qualified].dtype)
        return sums, norms

    def _two_passes(self, losses: torch.Tensor, factors: FactorFn) -> tuple[dict, torch.Tensor]:
        """Norms layer by layer during a first backward (each G dropped as it is used), then the
        clipped sums layer by layer during a second backward to the recorded outputs, from the same
        rules as the norms (Opacus's ghost clipping takes the clipped sum from autograd instead, which
        counts a use of a parameter the hooks do not see and so can exceed C for that example).
        Every step checks that no parameter got gradient from a module whose hooks did not fire."""
        params = list(self.params.values())
        self._streaming = self._reduce
        batch = torch.autograd.grad(losses.sum(), params, retain_graph=True, allow_unused=True)
        self._streaming = None
        for entry in self.planned:
            if entry.calls and entry.sq is None:
                self._reduce(entry)  # some of its outputs got no gradient
        if not self.checked:
            self._check_coverage({e.qualified[e.names.index(local)]: g for e in self.planned
                                  for local, g in e.batch_grads.items()}, dict(zip(self.params, batch)))
        reached = dict(zip(self.params, batch))
        unseen = [q for e in self.planned if not e.calls for q in e.qualified
                  if reached.get(q) is not None and bool(reached[q].abs().max() > 0)]
        if unseen:
            raise UserError("these parameters get gradient the hooks do not see (used outside their module, e.g. by "
                            "a functional call on some inputs): " + ", ".join(unseen))
        norms = self._norms([e.sq for e in self.planned if e.sq is not None], losses)
        self._factors = factors(norms).detach()  # [b]
        self._sums = {n: torch.zeros_like(p) for n, p in self.params.items()}
        for entry in self.planned:
            entry.arrived = 0
        edges = [edge for entry in self.planned for edge in entry.edges]
        self._streaming = self._reduce_clipped
        if edges:
            torch.autograd.grad(losses.sum(), edges, allow_unused=True, materialize_grads=False)
        self._streaming = None
        for entry in self.planned:   # a layer some of whose outputs got no gradient
            if any(c.grad is not None for c in entry.calls):
                self._reduce_clipped(entry)
        return self._sums, norms

    def _norms(self, squares: list[torch.Tensor], losses: torch.Tensor) -> torch.Tensor:
        """n_i = √(Σ over layers of the per-sample squared norms) [b]."""
        sq = torch.zeros(len(losses), device=losses.device, dtype=torch.promote_types(losses.dtype, torch.float32))
        for part in squares:
            sq = sq + part.to(sq.dtype)
        return sq.clamp_min(0).sqrt().to(losses.dtype)

    def _check_coverage(self, recon: dict[str, torch.Tensor], reference: dict[str, torch.Tensor | None]) -> None:
        """Each parameter's batch gradient equals Σ_i g_i from its rule (c = 1, ``recon``); else refuse it.
        A batch whose gradient is not finite (an example's NaN) proves nothing: the next one is checked."""
        if not all(bool(torch.isfinite(g).all()) for g in (*recon.values(), *reference.values()) if g is not None):
            return
        missing = [q for q, g in recon.items() if not _close(g, reference.get(q))]
        missing += [q for q, g in reference.items() if q not in recon and g is not None and bool(g.abs().max() > 0)]
        if missing:
            raise UserError("these parameters get gradient the hooks do not see (used outside their "
                             "module, e.g. by a functional call): " + ", ".join(missing))
        self.checked = True

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


def _close(recon: torch.Tensor | None, reference: torch.Tensor | None) -> bool:
    """The rule's batch gradient matches autograd's (None: no gradient)."""
    if reference is None:
        return recon is None or not bool(recon.abs().max() > 0)
    if recon is None:
        return not bool(reference.abs().max() > 0)
    ref = reference.to(torch.promote_types(reference.dtype, torch.float32))
    diff = (recon.to(ref.dtype).reshape(ref.shape) - ref).norm()
    return bool(diff <= COVERAGE_RTOL * torch.maximum(ref.norm(), recon.to(ref.dtype).norm()))


