"""Hook-based per-sample norms and clipped sums (DESIGN "The DP step", "Randomized clipping").

One forward pass with hooks keeps each module's inputs; the first backward (of Σ_i ℓ_i) delivers
each module output's gradient G through a tensor hook; per-sample squared norms are computed per
module from (inputs, G) and summed over modules; a second backward of Σ_i c_i·ℓ_i, c_i = factors(n_i),
gives the clipped sum Σ_i c_i g_i. A module called several times contributes the sum of its calls.

Module families (``FAMILIES``, tried in order; each gives the per-sample norms of the module's own
trainable parameters):

- linear-like (``nn.Linear``, HF ``Conv1D``, ``nn.Conv2d`` with groups = 1 through unfold): the
  weight by the chosen estimator — ghost (exact), Hutchinson or Hutch++ (``norm_estimators``) —
  so the randomised paths never materialise a per-sample weight gradient; the bias exactly.
- ``nn.Embedding``: exact, by summing G over each example's repeated tokens (no [V, d] per example).
- any other *leaf* module (LayerNorm, GroupNorm, RMSNorm, a subclassed Linear, …): exact per-sample
  gradients of its own parameters by ``torch.func`` (vmap of a vjp through the module alone).

Every hooked module must see the batch on dim 0 of its first input and of its output (as in
batch-first models); a first input shared by the batch (leading dim 1, e.g. position ids) is
expanded to the batch first, which leaves the model's outputs unchanged.

A trainable parameter owned by a non-leaf module that no family handles, or shared by several
modules, is refused when the engine is built, all of them listed. On the first batch the engine
also checks that each parameter's batch gradient equals the sum of what its module's hooks saw, so
a parameter also used outside its module (which would make its norm too small) is refused too.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vjp, vmap

from .batching import Inputs, batch_len, model_outputs
from .norm_estimators import WEIGHT_NORMS
from .per_sample import FactorFn, LossFn, trainable_parameters

#: Relative tolerance of the first-batch check that the hooks saw every use of every parameter.
COVERAGE_RTOL = 1e-3


@dataclass
class Call:
    """One forward call of a hooked module: its (detached) inputs and, after the first backward,
    the gradient of Σ_i ℓ_i with respect to its output."""

    args: tuple
    kwargs: dict
    grad: torch.Tensor | None = None


@dataclass
class NormContext:
    """What a family needs besides the module: the weight estimator and its randomness."""

    estimator: str
    sketch_k: int | None
    generator: torch.Generator | None


class Family:
    """A module family: which modules it handles and how it turns calls into per-sample norms."""

    name = "family"

    def handles(self, module: nn.Module) -> bool:
        raise NotImplementedError

    def norms(self, module: nn.Module, calls: Sequence[Call], names: Sequence[str], ctx: NormContext,
              batch_size: int, with_batch_grads: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """([b] squared norms over the module's trainable ``names``, {name: batch gradient} when
        ``with_batch_grads`` — the sum over examples, for the coverage check — else {})."""
        raise NotImplementedError


def _own_forward(module: nn.Module, base: type) -> bool:
    """``module`` is a ``base`` whose forward is ``base.forward`` (so its algebra is known)."""
    return isinstance(module, base) and type(module).forward is base.forward


class LinearLike(Family):
    """Weight gradient Σ_t A_tᵀG_t: ``nn.Linear``, HF ``Conv1D`` and ``nn.Conv2d`` (groups = 1)."""

    name = "linear-like"

    def __init__(self) -> None:
        try:
            from transformers.pytorch_utils import Conv1D
        except ImportError:  # transformers is a dependency; the family simply does without it
            Conv1D = None
        self.conv1d = Conv1D

    def handles(self, module: nn.Module) -> bool:
        if _own_forward(module, nn.Linear):
            return True
        if self.conv1d is not None and _own_forward(module, self.conv1d):
            return True
        return (_own_forward(module, nn.Conv2d) and module.groups == 1 and module.padding_mode == "zeros"
                and not isinstance(module.padding, str))

    def _inputs_and_grads(self, module: nn.Module, call: Call) -> tuple[torch.Tensor, torch.Tensor]:
        """(A [b, T, d], G [b, T, p]) of one call."""
        x, g = call.args[0], call.grad
        if isinstance(module, nn.Conv2d):
            A = F.unfold(x, module.kernel_size, module.dilation, module.padding, module.stride)  # [b, d, L]
            return A.transpose(1, 2), g.flatten(2).transpose(1, 2)  # [b, L, d], [b, L, p]
        return x.reshape(x.shape[0], -1, x.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])

    def _weight_from(self, module: nn.Module, M: torch.Tensor) -> torch.Tensor:
        """The weight-shaped gradient from M = Σ AᵀG [d, p]."""
        if self.conv1d is not None and isinstance(module, self.conv1d):
            return M  # Conv1D stores W as [d, p]
        return M.t().reshape(module.weight.shape)  # Linear [p, d], Conv2d [p, C, kh, kw]

    def norms(self, module, calls, names, ctx, batch_size, with_batch_grads):
        pairs = [self._inputs_and_grads(module, c) for c in calls]
        A = torch.cat([a for a, _ in pairs], dim=1)  # [b, ΣT, d]
        G = torch.cat([g for _, g in pairs], dim=1)  # [b, ΣT, p]
        sq = torch.zeros(batch_size, device=G.device, dtype=torch.promote_types(G.dtype, torch.float32))
        batch: dict[str, torch.Tensor] = {}
        if "weight" in names:
            sq = sq + WEIGHT_NORMS[ctx.estimator](A, G, ctx.sketch_k, ctx.generator)
            if with_batch_grads:
                batch["weight"] = self._weight_from(module, torch.einsum("btd,btp->dp", A, G))
        if "bias" in names:
            per_sample = G.sum(dim=1)  # [b, p]
            sq = sq + per_sample.to(sq.dtype).pow(2).sum(dim=1)
            if with_batch_grads:
                batch["bias"] = per_sample.sum(dim=0)
        return sq, batch


class Embedding(Family):
    """``nn.Embedding``: the per-example gradient is G summed over each example's equal tokens."""

    name = "embedding"

    def handles(self, module: nn.Module) -> bool:
        return _own_forward(module, nn.Embedding) and not module.scale_grad_by_freq and not module.sparse

    def norms(self, module, calls, names, ctx, batch_size, with_batch_grads):
        ids = torch.cat([c.args[0].reshape(batch_size, -1) for c in calls], dim=1)  # [b, T]
        G = torch.cat([c.grad.reshape(batch_size, -1, module.embedding_dim) for c in calls], dim=1)  # [b, T, e]
        example = torch.arange(batch_size, device=ids.device)[:, None].expand_as(ids)  # [b, T]
        keep = ids != module.padding_idx if module.padding_idx is not None else torch.ones_like(ids, dtype=torch.bool)
        keys = (example * module.num_embeddings + ids)[keep]  # [n] one key per (example, token id)
        unique, slot = torch.unique(keys, return_inverse=True)
        dtype = torch.promote_types(G.dtype, torch.float32)
        rows = torch.zeros(len(unique), module.embedding_dim, device=G.device, dtype=dtype)
        rows.index_add_(0, slot, G[keep].to(dtype))  # [u, e] one row of one example's gradient each
        sq = torch.zeros(batch_size, device=G.device, dtype=dtype)
        sq.index_add_(0, unique // module.num_embeddings, rows.pow(2).sum(dim=1))
        batch = {}
        if with_batch_grads:
            batch["weight"] = torch.zeros_like(module.weight).index_add_(0, ids[keep], G[keep].to(module.weight.dtype))
        return sq, batch


class Leaf(Family):
    """Any other module without children: exact per-sample gradients of its own parameters by
    ``torch.func`` (vmap over examples of a vjp through the module alone)."""

    name = "leaf"

    def handles(self, module: nn.Module) -> bool:
        return next(module.children(), None) is None

    def norms(self, module, calls, names, ctx, batch_size, with_batch_grads):
        params = {n: getattr(module, n).detach() for n in names}
        total: dict[str, torch.Tensor] = {}
        for call in calls:
            if any(isinstance(v, torch.Tensor) for v in call.kwargs.values()):
                raise ValueError(f"{type(module).__name__} ({', '.join(names)}) is called with tensor keyword "
                                 "arguments; no per-sample rule")
            batched = [isinstance(a, torch.Tensor) and a.dim() > 0 and a.shape[0] == batch_size for a in call.args]

            def example_grads(g: torch.Tensor, *xs: object, _call: Call = call, _batched: list = batched) -> dict:
                args = tuple(x.unsqueeze(0) if b else x for x, b in zip(xs, _batched))
                _, pullback = vjp(lambda p: functional_call(module, p, args, _call.kwargs), params)
                return pullback(g.unsqueeze(0))[0]

            try:
                grads = vmap(example_grads, in_dims=(0, *[0 if b else None for b in batched]),
                             randomness="error")(call.grad, *call.args)  # {name: [b, *shape]}
            except Exception as exc:
                raise ValueError(f"no per-sample gradient for {type(module).__name__} ({', '.join(names)}): "
                                 f"{exc}") from exc
            for n, g in grads.items():
                total[n] = total[n] + g if n in total else g
        dtype = torch.promote_types(next(iter(total.values())).dtype, torch.float32)
        sq = sum(g.flatten(1).to(dtype).pow(2).sum(dim=1) for g in total.values())  # [b]
        batch = {n: g.sum(dim=0) for n, g in total.items()} if with_batch_grads else {}
        return sq, batch


#: Families in the order they are tried; the leaf fallback last.
FAMILIES: list[Family] = [LinearLike(), Embedding(), Leaf()]


@dataclass
class _Planned:
    """A module with trainable parameters of its own, the family that handles it, and its
    trainable parameter names (local) with their names in the model."""

    module: nn.Module
    family: Family
    names: list[str]
    qualified: list[str]
    calls: list[Call] = field(default_factory=list)


def plan_modules(model: nn.Module) -> list[_Planned]:
    """The modules that own trainable parameters and their families; raises ValueError listing
    every trainable parameter no family can give a per-sample norm."""
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
        family = next((f for f in FAMILIES if f.handles(module)), None)
        if family is None:
            problems.append(f"{qualified}: owned by {type(module).__name__}, which has sub-modules and no "
                            "per-sample rule (wrap the parameter in its own leaf module, or freeze it)")
            continue
        entry = planned.setdefault(id(module), _Planned(module, family, [], []))
        entry.names.append(local)
        entry.qualified.append(qualified)
    if problems:
        raise ValueError("no per-sample norm for these trainable parameters:\n  " + "\n  ".join(problems))
    return list(planned.values())


class HookNormEngine:
    """Per-sample norms and clipped sums through module hooks (see the module docstring).

    ``estimator`` ("ghost" exact, "hutchinson" or "hutchpp") is used for the weights of the
    linear-like layers; ``sketch_k`` is the number of probes k of the randomised estimators;
    ``generator`` draws the probes (fresh for every micro-batch and layer).
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, *, estimator: str = "ghost", sketch_k: int | None = None,
                 generator: torch.Generator | None = None) -> None:
        if estimator not in WEIGHT_NORMS:
            raise ValueError(f"estimator must be one of {', '.join(WEIGHT_NORMS)}; got {estimator!r}")
        if estimator != "ghost" and (isinstance(sketch_k, bool) or not isinstance(sketch_k, int) or sketch_k < 1):
            raise ValueError(f"sketch_k must be a whole number >= 1 for estimator {estimator!r}; got {sketch_k!r}")
        self.model = model
        self.loss_fn = loss_fn
        self.ctx = NormContext(estimator, sketch_k, generator)
        self.params = trainable_parameters(model)
        self.planned = plan_modules(model)
        self.checked = False

    @contextlib.contextmanager
    def _recording(self, batch_size: int) -> Iterator[list]:
        """Forward hooks on the planned modules for the duration of one forward pass; yields the
        tensor-hook handles to remove after the first backward."""
        tensor_hooks: list = []

        def broadcast(entry: _Planned, module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
            # An input shared by the batch (e.g. position ids [1, T]) is expanded to the batch, so
            # that the output's gradient stays per example; the result is the same broadcast.
            if batch_size > 1 and args and isinstance(args[0], torch.Tensor) and args[0].dim() > 0 \
                    and args[0].shape[0] == 1:
                return (args[0].expand(batch_size, *args[0].shape[1:]), *args[1:]), kwargs
            return None

        def record(entry: _Planned, module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            if not isinstance(output, torch.Tensor):
                raise ValueError(f"{', '.join(entry.qualified)}: {type(module).__name__} returns "
                                 f"{type(output).__name__}, not one tensor; no per-sample rule")
            if not output.requires_grad:
                return  # no gradient flows to its parameters through this call
            if not (args and isinstance(args[0], torch.Tensor) and args[0].shape[:1] == output.shape[:1]
                    == (batch_size,)):
                raise ValueError(f"{', '.join(entry.qualified)}: the hook engine needs the batch on dim 0 of "
                                 f"{type(module).__name__}'s first input and output")
            call = Call(tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args), dict(kwargs))
            entry.calls.append(call)
            tensor_hooks.append(output.register_hook(functools.partial(_keep_grad, call)))

        handles = [h for e in self.planned for h in (
            e.module.register_forward_pre_hook(functools.partial(broadcast, e), with_kwargs=True),
            e.module.register_forward_hook(functools.partial(record, e), with_kwargs=True))]
        try:
            yield tensor_hooks
        finally:
            for h in handles:
                h.remove()

    def clipped_sum(self, inputs: Inputs, targets: torch.Tensor,
                    factors: FactorFn) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(Σ_i c_i g_i per trainable parameter, per-sample norms n_i) with c = factors(n)."""
        for entry in self.planned:
            entry.calls = []
        with self._recording(batch_len(inputs)) as tensor_hooks:
            outputs = model_outputs(self.model, inputs)
        losses = self.loss_fn(outputs, targets)  # [b]
        names, params = list(self.params), list(self.params.values())
        try:
            batch = torch.autograd.grad(losses.sum(), params, retain_graph=True, allow_unused=True)
        finally:
            for h in tensor_hooks:
                h.remove()
        sq = self._sq_norms(len(losses), dict(zip(names, batch)))
        norms = sq.clamp_min(0).sqrt().to(losses.dtype)  # [b]
        c = factors(norms).detach()  # [b]
        clipped = torch.autograd.grad((c * losses).sum(), params, allow_unused=True)
        for entry in self.planned:
            entry.calls = []  # release the stored activations
        return {n: torch.zeros_like(p) if g is None else g for n, p, g in zip(names, params, clipped)}, norms

    def _sq_norms(self, batch_size: int, batch: Mapping[str, torch.Tensor | None]) -> torch.Tensor:
        """Σ over modules of the per-sample squared norms [b]; on the first batch, also the check
        that the hooks account for each parameter's whole gradient."""
        total = None
        missing = []
        for entry in self.planned:
            calls = [c for c in entry.calls if c.grad is not None]
            if not calls:
                continue  # not used on the way to the loss: zero gradient
            sq, recon = entry.family.norms(entry.module, calls, entry.names, self.ctx, batch_size,
                                           with_batch_grads=not self.checked)
            total = sq if total is None else total + sq.to(total.dtype)
            for local, qualified in zip(entry.names, entry.qualified):
                if not self.checked and not _close(recon.get(local), batch.get(qualified)):
                    missing.append(qualified)
        if not self.checked:
            unseen = [q for e in self.planned if not any(c.grad is not None for c in e.calls)
                      for q in e.qualified if batch.get(q) is not None and batch[q].abs().max() > 0]
            if missing or unseen:
                raise ValueError("these parameters get gradient the hooks do not see (used outside their "
                                 "module, e.g. by a functional call): " + ", ".join(missing + unseen))
            self.checked = True
        if total is None:
            device = next(iter(self.params.values())).device
            return torch.zeros(batch_size, device=device)
        return total


def _keep_grad(call: Call, grad: torch.Tensor) -> None:
    call.grad = grad.detach()


def _close(recon: torch.Tensor | None, reference: torch.Tensor | None) -> bool:
    """The hooks' batch gradient matches autograd's (None: no gradient)."""
    if reference is None:
        return recon is None or not bool(recon.abs().max() > 0)
    if recon is None:
        return not bool(reference.abs().max() > 0)
    ref = reference.to(torch.promote_types(reference.dtype, torch.float32))
    diff = (recon.to(ref.dtype).reshape(ref.shape) - ref).norm()
    return bool(diff <= COVERAGE_RTOL * torch.maximum(ref.norm(), recon.to(ref.dtype).norm()))


def hook_engine(estimator: str) -> Callable[..., HookNormEngine]:
    """A ``NORM_ENGINES`` entry: the hook engine with a fixed weight estimator."""
    return functools.partial(HookNormEngine, estimator=estimator)
