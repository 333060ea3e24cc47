"""Normalisation layers: LayerNorm (torch's, timm's), GroupNorm, RMSNorm (torch's and the Llama
family's); FiLM's scale and shift are their affine parameters."""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from .base import Rule, loaded_class, materialised_rule, own_forward, wide


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
