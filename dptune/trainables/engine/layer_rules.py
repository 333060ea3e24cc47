"""Per-layer rules of the book-keeping engine: from one module's recorded inputs and output
gradients, the per-sample squared norms of its own trainable parameters and the clipped sum
Σ_i c_i g_i — with no per-sample gradient materialised where a cheaper exact form exists.

For a linear layer with per-sample inputs A_i ∈ ℝ^{T×d} and output gradients G_i ∈ ℝ^{T×p} the
per-sample weight gradient is M_i = A_iᵀG_i, so (Bu et al. 2023, "Differentially private
optimization on large model at small cost", book-keeping with mixed ghost norms):

- ‖M_i‖² = ⟨A_iA_iᵀ, G_iG_iᵀ⟩ (ghost, ~bT²(d+p) work, bT² memory) or ‖A_iᵀG_i‖² from M_i itself
  (materialised, ~bTdp work, bdp memory) — the cheaper one per layer, from the shapes; for T = 1
  simply ‖a_i‖²‖g_i‖²;
- Σ_i c_i M_i = Aᵀ·diag(c)·G over all examples and positions at once (one matrix product), or
  Σ_i c_i M_i from the materialised M_i.

Closed forms (``CLOSED_FORMS``, tried in order): linear-like (``nn.Linear`` on 2-D or 3-D inputs,
HF ``Conv1D``, ``nn.Conv2d`` with groups = 1 through unfold, LoRA's factors are such Linears),
``nn.Embedding``, normalisation layers (LayerNorm, GroupNorm, RMSNorm; FiLM's scale and shift are
their affine parameters) and broadcast parameters; every other module goes to
``composite_rule.Composite`` (exact per-sample gradients of that module as one unit by
``torch.func``). Randomised weight-norm estimators (Hutchinson, Hutch++) plug into the linear-like
rule.
"""
from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import UserError
from .norm_estimators import RANDOMISED_WEIGHT_NORMS, gram_sq_norms
from .precision import Precision

#: Per-sample weight gradients are materialised only while they take at most this many bytes per
#: layer and micro-batch; above it the ghost form is used (memory O(bT²) instead of O(bdp)).
MATERIALISE_MAX_BYTES = 1 << 30
#: What writing and reading back one entry of a materialised per-sample gradient costs, in
#: multiply-adds (memory-bound; fitted on wrn16_4's convolutions, 1 CPU thread: 25–45).
MATERIALISE_ENTRY_COST = 32


def prefer_ghost(batch: int, T: int, d: int, p: int, itemsize: int) -> bool:
    """Ghost norms ⟨A_iA_iᵀ, G_iG_iᵀ⟩ (~bT²(d+p) work) rather than materialised M_i = A_iᵀG_i
    (~b·dp entries to write and read; the bTdp product both forms pay for the clipped sum), or
    when the materialised M_i would not fit ``MATERIALISE_MAX_BYTES``."""
    return T * T * (d + p) < MATERIALISE_ENTRY_COST * d * p or batch * d * p * itemsize > MATERIALISE_MAX_BYTES


@dataclass
class Call:
    """One forward call of a recorded module: its (detached) inputs and, after the backward, the
    gradient of Σ_i ℓ_i with respect to each output tensor its rule reads (``Rule.outputs``; for a
    broadcast parameter, its per-example expansion). ``grads[j]`` stays None while (or if never)
    output j gets gradient; ``shapes`` are the outputs' shapes, for the zeros of one that got none."""

    args: tuple
    kwargs: dict
    grads: list = field(default_factory=list)
    shapes: list = field(default_factory=list)
    out_bytes: int = 0

    @property
    def grad(self) -> torch.Tensor | None:
        """The output gradient of a single-output call (the closed forms)."""
        return self.grads[0]

    @property
    def received(self) -> bool:
        """Some output of this call got gradient."""
        return any(g is not None for g in self.grads)

    def clear(self) -> None:
        """Drop the output gradients (the inputs stay)."""
        self.grads = [None] * len(self.grads)


