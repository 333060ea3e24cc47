"""Optimal clipping C* and per-class retention weights w_y(C).

C* is Theorem 5.2 of "On optimal hyperparameters for DP deep transfer learning" (ICLR 2026).

Pure numpy: per-sample gradients come in as a ``[n, d]`` array or tensor, norms and labels as
1-D arrays. Everything here is computed from private training examples and is **not**
differentially private: these are diagnostics that explain the clipping mechanism, not inputs to
DP training.

The MSE is exactly the paper's per-step mean squared error of the clipped sum (no mini-batch
sampling noise, Assumption 5.1)::

    MSE(C) = ‖Σ_i ḡ_i − Σ_i g_i‖² + σ²C²d,   ḡ_i = g_i·min(1, C/‖g_i‖).

Examples with ‖g_i‖ ≤ C are not clipped, so ḡ_i − g_i = 0 and they contribute *exactly nothing*
to the bias term (nothing is dropped or approximated). With the clipped set I = {i: ‖g_i‖ > C},
G = Σ_{i∈I} g_i and N = Σ_{i∈I} g_i/‖g_i‖, the bias is ‖C·N − G‖², so on every interval between
consecutive sorted norms (where I is fixed) MSE(C) = (NᵀN + σ²d)C² − 2NᵀG·C + GᵀG, a quadratic
with minimiser NᵀG/(NᵀN + σ²d). C* is the best of these minimisers clamped to their intervals
(the clamped ones are the interval ends, Theorem 5.2's "C* equals some ‖g_i‖" branch).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable

import numpy as np

from ..errors import UserError
from ..schema import CLIP_BOUND


#: Log-spaced gradient-norm histogram edges of the ``gradnorms`` table: 1e-4 … 1e4, 4 bins per
#: decade (the trainer's ``norm_stats.HIST_EDGES``; a test keeps the two equal).
HIST_EDGES = np.logspace(-4, 4, 33)

_CHUNK_ELEMENTS = 1 << 22  # rows × d processed at once in float64 (32 MiB)


def _as_array(values: object) -> np.ndarray:
    """A numpy view of a numpy array, a torch tensor (any device) or a sequence."""
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values)


@dataclass(frozen=True)
class ClipMSE:
    """MSE(C) = bias(C) + noise(C) of one batch of per-sample gradients, exact for every C ≥ 0.

    ``norms`` are the sorted non-zero per-sample norms s_1 ≤ … ≤ s_m; piece k (0 ≤ k ≤ m) is
    C ∈ [s_k, s_{k+1}] (s_0 = 0, s_{m+1} = ∞), where the examples of rank > k are clipped and
    ``nn[k]`` = NᵀN, ``ng[k]`` = NᵀG, ``gg[k]`` = GᵀG.
    """

    norms: np.ndarray        # [m]
    nn: np.ndarray           # [m + 1]
    ng: np.ndarray           # [m + 1]
    gg: np.ndarray           # [m + 1]
    noise_multiplier: float
    dim: int

    def _piece(self, clip_bound: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.norms, clip_bound, side="right")

    def bias(self, clip_bound: float | np.ndarray) -> np.ndarray:
        """‖Σ_i ḡ_i − Σ_i g_i‖² at each C (clipping bias of the sum)."""
        c = np.asarray(clip_bound, dtype=np.float64)
        k = self._piece(c)
        return np.maximum(self.nn[k] * c**2 - 2 * self.ng[k] * c + self.gg[k], 0.0)

    def noise(self, clip_bound: float | np.ndarray) -> np.ndarray:
        """σ²C²d at each C (variance of the Gaussian noise added to the sum)."""
        c = np.asarray(clip_bound, dtype=np.float64)
        return self.noise_multiplier**2 * self.dim * c**2

    def __call__(self, clip_bound: float | np.ndarray) -> np.ndarray:
        """MSE(C) at each C."""
        return self.bias(clip_bound) + self.noise(clip_bound)

    def argmin(self) -> float:
        """C*: the global minimiser over C ≥ 0 (the smallest one if several tie)."""
        lo = np.concatenate([[0.0], self.norms])              # [m + 1] piece starts
        hi = np.concatenate([self.norms, [np.inf]])           # [m + 1] piece ends
        a = self.nn + self.noise_multiplier**2 * self.dim
        with np.errstate(divide="ignore", invalid="ignore"):
            vertex = np.where(a > 0, self.ng / a, lo)
        candidates = np.clip(vertex, lo, hi)
        candidates = np.where(np.isfinite(candidates), candidates, lo)
        values = a * candidates**2 - 2 * self.ng * candidates + self.gg
        tol = 1e-12 * max(abs(values.min()), self.gg[0], np.finfo(float).tiny)  # rounding, not a real gap
        best = np.flatnonzero(values <= values.min() + tol)
        return float(candidates[best].min())


def per_sample_norms(per_sample_grads: object) -> np.ndarray:
    """‖g_i‖ of every row of a ``[n, d]`` array or tensor, in float64 (chunked: no full copy)."""
    grads = _as_array(per_sample_grads)
    rows = max(1, _CHUNK_ELEMENTS // max(grads.shape[1], 1))
    return np.concatenate([np.linalg.norm(grads[i:i + rows].astype(np.float64), axis=1)
                           for i in range(0, grads.shape[0], rows)] or [np.zeros(0)])


def clip_mse(per_sample_grads: object, noise_multiplier: float) -> ClipMSE:
    """The exact MSE(C) curve of a batch of per-sample gradients ``[n, d]`` at noise multiplier σ.

    σ is the noise multiplier of the sum (noise std σC per coordinate), the trial's σ when the
    batch is one expected batch of B examples. Not differentially private (a diagnostic).
    """
    grads = _as_array(per_sample_grads)
    if grads.ndim != 2 or grads.shape[0] == 0:
        raise UserError(f"per_sample_grads must have shape [n, d] with n >= 1; got {grads.shape}")
    sigma = float(noise_multiplier)
    if not (math.isfinite(sigma) and sigma >= 0):
        raise UserError(f"noise_multiplier must be finite and >= 0; got {noise_multiplier!r}")
    d = grads.shape[1]
    rows = max(1, _CHUNK_ELEMENTS // max(d, 1))
    norms = per_sample_norms(grads)
    if not np.all(np.isfinite(norms)):
        raise UserError("per_sample_grads contains NaN or infinite values")
    order = np.argsort(norms, kind="stable")
    order = order[norms[order] > 0]  # a zero gradient is never clipped: it adds nothing to the bias
    m = len(order)
    nn, ng, gg = np.zeros(m + 1), np.zeros(m + 1), np.zeros(m + 1)
    big_n, big_g = np.zeros(d), np.zeros(d)
    # Walk from the largest norm down: after adding rank j, the sums are those of piece j − 1.
    for end in range(m, 0, -rows):
        idx = order[max(0, end - rows):end][::-1]                       # descending norms
        g = grads[idx].astype(np.float64)                               # [r, d]
        cum_g = big_g + np.cumsum(g, axis=0)                            # [r, d]
        cum_n = big_n + np.cumsum(g / norms[idx, None], axis=0)         # [r, d]
        pieces = np.arange(end - 1, end - 1 - len(idx), -1)
        nn[pieces] = np.einsum("rd,rd->r", cum_n, cum_n)
        ng[pieces] = np.einsum("rd,rd->r", cum_n, cum_g)
        gg[pieces] = np.einsum("rd,rd->r", cum_g, cum_g)
        big_n, big_g = cum_n[-1], cum_g[-1]
    return ClipMSE(norms=norms[order], nn=nn, ng=ng, gg=gg, noise_multiplier=sigma, dim=d)


def optimal_clip(per_sample_grads: object, noise_multiplier: float) -> float:
    """C* of Theorem 5.2: the clipping bound minimising MSE(C) for these per-sample gradients.

    ``per_sample_grads`` is a ``[n, d]`` array or tensor (one flattened gradient per example).
    Exact (no grid): the global minimiser over the piecewise-quadratic MSE, interval ends
    included. Not differentially private: it uses the true gradients.

    >>> optimal_clip(np.array([[3.0, 0.0], [0.0, 4.0]]), 0.0)
    4.0
    """
    return clip_mse(per_sample_grads, noise_multiplier).argmin()


def clip_summary(per_sample_grads: object, labels: object, noise_multiplier: float,
                 clip_bound: float | None = None) -> dict:
    """C* and what it means for one batch: MSE and its parts at C* (and at ``clip_bound``, e.g. the
    trial's C), the share clipped and the per-class retention at both. Not differentially private."""
    curve = clip_mse(per_sample_grads, noise_multiplier)
    norms = per_sample_norms(per_sample_grads)
    c_star = curve.argmin()
    at = {"optimal": c_star} | ({"given": float(clip_bound)} if clip_bound else {})
    summary = {"n": len(norms), "dim": curve.dim, "noise_multiplier": curve.noise_multiplier, "c_star": c_star,
               "norm_quantiles": dict(zip((0.1, 0.5, 0.9), np.quantile(norms, (0.1, 0.5, 0.9)).tolist()))}
    for name, c in at.items():
        summary[name] = {CLIP_BOUND: c, "mse": float(curve(c)), "bias": float(curve.bias(c)),
                         "noise": float(curve.noise(c)), "clipped_fraction": float(np.mean(norms > c)),
                         "retention": class_retention(norms, labels, c) if c > 0 else {}}
    return summary


def class_retention(norms: object, labels: object, clip_bound: float) -> dict[Hashable, float]:
    """w_y(C) = (1/n_y) Σ_{i: y_i = y} min(1, C/‖g_i‖) for every label y present.

    The share of each class's gradient signal that survives clipping at C (1: untouched).
    Zero norms count as fully retained. Not differentially private.

    >>> class_retention([0.5, 2.0, 4.0], [0, 0, 1], 1.0)
    {0: 0.75, 1: 0.25}
    """
    n = _as_array(norms).astype(np.float64).ravel()
    y = _as_array(labels).ravel()
    if n.shape != y.shape:
        raise UserError(f"norms and labels must have the same length; got {n.shape[0]} and {y.shape[0]}")
    if not clip_bound > 0:
        raise UserError(f"clip_bound must be > 0; got {clip_bound!r}")
    with np.errstate(divide="ignore"):
        kept = np.where(n > clip_bound, clip_bound / n, 1.0)
    return {_plain(label): float(kept[y == label].mean()) for label in np.unique(y)}


def _plain(label: object) -> Hashable:
    """numpy scalars as Python ones (dict keys that print and compare naturally)."""
    return label.item() if isinstance(label, np.generic) else label


def histogram_retention(counts: object, clip_bound: float | np.ndarray,
                        edges: np.ndarray = HIST_EDGES) -> np.ndarray:
    """w(C) from a norm histogram on log bins, norms taken log-uniform within each bin.

    Exact under that assumption: for a bin [l, h] with L = ln(h/l), E[min(1, C/x)] is 1 if
    C ≥ h, C(1/l − 1/h)/L if C ≤ l, else (ln(C/l) + 1 − C/h)/L. Used on the ``gradnorms`` table,
    which keeps histograms rather than every norm.
    """
    counts = np.asarray(counts, dtype=np.float64)
    c = np.atleast_1d(np.asarray(clip_bound, dtype=np.float64))[:, None]   # [k, 1]
    lo, hi = edges[:-1][None, :], edges[1:][None, :]                      # [1, bins]
    width = np.log(hi / lo)
    below = c * (1 / lo - 1 / hi) / width
    inside = (np.log(np.clip(c, lo, hi) / lo) + 1 - np.clip(c, lo, hi) / hi) / width
    per_bin = np.where(c >= hi, 1.0, np.where(c <= lo, below, inside))   # [k, bins]
    total = counts.sum()
    out = per_bin @ counts / total if total > 0 else np.full(len(c), np.nan)
    return out if np.ndim(clip_bound) else out[0]


def histogram_quantiles(counts: object, quantiles: object, edges: np.ndarray = HIST_EDGES) -> np.ndarray:
    """Quantiles of a norm histogram on log bins (log-linear interpolation within a bin)."""
    counts = np.asarray(counts, dtype=np.float64)
    q = np.clip(np.asarray(quantiles, dtype=np.float64), 0.0, 1.0)
    total = counts.sum()
    if total <= 0:
        return np.full(q.shape, np.nan)
    cum = np.cumsum(counts)
    target = np.maximum(q * total, np.finfo(float).tiny)             # q = 0: the first non-empty bin
    b = np.minimum(np.searchsorted(cum, target, side="left"), len(counts) - 1)  # bins with counts > 0
    frac = (target - (cum[b] - counts[b])) / counts[b]
    log_edges = np.log(edges)
    return np.exp(log_edges[b] + frac * (log_edges[b + 1] - log_edges[b]))
