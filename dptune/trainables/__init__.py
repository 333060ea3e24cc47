"""DP training without Ray, in folders by job: the DP step (``engine/``), the models (``models/``), the
data (``data/``), one training run (``training.py``, the one training loop) and the privacy audit
(``audit/``). The Ray Tune trainable that runs a trial is ``platform.sweep.dp_trial``.

The public names below are imported on first use (PEP 562), so importing a light submodule
(``dptune.trainables.config``, ``.registries``) does not pull in torch.
"""
from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {"DPEngine": ".engine.dp_engine", "PoissonSampler": ".engine.sampling",
           "ghost_sq_norms": ".engine.norm_estimators", "hutchinson_sq_norms": ".engine.norm_estimators",
           "hutchpp_sq_norms": ".engine.norm_estimators", "rmt_denoise": ".engine.denoise"}

__all__ = ["DPEngine", "PoissonSampler", "ghost_sq_norms", "hutchinson_sq_norms", "hutchpp_sq_norms", "rmt_denoise"]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
