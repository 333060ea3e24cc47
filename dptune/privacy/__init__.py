"""Privacy accounting for DP-SGD / DP-Adam (numpy, scipy and prv-accountant; no torch)."""
from . import randomized  # noqa: F401  (registers the "hutchinson"/"hutchpp" mechanisms)
from .accountant import epsilon_spent
from .calibration import calibrate_noise
from .validation import NORM_ESTIMATORS

__all__ = ["calibrate_noise", "epsilon_spent", "NORM_ESTIMATORS"]
