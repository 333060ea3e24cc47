"""Proxy runs for large batches: rank configurations at B/k for a k-th of the compute.

Sander, Stock & Sablayrolles, "TAN without a burn: scaling laws of DP-SGD" (ICML 2023): at a
fixed number of steps T, the noise on the averaged gradient is σC/B (ĝ's per-coordinate noise std
is σ/B), so dividing B and σ by k keeps it, and while the DP noise dominates the sampling noise of
the batch, a search over (C, η) at (B/k, σ/k, T) ranks configurations as one at (B, σ, T) does,
for a k-th of the per-sample gradients. A proxy run is not private at the cell's ε (σ/k spends far
more): it only ranks, and the cell's chosen configuration is then trained once at full scale, the
run that is the answer.

The equivalence breaks once σ/k is small: the per-example signal then matters as much as the noise,
and a smaller batch's sampling noise is no longer negligible (measured in BENCHMARKS.md, "Proxy runs";
:data:`MIN_PROXY_SIGMA`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..privacy.schedule import num_steps, sample_rate

#: Proxy runs whose σ' = σ·B'/B falls below this are refused. Measured (BENCHMARKS.md, "Proxy runs";
#: digits, the cnn, 12 (C, η), 3 seeds, ε = 1 and 8, B = 256 and 512, k up to 16): with σ' ≥ 0.52 the
#: proxies ranked the configurations as the full runs did in every setting (Spearman ρ ≥ 0.94, the
#: choice within 0.4 points at full scale); below it the ranking came apart at ε = 8, B = 512
#: (ρ = 0.85 at σ' = 0.32, 0.49 at 0.16, 0.01 at 0.08) and at σ' = 0.065 the choice lost 2.1 points.
MIN_PROXY_SIGMA = 0.5
#: ``batch_divisor: auto`` tries k = 2, 4, …, up to this, keeping B/k at or above MIN_AUTO_PROXY_BATCH:
#: the largest k and the smallest proxy batch measured in BENCHMARKS.md ("Proxy runs").
MAX_AUTO_DIVISOR = 16
MIN_AUTO_PROXY_BATCH = 16


@dataclass(frozen=True)
class ProxyRun:
    """The figures of a proxy run standing for (B, σ, T): B' = round(B/k), σ' = σ·B'/B (σ/B
    unchanged), the same T, and the epochs E' that make T steps at B' (q' = B'/N)."""

    batch_size: int
    noise_multiplier: float
    steps: int
    epochs: float
    sample_rate: float


def proxy_run(batch_size: int, noise_multiplier: float, steps: int, dataset_size: int, divisor: int) -> ProxyRun:
    """The proxy of a full-scale run at expected batch size ``batch_size`` with σ = ``noise_multiplier``
    for ``steps`` steps over ``dataset_size`` examples, at a ``divisor`` k-th of its batch."""
    small = max(1, round(batch_size / divisor))
    # (T − ½)·B'/N epochs are exactly T steps at B' (T = ⌈E·N/B⌉), whatever the rounding of the product
    epochs = (steps - 0.5) * small / dataset_size
    assert num_steps(epochs, dataset_size, small) == steps
    return ProxyRun(small, noise_multiplier * small / batch_size, steps, epochs, sample_rate(small, dataset_size))


def auto_divisor(batch_size: int, noise_multiplier: float) -> int:
    """``batch_divisor: auto``: the largest k = 2^j ≤ :data:`MAX_AUTO_DIVISOR` whose proxy keeps
    σ' = σ·round(B/k)/B ≥ :data:`MIN_PROXY_SIGMA` and B' = round(B/k) ≥ :data:`MIN_AUTO_PROXY_BATCH`
    (the region measured); 1 when even k = 2 would leave it (then that B runs at full scale). A large σ
    (small ε, large B) buys a large k."""
    k = 1
    while 2 * k <= MAX_AUTO_DIVISOR:
        small = round(batch_size / (2 * k))
        if small < MIN_AUTO_PROXY_BATCH or noise_multiplier * small / batch_size < MIN_PROXY_SIGMA:
            break
        k *= 2
    return k
