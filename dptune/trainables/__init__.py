"""DP training without Ray, in folders by job: the DP step (``engine/``), the models (``models/``), the
data (``data/``), one training run (``training.py``, the one training loop) and the privacy audit
(``audit/``). The Ray Tune trainable that runs a trial is ``platform.sweep.dp_trial``.

The public names below are imported on first use (PEP 562), so importing a light submodule
(``dptune.trainables.config``, ``.registries``) does not pull in torch.
"""
from __future__ import annotations

from ..lazy_names import lazy_names

_PUBLIC = {"DPEngine": ".engine.dp_engine", "PoissonSampler": ".engine.sampling",
           "ghost_sq_norms": ".engine.norm_estimators", "hutchinson_sq_norms": ".engine.norm_estimators",
           "hutchpp_sq_norms": ".engine.norm_estimators", "rmt_denoise": ".engine.denoise",
           "create_model": ".models.catalog", "load_dataset": ".data.catalog"}

__all__ = ["DPEngine", "PoissonSampler", "create_model", "ghost_sq_norms", "hutchinson_sq_norms", "hutchpp_sq_norms",
           "load_dataset", "rmt_denoise"]

__getattr__ = lazy_names(__name__, _PUBLIC)


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
