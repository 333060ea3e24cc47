"""What every layer rule of the book-keeping engine shares: a recorded call (:class:`Call`), the
norm context, a rule's result (:class:`LayerGrads`: per-sample squared norms and the clipped-sum
function), the :class:`Rule` interface, and the small helpers the families use (float32-or-wider
compute dtype, scaled sums, a materialised rule)."""
from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ....errors import UserError
from ..precision import Precision


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


def inside(name: str, unit: str) -> bool:
    """Module ``name`` is ``unit`` or one of its sub-modules (``""``: the whole model)."""
    return unit == "" or name == unit or name.startswith(unit + ".")


def outermost(units: Iterable[str]) -> list[str]:
    """The module names of ``units`` that lie inside no other of them (the units a rule takes whole)."""
    units = list(units)
    return [u for u in units if not any(v != u and inside(u, v) for v in units)]


def unit_of(name: str, units: Iterable[str]) -> str | None:
    """The unit of ``units`` that module ``name`` lies inside, or None."""
    return next((u for u in units if inside(name, u)), None)


def loaded_class(module: str, name: str) -> type | None:
    """A library's class if its module is loaded, else None. A model holding an instance has loaded
    it, so a rule can recognise library layers without importing timm or transformers (seconds of a
    trial worker's start) for models that use neither."""
    return getattr(sys.modules.get(module), name, None)

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
