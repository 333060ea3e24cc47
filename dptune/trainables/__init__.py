"""DP training: the engine, per-sample norms, models, data and (later) the Ray Tune trainable."""
from .engine import DPEngine
from .sampling import PoissonSampler

__all__ = ["DPEngine", "PoissonSampler"]
