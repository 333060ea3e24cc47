"""Privacy accounting for DP-SGD / DP-Adam (numpy, scipy and prv-accountant; no torch).

The public names are imported on first use (PEP 562): the light modules (``cache``, ``schedule``,
``validation``) load without scipy, so a planner that finds every σ in the cache never imports
the accountant.
"""
from __future__ import annotations

from ..lazy_names import lazy_names

__all__ = ["calibrate_noise", "epsilon_spent", "NORM_ESTIMATORS"]
__getattr__ = lazy_names(__name__, {"calibrate_noise": ".calibration", "epsilon_spent": ".accountant",
                                    "NORM_ESTIMATORS": ".validation"})


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
