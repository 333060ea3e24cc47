"""Exact per-sample gradients with ``torch.func`` (vmap over grad of the whole model), and the model
checks every engine needs.

``VmapNormEngine`` is the reference the book-keeping engine is tested against (``DPEngine(...,
norm_estimator=VmapNormEngine(model, loss_fn))``): for one physical micro-batch it returns the per-sample norms over all
trainable parameters and the clipped sum Σ_i c_i g_i, materialising every per-sample gradient.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from ...errors import UserError
from .batching import Inputs, model_outputs

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
FactorFn = Callable[[torch.Tensor], torch.Tensor]

#: Modules whose training-mode forward mixes examples, so no per-sample gradient exists.
SAMPLE_MIXING = (nn.modules.batchnorm._BatchNorm,)


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters DP training updates (``requires_grad``), by name."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def check_model(model: nn.Module) -> None:
    """Refuse models whose per-sample gradients are undefined; list every offending module."""
    problems = [f"{name} ({type(m).__name__}): mixes examples in a batch, breaking per-sample privacy; "
                "replace it with GroupNorm or LayerNorm"
                for name, m in model.named_modules() if isinstance(m, SAMPLE_MIXING)]
    if not trainable_parameters(model):
        problems.append("the model has no trainable parameters")
    if problems:
        raise UserError("model not supported by DP training:\n  " + "\n  ".join(problems))


class VmapNormEngine:
    """Per-sample gradients of the trainable parameters by ``vmap(grad(·))``."""

    def __init__(self, model: nn.Module, loss_fn: LossFn, **_: object) -> None:
        self.model = model
        self.loss_fn = loss_fn

        def example_loss(params: dict, frozen: dict, x: Inputs, y: torch.Tensor) -> torch.Tensor:
            xb = {k: v.unsqueeze(0) for k, v in x.items()} if isinstance(x, Mapping) else x.unsqueeze(0)
            tensors = {**frozen, **params}
            out = model_outputs(lambda *a, **k: functional_call(model, tensors, a, k), xb)
            return loss_fn(out, y.unsqueeze(0)).sum()

        self._per_sample = vmap(grad(example_loss), in_dims=(None, None, 0, 0), randomness="different")

    def per_sample_grads(self, inputs: Inputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """{name: [b, *param.shape]} for every trainable parameter."""
        params = {n: p.detach() for n, p in trainable_parameters(self.model).items()}
        frozen = {n: p.detach() for n, p in self.model.named_parameters() if not p.requires_grad}
        frozen.update(dict(self.model.named_buffers()))
        return self._per_sample(params, frozen, inputs, targets)

    def clipped_sum(self, inputs: Inputs, targets: torch.Tensor,
                    factors: FactorFn) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(Σ_i c_i g_i per parameter, per-sample norms n_i) with c = factors(n)."""
        grads = self.per_sample_grads(inputs, targets)
        sq = sum(g.flatten(1).pow(2).sum(1) for g in grads.values())  # [b]
        norms = sq.sqrt()
        c = factors(norms)  # [b]
        return {n: torch.einsum("b,b...->...", c, g) for n, g in grads.items()}, norms
