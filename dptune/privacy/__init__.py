"""Privacy accounting for DP-SGD / DP-Adam (numpy, scipy and prv-accountant; no torch).

The public names are imported on first use (PEP 562): the light modules (``cache``, ``schedule``,
``validation``) load without scipy, so a planner that finds every σ in the cache never imports
the accountant.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["calibrate_noise", "epsilon_spent", "NORM_ESTIMATORS"]
_PUBLIC = {"calibrate_noise": ".calibration", "epsilon_spent": ".accountant"}


def __getattr__(name: str) -> Any:
    if name == "NORM_ESTIMATORS":
        from .validation import NORM_ESTIMATORS

        value: Any = NORM_ESTIMATORS
    elif name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
