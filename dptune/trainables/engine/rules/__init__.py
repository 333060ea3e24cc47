"""The book-keeping engine's layer rules, one small module per layer family (as Opacus lays out
``grad_sample/``): from one module's recorded inputs and output gradients, the per-sample squared
norms of its own trainable parameters and the clipped sum Σ_i c_i g_i — with no per-sample gradient
materialised where a cheaper exact form exists.

- :mod:`.base`: what every rule shares (:class:`~.base.Call`, :class:`~.base.LayerGrads`, :class:`~.base.Rule`);
- closed forms, registered in :data:`LAYER_RULES` in the order they are tried: :mod:`.conv`
  (``nn.Conv2d``), :mod:`.linear` (``nn.Linear``, HF ``Conv1D``, LoRA's factors; randomised
  weight-norm estimators plug in here), :mod:`.embedding`, :mod:`.normalisation` (LayerNorm,
  GroupNorm, RMSNorm; FiLM's scale and shift); and :mod:`.broadcast` (a ViT's tokens and position
  embedding, per-example expansions);
- :mod:`.replay` (attention and recurrent layers replayed map by map), :mod:`.tied` (an embedding
  tied to an output layer), :mod:`.composite` (any other module as one unit, by ``torch.func``);
- :mod:`.packed`: the same families for the layers of a pack (``packed_layers``), K members at once.
"""
from __future__ import annotations

from ....registry import Registry
from .base import Rule
from .conv import Conv2d
from .embedding import Embedding
from .linear import LinearLike
from .normalisation import Normalisation

_LINEAR = LinearLike()
#: The closed forms by layer family, in the order they are tried (a grouped convolution is the
#: convolution rule's; ``composite.COMPOSITE`` covers every module none of them handles).
LAYER_RULES: Registry[Rule] = Registry("layer rule")
for _rule in (Conv2d(_LINEAR), _LINEAR, Embedding(), Normalisation()):
    LAYER_RULES.register(_rule.name, _rule)
CLOSED_FORMS: list[Rule] = [rule for _, rule in LAYER_RULES.items()]
