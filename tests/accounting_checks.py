"""An independent check of a calibrated σ: the accountant's ε, not the calibrator's cache."""
from __future__ import annotations

from dptune.privacy import epsilon_spent
from dptune.privacy.calibration import REL_TOL


def assert_calibrated(sigma: float, epsilon: float, delta: float, sample_rate: float, steps: int, **estimator) -> None:
    """σ meets ε (the accountant's ε of σ is at most the target) and is tight: a σ smaller by twice
    the calibration's tolerance spends more than the target."""
    assert epsilon_spent(sigma, delta, sample_rate, steps, **estimator) <= epsilon
    assert epsilon_spent(sigma / (1 + 2 * REL_TOL), delta, sample_rate, steps, **estimator) > epsilon
