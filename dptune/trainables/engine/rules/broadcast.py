"""Broadcast parameters: a ViT's class, register and distillation tokens and position embedding, used
once per example; the engine hands the model their per-example expansion."""
from __future__ import annotations


from torch import nn

from .base import Rule, materialised_rule


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


BROADCAST = Broadcast()
