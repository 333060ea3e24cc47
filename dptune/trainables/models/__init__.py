"""The models: the catalog (:mod:`.catalog`, ``create_model``), models trained from scratch, pretrained
image (timm) and text (transformers) backbones, what DP fine-tuning trains of them (``peft``), and
the shared frozen computation of a head-only run."""
from ...lazy_names import lazy_names

__all__ = ["create_model"]
#: ``create_model`` (a public name of ``dptune.trainables``), imported on first use: a light submodule of this package loads
#: without the catalog's torch and model/data libraries
__getattr__ = lazy_names(__name__, {"create_model": ".catalog"})
