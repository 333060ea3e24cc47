"""DP training without Ray: engine, per-sample norms, models, data, one run (Ray Tune trainable: platform.trainable)."""
from .denoise import rmt_denoise
from .engine import DPEngine
from .norm_estimators import ghost_sq_norms, hutchinson_sq_norms, hutchpp_sq_norms
from .sampling import PoissonSampler

__all__ = ["DPEngine", "PoissonSampler", "ghost_sq_norms", "hutchinson_sq_norms", "hutchpp_sq_norms", "rmt_denoise"]