@dataclass
class NormContext:
    """What a rule needs besides the module: the weight estimator and its randomness.

    Without a ``step_seed`` the estimators draw their probes from ``generator`` on every call. With
    one (set per logical batch by ``BookKeepingEngine.start_step``), each layer's probes come from
    a generator seeded by (step seed, the layer's index in ``layers``): the same probes for every
    micro-batch of the step and on every worker of a multi-worker trial, so the result depends on
    neither the micro-batch size nor the number of workers.

    ``precision``: the run's mixed precision; a rule that replays a module's forward (the composite
    and replay rules) replays it under the same autocast as the training forward."""

    estimator: str
    sketch_k: int | None
    generator: torch.Generator | None
    step_seed: int | None = None
    layers: dict = field(default_factory=dict)  # id(module) -> index, fixed when the engine is built
    precision: Precision = field(default_factory=Precision)

    def probes(self, module: nn.Module) -> torch.Generator | None:
        """The generator of ``module``'s probes for the current step (see the class docstring)."""
        if self.step_seed is None:
            return self.generator
        device = self.generator.device if self.generator is not None else "cpu"
        seed = (self.step_seed * 1_000_003 + self.layers[id(module)]) % (1 << 63)
        return torch.Generator(device=device).manual_seed(seed)


@dataclass
class LayerGrads:
    """One module's per-sample view: squared norms ``sq`` [b] over its trainable parameters, and
    ``clipped(c)`` → {local name: Σ_i c_i g_i shaped like the parameter}. ``form`` says how the
    norms were computed and ``kept_bytes`` what the rule held in memory to do it."""

    sq: torch.Tensor
    clipped: Callable[[torch.Tensor], dict[str, torch.Tensor]]
    form: str
    kept_bytes: int


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """At least float32 (per-sample norms in half precision lose the small examples)."""
    return torch.promote_types(t.dtype, torch.float32)


def wide(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """``tensors`` in one dtype of at least float32 (the widest of theirs): per-example norms,
    clipping factors and clipped sums are never formed in half precision, whatever the model's
    dtype or autocast, so that no example's contribution exceeds C by a half-precision rounding
    (a no-op for float32 tensors)."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return [t.to(dtype) for t in tensors]


def scaled_sum(c: torch.Tensor, per_sample: torch.Tensor) -> torch.Tensor:
    """Σ_i c_i g_i from per-sample gradients [b, *shape], in at least float32."""
    c, per_sample = wide(c, per_sample)
    return torch.einsum("b,b...->...", c, per_sample)


def scaled_rows(c: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """c_i · row i of ``rows`` [b, ...], in at least float32."""
    c, rows = wide(c, rows)
    return rows * c.reshape(-1, *(1,) * (rows.dim() - 1))


def unfold_patches(x: torch.Tensor, conv: nn.Module) -> torch.Tensor:
    """``F.unfold`` of a convolution's input [b, C, H, W] → [b, C·kh·kw, L], as one strided view and
    one copy: on CUDA ``F.unfold`` launches one kernel per example (thousands per step for a
    WideResNet's per-sample norms); the same values, also faster on a CPU."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = conv.kernel_size, conv.dilation, conv.padding, conv.stride
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    patches = x.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)[..., ::dh, ::dw]
    b, C, oh, ow = patches.shape[:4]   # [b, C, oh, ow, kh, kw]
    return patches.permute(0, 1, 4, 5, 2, 3).reshape(b, C * kh * kw, oh * ow)


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def own_forward(module: nn.Module, *bases: type) -> bool:
    """``module`` is one of ``bases`` and runs one of their forwards (so its algebra is known)."""
    return any(isinstance(module, b) and type(module).forward is b.forward for b in bases)


def materialised_rule(per_sample: dict[str, torch.Tensor], form: str, kept: int) -> LayerGrads:
    """A LayerGrads from per-sample gradients {name: [b, *shape]}."""
    first = next(iter(per_sample.values()))
    dtype = compute_dtype(first)
    sq = sum(torch.linalg.vector_norm(g.flatten(1), dim=1, dtype=dtype).square() for g in per_sample.values())  # [b]

    def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: scaled_sum(c, g) for n, g in per_sample.items()}

    return LayerGrads(sq, clipped, form, kept + tensor_bytes(*per_sample.values()))


class Rule(ABC):
    """A module family: which modules it handles and how it turns their calls into LayerGrads.

    A closed-form rule reads one output tensor with the batch on dim 0 of it and of the first
    input (``check_call``); a first input shared by the batch (leading size 1) is expanded to the
    batch before the call (``expands_shared_input``)."""

    name = "rule"
    expands_shared_input = True

    @abstractmethod
    def handles(self, module: nn.Module) -> bool:
        """Whether this rule knows the algebra of ``module``."""

    @abstractmethod
    def per_sample(self, module: nn.Module, calls: Sequence[Call], names: Sequence[str], ctx: NormContext,
                   batch_size: int) -> LayerGrads:
        """Per-sample squared norms and the clipped-sum function of ``module``'s trainable ``names``."""

    def outputs(self, module: nn.Module, output: object, where: str) -> list[torch.Tensor]:
        """The output tensors whose gradients this rule reads (``where`` names the module in errors)."""
        if not isinstance(output, torch.Tensor):
            raise UserError(f"{where}: {type(module).__name__} returns {type(output).__name__}, not one tensor; "
                             f"the {self.name} rule needs one")
        return [output]

    def check_call(self, module: nn.Module, args: tuple, kwargs: dict, outputs: list[torch.Tensor],
                   batch_size: int, where: str) -> None:
        """Refuse a call whose first input and output do not carry the batch on dim 0."""
        if not (args and isinstance(args[0], torch.Tensor) and args[0].shape[:1] == outputs[0].shape[:1]
                == (batch_size,)):
            raise UserError(f"{where}: the engine needs the batch on dim 0 of {type(module).__name__}'s first "
                             "input and output")


class LinearLike(Rule):
    """Weight gradient Σ_t A_tᵀG_t: ``nn.Linear``, HF ``Conv1D`` and ``nn.Conv2d`` (groups = 1)."""

    name = "linear"

    @property
    def conv1d(self) -> type | None:
        """HF's ``Conv1D``, once transformers defined it (a model holding one has imported it)."""
        return loaded_class("transformers.pytorch_utils", "Conv1D")

    def handles(self, module: nn.Module) -> bool:
        if own_forward(module, *linear_types()):
            return True
        if self.conv1d is not None and own_forward(module, self.conv1d):
            return True
        return (own_forward(module, nn.Conv2d) and module.groups == 1 and module.padding_mode == "zeros"
                and not isinstance(module.padding, str))

    def _inputs_and_grads(self, module: nn.Module, call: Call) -> tuple[torch.Tensor, torch.Tensor]:
        """(A [b, T, d], G [b, T, p]) of one call."""
        x, g = call.args[0], call.grad
        if isinstance(module, nn.Conv2d):
            A = unfold_patches(x, module)  # [b, d, L]
            return A.transpose(1, 2), g.flatten(2).transpose(1, 2)  # [b, L, d], [b, L, p]
        return x.reshape(x.shape[0], -1, x.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])

    def _weight_from(self, module: nn.Module, M: torch.Tensor) -> torch.Tensor:
        """The weight-shaped gradient from M = Σ AᵀG [d, p]."""
        if self.conv1d is not None and isinstance(module, self.conv1d):
            return M  # Conv1D stores W as [d, p]
        return M.t().reshape(module.weight.shape)  # Linear [p, d], Conv2d [p, C, kh, kw]

    def per_sample(self, module, calls, names, ctx, batch_size):
        pairs = [self._inputs_and_grads(module, c) for c in calls]
        A = pairs[0][0] if len(pairs) == 1 else torch.cat([a for a, _ in pairs], dim=1)  # [b, T, d]
        G = pairs[0][1] if len(pairs) == 1 else torch.cat([g for _, g in pairs], dim=1)  # [b, T, p]
        weight, bias, sq = weight_and_bias(A, G, names, ctx, module)

        def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
            out = {}
            if weight is not None:
                out["weight"] = self._weight_from(module, weight.clipped(c))
            if bias is not None:
                out["bias"] = scaled_sum(c, bias)
            return out

        return LayerGrads(sq, clipped, weight.form if weight is not None else "bias only",
                          tensor_bytes(A, G, bias) + (weight.kept_bytes if weight is not None else 0))


@dataclass
class WeightGrads:
    """One weight applied as a ↦ Wa at positions t, from inputs A [b, T, d] and output gradients
    G [b, T, p]: per-sample squared norms ``sq`` [b] of M_i = Σ_t a_t g_tᵀ (exact: ghost or
    materialised, chosen from the shapes; or a randomised estimate), and ``clipped(c)`` = Σ_i c_i M_i
    [d, p]."""

    A: torch.Tensor
    G: torch.Tensor
    sq: torch.Tensor
    form: str
    M: torch.Tensor | None = None   # materialised per-sample gradients [b, d, p]

    @property
    def kept_bytes(self) -> int:
        return tensor_bytes(self.M)

    def clipped(self, c: torch.Tensor) -> torch.Tensor:
        if self.M is not None:
            return scaled_sum(c, self.M)
        c, A, G = wide(c, self.A, self.G)
        d, p = A.shape[2], G.shape[2]
        if d <= p:  # scale the narrower side by c, then one product over all (i, t)
            return (A * c[:, None, None]).reshape(-1, d).t() @ G.reshape(-1, p)
        return A.reshape(-1, d).t() @ (G * c[:, None, None]).reshape(-1, p)


def weight_and_bias(A: torch.Tensor, G: torch.Tensor, names: Sequence[str], ctx: NormContext,
                    module: nn.Module) -> tuple["WeightGrads | None", torch.Tensor | None, torch.Tensor]:
    """A linear-like layer's per-sample view from A [b, T, d] and G [b, T, p]: its weight's
    (``linear_weight_grads``, if "weight" is in ``names``), its bias's per-sample gradients [b, p]
    (if "bias" is), and their squared norms summed [b]."""
    weight = linear_weight_grads(A, G, ctx, module) if "weight" in names else None
    bias = G.sum(dim=1) if "bias" in names else None  # [b, p] per-sample bias gradients
    sq = torch.zeros(A.shape[0], device=G.device, dtype=compute_dtype(G))
    if weight is not None:
        sq = sq + weight.sq
    if bias is not None:
        sq = sq + bias.to(sq.dtype).pow(2).sum(dim=1)
    return weight, bias, sq


def linear_weight_grads(A: torch.Tensor, G: torch.Tensor, ctx: NormContext, module: nn.Module,
                        probes: torch.Generator | None = None) -> WeightGrads:
    """The per-sample view of a weight of ``module`` from A [b, T, d] and G [b, T, p]
    (``WeightGrads``), with the estimator of ``ctx``; its probes come from ``probes`` when given (a
    module with several weights draws them all from one generator), else ``ctx.probes(module)``."""
    if ctx.estimator != "exact":
        generator = probes if probes is not None else ctx.probes(module)
        return WeightGrads(A, G, RANDOMISED_WEIGHT_NORMS[ctx.estimator](A, G, ctx.sketch_k, generator), ctx.estimator)
    return exact_weight_grads(A, G)


def exact_weight_grads(A: torch.Tensor, G: torch.Tensor) -> WeightGrads:
    """``linear_weight_grads`` with exact norms: ghost or materialised, the cheaper from the shapes."""
    b, T, d = A.shape
    p = G.shape[2]
    dtype = compute_dtype(G)
    if T == 1:
        return WeightGrads(A, G, A.to(dtype).pow(2).sum(dim=(1, 2)) * G.to(dtype).pow(2).sum(dim=(1, 2)),
                           "ghost (T = 1)")
    if prefer_ghost(b, T, d, p, A.element_size()):
        return WeightGrads(A, G, gram_sq_norms(A, G), "ghost")
    M = torch.bmm(*wide(A.transpose(1, 2), G))  # [b, d, p]
    return WeightGrads(A, G, torch.linalg.vector_norm(M.flatten(1), dim=1, dtype=dtype).square(), "materialised", M)


class Conv2d(Rule):
    """``nn.Conv2d`` with zero padding, in one of two exact forms chosen by ``prefer_ghost``:

    - materialised: the per-sample weight gradients from one convolution backward with the batch
      folded into the groups (the work of the batch weight gradient, no unfold), then norms and
      Σ_i c_i g_i from them — for many positions and few channels;
    - ghost (groups = 1): norms ⟨A_iᵀA_i, G_iᵀG_i⟩ from the unfolded input A_i [d, L] and G_i [p, L],
      and Σ_i c_i g_i as the native batch weight gradient of (c_i G_i) — for few positions and
      wide channels.

    Randomised weight estimators go to the linear-like rule's unfolded form."""

    name = "conv2d"

    def __init__(self, fallback: LinearLike) -> None:
        self.fallback = fallback

    def handles(self, module: nn.Module) -> bool:
        return (own_forward(module, nn.Conv2d) and module.padding_mode == "zeros"
                and not isinstance(module.padding, str))

    def _weight_grad(self, module: nn.Module, x: torch.Tensor, g: torch.Tensor, groups: int,
                     weight_shape: tuple[int, ...]) -> torch.Tensor:
        """The convolution's weight gradient for input x and output gradient g (no input gradient),
        in at least float32."""
        x, g = wide(x, g)
        shape_only = g.new_empty(weight_shape)  # only its shape is read
        return torch.ops.aten.convolution_backward(
            g, x, shape_only, None, module.stride, module.padding, module.dilation, False, (0, 0), groups,
            (False, True, False))[1]

    def _per_sample_weight(self, module: nn.Module, call: Call) -> torch.Tensor:
        """[b, *weight.shape] per-sample weight gradients of one call: the batch folded into groups."""
        x, g, w = call.args[0], call.grad, module.weight  # [b, C, H, W], [b, p, H', W']
        b = x.shape[0]
        folded = self._weight_grad(module, x.reshape(1, -1, *x.shape[2:]), g.reshape(1, -1, *g.shape[2:]),
                                   b * module.groups, (b * w.shape[0], *w.shape[1:]))  # [b·p, C/groups, kh, kw]
        return folded.reshape(b, *w.shape)

    def _ghost_sq_norms(self, module: nn.Module, calls: Sequence[Call]) -> torch.Tensor:
        """‖Σ_calls A_iᵀG_i‖² as ⟨AᵀA, GᵀG⟩ over the positions of all calls [b]."""
        A = torch.cat([unfold_patches(c.args[0], module)
                       for c in calls], dim=2)  # [b, d, L]
        G = torch.cat([c.grad.flatten(2) for c in calls], dim=2)  # [b, p, L]
        dtype = compute_dtype(G)
        A, G = A.to(dtype), G.to(dtype)
        return (torch.bmm(A.transpose(1, 2), A) * torch.bmm(G.transpose(1, 2), G)).sum(dim=(1, 2))

    def per_sample(self, module, calls, names, ctx, batch_size):
        w = module.weight
        if ctx.estimator != "exact" and "weight" in names and self.fallback.handles(module):
            return self.fallback.per_sample(module, calls, names, ctx, batch_size)
        positions = sum(c.grad[0, 0].numel() for c in calls)  # L over all calls
        ghost = "weight" in names and module.groups == 1 and prefer_ghost(
            batch_size, positions, w[0].numel(), w.shape[0], w.element_size())
        bias = sum(c.grad.sum(dim=(2, 3)) for c in calls) if "bias" in names else None  # [b, p]
        if not ghost:
            per_sample = {"bias": bias} if bias is not None else {}
            if "weight" in names:
                per_sample["weight"] = sum(self._per_sample_weight(module, c) for c in calls)
            return materialised_rule(per_sample, "materialised (grouped conv)", 0)
        sq = self._ghost_sq_norms(module, calls)
        if bias is not None:
            sq = sq + bias.to(sq.dtype).pow(2).sum(dim=1)

        def clipped(c: torch.Tensor) -> dict[str, torch.Tensor]:
            out = {"weight": sum(self._weight_grad(module, call.args[0], scaled_rows(c, call.grad),
                                                   module.groups, tuple(w.shape)) for call in calls)}
            if bias is not None:
                out["bias"] = scaled_sum(c, bias)
            return out

        return LayerGrads(sq, clipped, "ghost (unfolded grams, native weight gradient)",
                          tensor_bytes(bias) + sum(tensor_bytes(c.grad) for c in calls))


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


def loaded_class(module: str, name: str) -> type | None:
    """A library's class if its module is loaded, else None. A model holding an instance has loaded
    it, so a rule can recognise library layers without importing timm or transformers (seconds of a
    trial worker's start) for models that use neither."""
    return getattr(sys.modules.get(module), name, None)


def linear_types() -> tuple[type, ...]:
    """nn.Linear and library subclasses with its algebra (timm's Linear, when loaded: F.linear outside
    TorchScript)."""
    timm_linear = loaded_class("timm.layers.linear", "Linear")
    return (nn.Linear,) if timm_linear is None else (nn.Linear, timm_linear)


def layer_norm_types() -> tuple[type, ...]:
    """nn.LayerNorm and library subclasses with the same algebra (timm's LayerNorm, when loaded)."""
    timm_layer_norm = loaded_class("timm.layers.norm", "LayerNorm")
    return (nn.LayerNorm,) if timm_layer_norm is None else (nn.LayerNorm, timm_layer_norm)


#: transformers' RMSNorm classes whose forward is LlamaRMSNorm's, y = w ⊙ (x / rms(x) in float32, cast
#: back to x's dtype) (a test compares their sources); Gemma's (1 + w) and OLMo-2's order differ.
LLAMA_RMS_NORMS = {f"transformers.models.{family}.modeling_{family}": f"{cls}RMSNorm" for family, cls in (
    ("llama", "Llama"), ("mistral", "Mistral"), ("mixtral", "Mixtral"), ("qwen2", "Qwen2"),
    ("qwen2_moe", "Qwen2Moe"), ("qwen3", "Qwen3"), ("phi3", "Phi3"), ("granite", "Granite"),
    ("smollm3", "SmolLM3"))}


def llama_rms_norm(module: nn.Module) -> bool:
    """``module`` is one of ``LLAMA_RMS_NORMS`` running its class's forward (not a hub kernel's)."""
    kind = type(module)
    return (LLAMA_RMS_NORMS.get(kind.__module__) == kind.__name__ and "forward" not in vars(module)
            and loaded_class(kind.__module__, kind.__name__) is kind)


class Normalisation(Rule):
    """LayerNorm, GroupNorm, RMSNorm (torch's and the Llama family's): y = x̂ ⊙ w + b with x̂ the
    normalised input, so the per-sample gradients are Σ_positions x̂ ⊙ G (weight) and Σ_positions G
    (bias) — closed forms, one pass."""

    name = "normalisation"

    def handles(self, module: nn.Module) -> bool:
        return own_forward(module, *layer_norm_types(), nn.GroupNorm, nn.RMSNorm) or llama_rms_norm(module)

    def _normalised(self, module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
        """(x̂, the dims summed for a per-sample gradient) of one call."""
        if llama_rms_norm(module):
            xf = x.to(torch.float32)  # the same operations as the forward, so the same rounding
            xhat = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)).to(x.dtype)
            return xhat, tuple(range(x.dim() - 1))
        if isinstance(module, nn.GroupNorm):
            xhat = F.group_norm(x, module.num_groups, None, None, module.eps)  # [b, C, *spatial]
            return xhat, (0, *range(2, x.dim()))
        shape = tuple(module.normalized_shape)
        if isinstance(module, nn.RMSNorm):
            xhat = F.rms_norm(x, shape, None, module.eps)
        else:
            xhat = F.layer_norm(x, shape, None, None, module.eps)
        return xhat, tuple(range(x.dim() - len(shape)))

    def per_sample(self, module, calls, names, ctx, batch_size):
        grads: dict[str, torch.Tensor] = {}
        for call in calls:
            x = call.args[0]
            with ctx.precision.autocast(x.device):   # x̂ as the training forward computed it
                xhat, dims = self._normalised(module, x)
            xhat, G = wide(xhat, call.grad)
            keep_batch = tuple(dim for dim in dims if dim != 0)  # sum over positions, not examples
            parts = {"weight": (xhat * G).sum(dim=keep_batch) if keep_batch else xhat * G,
                     "bias": G.sum(dim=keep_batch) if keep_batch else G}
            for n in names:
                grads[n] = grads[n] + parts[n] if n in grads else parts[n]
        return materialised_rule(grads, "closed form", 0)


class Broadcast(Rule):
    """A parameter of leading size 1 that the model broadcasts over the batch (timm ViT's class,
    register and distillation tokens and position embedding; torchvision ViT's class token and
    position embedding): the engine hands the model its per-example expansion, whose gradient is
    the per-sample gradient itself."""

    name = "broadcast"
    #: (module path prefix, class name) → the parameter names whose use is a per-example broadcast.
    KNOWN = {("timm.", "VisionTransformer"): ("cls_token", "reg_token", "dist_token", "pos_embed"),
             ("torchvision.models.vision_transformer", "VisionTransformer"): ("class_token",),
             ("torchvision.models.vision_transformer", "Encoder"): ("pos_embedding",)}

    def parameter_names(self, module: nn.Module) -> tuple[str, ...]:
        kind = type(module)
        return next((names for (prefix, cls), names in self.KNOWN.items()
                     if kind.__name__ == cls and kind.__module__.startswith(prefix)), ())

    def handles(self, module: nn.Module) -> bool:
        return bool(self.parameter_names(module))

    def per_sample(self, module, calls, names, ctx, batch_size):
        grads = {}
        for call in calls:  # one call per parameter: args = (its name,)
            grads[call.args[0]] = call.grad.unsqueeze(1)  # [b, 1, *shape[1:]]
        return materialised_rule({n: grads[n] for n in names if n in grads}, "per-example expansion", 0)


#: The closed forms, in the order they are tried (``composite_rule.COMPOSITE`` covers every other module).
_LINEAR = LinearLike()
CLOSED_FORMS: list[Rule] = [Conv2d(_LINEAR), _LINEAR, Embedding(), Normalisation()]
BROADCAST = Broadcast()
