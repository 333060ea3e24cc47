"""Accounting for randomized clipping (DP-SGD-RC; docs/architecture.md, "Randomized clipping").

From "Efficient DP-SGD for LLMs with randomized clipping" (ICML 2026).

Clipping with an estimated norm n̂ bounds one example's contribution by C·Z, Z = ‖g‖/√n̂. For
Hutchinson with k probes, n̂/‖g‖² = Σ_j λ_j X_j, X_j ~ χ²(k)/k i.i.d., λ in the simplex (summed
over layers, exact parts included), and over all spectra Z is stochastically dominated by

    Z_env = max(1, X^{-1/2}),   X ~ χ²(k)/k

(Hutch++ has the same worst case: all mass in the tail it sketches). Given Z the step is a
Poisson-subsampled Gaussian with noise multiplier σ/Z, so the per-step privacy random variable is
the mixture over Z_env of those, Z revealed to the adversary (which only helps it).

Made finite and fast, always erring towards a larger ε:

* Z: the continuous part of Z_env is cut into cells whose mass goes to the cell's *upper* end
  (the pair at a smaller z is a post-processing of the pair at a larger one), and the far tail
  P(Z > z_max) = TAIL_FRACTION·δ/T per step is charged to δ as a probability of infinite loss.
  Cells are placed where they matter (density ∝ √(f_Z·h′) for the χ²-divergence proxy
  h(z) = e^{z²/σ²}) and refined until rounding up inflates E[h(Z) − 1] by at most ATOM_TOL:
  ~100–300 atoms, a few tenths of a percent of ε (see BENCHMARKS.md).
* The mixture's CDF: instead of every atom on every point of the accountant's mesh, each atom's
  Gaussian branches are evaluated on a coarse node grid in the Gaussian's own coordinate and
  bounded below in between (``GaussianMixturePRV``), tabulated once per PRV, with the truncated
  mean computed exactly from the table (``truncated_mean``, used by ``prv.discretise``).
* The domain: the RDP bound merges neighbouring atoms (rounded up), and the δ-charged tail keeps
  catastrophic atoms (σ/z ≪ 1) out of it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from ..errors import UserError
from .prv import log_expm1_plus

#: Share of δ spent on the far tail of Z_env: P(Z_env > z_max) = TAIL_FRACTION·δ/T per step.
TAIL_FRACTION = 1e-3
#: Largest relative increase of E[e^{Z²/σ²} − 1] allowed from rounding Z up to the atoms.
ATOM_TOL = 2e-3
#: Cells placed by the proxy at most (beyond, the tolerance is not reached: only looser, still valid).
MAX_CELLS = 256
#: Beyond the Z_env quantile of this tail mass, cells are placed by ratio only (the proxy would
#: spend its cells on mass far below any δ/T of interest).
PROXY_TAIL = 1e-9
#: No cell may round Z up by more than this factor (the proxy alone under-weights the far tail).
MAX_RATIO = 1.1
#: Atom CDFs are taken as saturated (0 or 1) beyond this many standard deviations; the moved
#: upper-tail mass, at most Φ(−SATURATION) per step, is charged to δ.
SATURATION = 9.0
SATURATED_MASS = 2 * float(special.ndtr(-SATURATION))
#: Node spacing of the CDF bounds, in standard deviations of the narrowest Gaussian branch.
NODE_SPACING = 0.01
#: The RDP bound merges atoms within this factor of z (rounded up).
RDP_GROUP_RATIO = 1.05
#: Atoms per group sharing one u-window in the CDF bounds (a cost knob only).
GROUP_SIZE = 8
#: Gauss–Legendre nodes per cell for the proxy's exact expectation, and for the mean.
_GL_X, _GL_W = np.polynomial.legendre.leggauss(12)
_GL4_X, _GL4_W = np.polynomial.legendre.leggauss(4)


def _half_erfc(x: np.ndarray) -> np.ndarray:
    """Φ(−x) = ½·erfc(x/√2): accurate in the far tail and about twice as fast as ``ndtr``."""
    return 0.5 * special.erfc(x * _SQRT_HALF)


_SQRT_HALF = math.sqrt(0.5)
_SQRT_2PI = math.sqrt(2 * math.pi)


def envelope_sf(z: np.ndarray, sketch_k: int) -> np.ndarray:
    """P(Z_env > z) for Z_env = max(1, X^{-1/2}), X ~ χ²(k)/k.

    >>> float(envelope_sf(np.array(1.0), 32)) == float(stats.chi2.cdf(32, 32))
    True
    """
    z = np.asarray(z, dtype=float)
    with np.errstate(divide="ignore"):
        inside = stats.chi2.cdf(sketch_k / np.maximum(z, 1.0) ** 2, sketch_k)
    return np.where(z < 1.0, 1.0, inside)


def envelope_tail_end(sketch_k: int, tail_mass: float) -> float:
    """z_max with P(Z_env > z_max) = tail_mass."""
    return float((stats.chi2.ppf(tail_mass, sketch_k) / sketch_k) ** -0.5)


def _log_expm1(x: np.ndarray) -> np.ndarray:
    """log(e^x − 1) for x > 0, without overflow."""
    return x + np.log(-np.expm1(-x))


def _log_proxy_excess(z_hi: np.ndarray, z_lo: np.ndarray, sigma: float, k: int,
                      atoms: np.ndarray) -> tuple[float, float]:
    """(log E[h(Z) − 1] over the cells, log Σ_j w_j (h(z_j) − 1)) with h(z) = e^{z²/σ²}."""
    mid, half = (z_hi + z_lo) / 2, (z_hi - z_lo) / 2
    nodes = mid[:, None] + half[:, None] * _GL_X  # [m, n]
    log_fz = stats.chi2.logpdf(k / nodes**2, k) + math.log(2 * k) - 3 * np.log(nodes)  # density of Z
    log_true = special.logsumexp(_log_expm1(nodes**2 / sigma**2) + log_fz + np.log(half[:, None] * _GL_W))
    weights = stats.chi2.cdf(k / z_lo**2, k) - stats.chi2.cdf(k / z_hi**2, k)
    log_up = special.logsumexp(_log_expm1(atoms**2 / sigma**2), b=weights)
    return float(log_true), float(log_up)


@dataclass(frozen=True)
class EnvelopeAtoms:
    """A discrete Z that stochastically dominates Z_env up to ``tail_mass`` (charged to δ)."""

    z: np.ndarray         # [m] atoms, z[0] = 1 (the mass P(X ≥ 1))
    weights: np.ndarray   # [m] probabilities, sum = 1 − tail_mass
    tail_mass: float


def _cap_ratio(edges: np.ndarray, max_ratio: float) -> np.ndarray:
    """Split cells geometrically so that no cell's right end exceeds max_ratio × its left end."""
    pieces = [np.geomspace(a, b, int(math.ceil(math.log(b / a) / math.log(max_ratio))) + 1)[:-1]
              for a, b in zip(edges[:-1], edges[1:])]
    return np.concatenate([*pieces, edges[-1:]])


def envelope_atoms(noise_multiplier: float, sketch_k: int, *, tail_mass: float, tol: float = ATOM_TOL,
                   max_ratio: float = MAX_RATIO) -> EnvelopeAtoms:
    """Atoms for Z_env, each cell's mass rounded *up* to the cell's right end (conservative).

    Below the PROXY_TAIL quantile, cells are placed with density ∝ √(f_Z·h′) and refined until
    rounding up inflates E[h(Z) − 1], h(z) = e^{z²/σ²} (the χ²-divergence of the mixture, which
    drives ε), by at most ``tol`` relative, or MAX_CELLS is reached; beyond it (mass < PROXY_TAIL)
    cells only respect ``max_ratio``. Any placement is valid: it only sets the tightness.

    >>> a = envelope_atoms(4.0, 32, tail_mass=1e-12)
    >>> bool(a.z[0] == 1.0 and np.all(np.diff(a.z) > 0) and abs(a.weights.sum() + a.tail_mass - 1) < 1e-12)
    True
    """
    sigma, k = noise_multiplier, sketch_k
    z_max = envelope_tail_end(k, tail_mass)
    z_mid = min(envelope_tail_end(k, PROXY_TAIL), z_max)
    grid = np.geomspace(1.0, z_mid, 4097)  # placement grid
    with np.errstate(divide="ignore"):
        log_fz = stats.chi2.logpdf(k / grid**2, k) + math.log(2 * k) - 3 * np.log(grid)
    log_density = 0.5 * (log_fz + np.log(2 * grid / sigma**2) + grid**2 / sigma**2)  # √(f_Z h′)
    density = np.exp(log_density - np.max(log_density[np.isfinite(log_density)]))
    cumulative = np.concatenate([[0.0], np.cumsum((density[1:] + density[:-1]) / 2 * np.diff(grid))])
    at_one = math.log(stats.chi2.sf(k, k)) + _log_expm1(1 / sigma**2)  # the atom z = 1 is exact
    cells = 8
    while True:
        edges = np.interp(np.linspace(0, cumulative[-1], cells + 1), cumulative, grid)
        edges[0], edges[-1] = 1.0, z_mid
        edges = _cap_ratio(np.unique(edges), max_ratio)
        log_true, log_up = _log_proxy_excess(edges[1:], edges[:-1], sigma, k, edges[1:])
        if np.logaddexp(log_up, at_one) - np.logaddexp(log_true, at_one) <= math.log1p(tol) or cells >= MAX_CELLS:
            break
        cells = min(int(cells * 1.5), MAX_CELLS)
    if z_max > z_mid:
        edges = np.concatenate([edges[:-1], _cap_ratio(np.array([z_mid, z_max]), max_ratio)])
    weights = np.diff(-stats.chi2.cdf(k / edges**2, k))  # P(edge_{j-1} < Z ≤ edge_j)
    z = np.concatenate([[1.0], edges[1:]])
    w = np.concatenate([[stats.chi2.sf(k, k)], weights])
    return EnvelopeAtoms(z, w, float(stats.chi2.cdf(k / z_max**2, k)))


@dataclass(frozen=True)
class _Table:
    """The CDF and sf bounds, linear in u on each cell [n·Δu, (n+1)·Δu] of the window."""

    first: int               # n of the first cell
    lines: np.ndarray        # [4, cells]: CDF value at the left node, CDF slope, sf value, sf slope
    cdf_below: float         # CDF below the window (u → −∞), every branch saturated
    cdf_above: float         # CDF above the window


@dataclass(frozen=True)
class GaussianMixturePRV:
    """Privacy loss of one step whose sensitivity is a random Z (revealed), Z on ``atoms``:
    the mixture over Z of Poisson-subsampled Gaussians with noise multiplier σ/Z.

    ``direction`` as for ``SubsampledGaussianPRV``. ``cdf``/``sf`` are conditioned on a finite
    loss and describe a distribution that is stochastically *larger* than that mixture. With u(t)
    the monotone map from the loss to the Gaussian draw, the CDF in t of one atom is a sum of
    branches Φ(x(u)), x affine in u, each convex-then-concave in the direction of increasing loss.
    Each branch is evaluated exactly on the nodes u = n·Δu only and bounded below in between by the
    line from the earlier node (in t) with slope min(tangent there, chord), which lies below a
    convex-then-concave function on the whole cell; where a node is outside the branch's
    ±SATURATION window the slope is 0. Δu is NODE_SPACING standard deviations of the narrowest
    branch, so the cost is set by the atoms, not by the accountant's much finer mesh. ``pm_inf``
    = the atoms' tail mass plus 2Φ(−SATURATION), which covers the saturated upper tails.
    """

    sample_rate: float
    noise_multiplier: float
    atoms: EnvelopeAtoms
    direction: str = "remove"

    @property
    def pm_inf(self) -> float:
        return self.atoms.tail_mass + SATURATED_MASS

    @property
    def _du(self) -> float:
        return NODE_SPACING / self.noise_multiplier  # the narrowest branch has s = σ/z_0 = σ

    def _branches(self) -> list[tuple[float, float, np.ndarray]]:
        """(weight κ, sign, offset γ[m]): the CDF in t of atom j is Σ κ·Φ(sign·s_j·u + γ_j)."""
        s = self.noise_multiplier / self.atoms.z  # [m]
        q = self.sample_rate
        if self.direction == "add":  # L ≤ t ⇔ the draw x ≥ x*: Φ(−s·u − 1/(2s))
            return [(1.0, -1.0, -0.5 / s)]
        branches = [(q, 1.0, -0.5 / s)]  # the example was sampled: x ~ N(1, s²)
        return branches if q == 1.0 else [(1.0 - q, 1.0, 0.5 / s), *branches]

    def _scaled_threshold(self, t: np.ndarray) -> np.ndarray:
        """u(t) = log((e^{±t} − 1 + q)/q), increasing in t for remove, decreasing for add; −∞
        outside the support (every branch is saturated there)."""
        q = self.sample_rate
        u = log_expm1_plus(t if self.direction == "remove" else -t, q) - math.log(q)
        return np.where(np.isnan(u), -np.inf, u)

    def _loss(self, u: np.ndarray) -> np.ndarray:
        """t(u), the inverse of ``_scaled_threshold``."""
        q = self.sample_rate
        t = np.logaddexp(math.log1p(-q) if q < 1 else -np.inf, math.log(q) + u)  # log(1 − q + q·e^u)
        return t if self.direction == "remove" else -t

    def _loss_slope(self, u: np.ndarray) -> np.ndarray:
        """|dt/du|."""
        q = self.sample_rate
        return special.expit(u + math.log(q) - math.log1p(-q)) if q < 1 else np.ones_like(u)

    @functools.cached_property
    def _table(self) -> _Table:
        """The bounds on every cell that meets some branch's window, summed over atoms and branches."""
        du, w = self._du, self.atoms.weights
        s = self.noise_multiplier / self.atoms.z  # [m]
        branches = self._branches()
        ends = [np.sort([(-SATURATION - g) / (sign * s), (SATURATION - g) / (sign * s)], axis=0)
                for _, sign, g in branches]  # [2, m] u-window of each atom, per branch
        first = math.floor(min(e[0].min() for e in ends) / du) - 1
        last = math.floor(max(e[1].max() for e in ends) / du) + 1
        cells = np.arange(first, last + 1, dtype=float)
        lines = np.zeros((4, len(cells)))
        cdf_below = sum((kappa for kappa, sign, _ in branches if sign < 0), 0.0)
        for (kappa, sign, offset), (lo, hi) in zip(branches, ends):
            # Atoms in groups of similar width: cells outside a group's window get its saturated value.
            for group in np.array_split(np.arange(len(w)), max(1, len(w) // GROUP_SIZE)):
                a = math.floor(lo[group].min() / du) - 1 - first
                b = math.floor(hi[group].max() / du) + 2 - first  # the group's cells: [a, b)
                mass = kappa * w[group].sum()
                cdf_low = float(sign < 0)  # the group's branch CDF below its window
                lines[0, :a] += mass * cdf_low
                lines[2, :a] += mass * (1.0 - cdf_low)
                lines[0, b:] += mass * (1.0 - cdf_low)
                lines[2, b:] += mass * cdf_low
                lines[:, a:b] += kappa * np.einsum("g,kgc->kc", w[group],
                                                   self._branch_lines(cells[a:b], s[group], offset[group], sign))
        return _Table(first, lines / w.sum(), cdf_below, 1.0 - cdf_below)

    def _branch_lines(self, cells: np.ndarray, s: np.ndarray, offset: np.ndarray, sign: float) -> np.ndarray:
        """[4, g, c]: per atom and consecutive cell, the CDF and sf lines of the branch Φ(sign·s·u + γ)."""
        du = self._du
        nodes = (cells[0] + np.arange(len(cells) + 1)) * du  # [c+1] consecutive cells share nodes
        x = sign * s[:, None] * nodes[None, :] + offset[:, None]  # [g, c+1] Gaussian argument
        inside = np.abs(x) <= SATURATION
        tail = _half_erfc(np.minimum(np.abs(x), SATURATION))  # Φ(−|x|), accurate where small
        cdf = np.where(inside, np.where(x > 0, 1.0 - tail, tail), x > 0)  # Φ(x), saturated outside
        sf = np.where(inside, np.where(x > 0, tail, 1.0 - tail), x < 0)  # Φ(−x)
        both = inside[:, :-1] & inside[:, 1:]  # [g, c]
        positive = (x[:, :-1] > 0) & (x[:, 1:] > 0)
        chord = np.where(positive, np.abs(sf[:, 1:] - sf[:, :-1]), np.abs(cdf[:, 1:] - cdf[:, :-1])) / du
        if self.direction == "remove":  # the loss increases with u: the earlier node is the left one
            x_a, cdf_a, sf_a, back = x[:, :-1], cdf[:, :-1], sf[:, :-1], 0.0
        else:
            x_a, cdf_a, sf_a, back = x[:, 1:], cdf[:, 1:], sf[:, 1:], du
        tangent = s[:, None] / _SQRT_2PI * np.exp(-0.5 * np.minimum(x_a * x_a, 2 * SATURATION**2))
        rise = np.where(both, np.minimum(tangent, chord), 0.0)  # ≥ 0: growth of the CDF along t
        direction = 1.0 if self.direction == "remove" else -1.0  # du/dt sign
        return np.stack([cdf_a + rise * back, direction * rise, sf_a - rise * back, -direction * rise])

    def _evaluate(self, t: np.ndarray, upper: bool) -> np.ndarray:
        """The CDF (``upper=False``) or survival function of the bound at any ``t``."""
        t = np.asarray(t, dtype=float)
        u = self._scaled_threshold(t.ravel())  # [n]
        table = self._table
        below = 1.0 - table.cdf_below if upper else table.cdf_below
        above = 1.0 - table.cdf_above if upper else table.cdf_above
        cell = np.floor(np.where(np.isfinite(u), u, -1.0) / self._du) - table.first
        index = np.clip(cell, 0, table.lines.shape[1] - 1).astype(int)
        value, slope = table.lines[2 * upper, index], table.lines[2 * upper + 1, index]
        out = value + slope * (u - (index + table.first) * self._du)
        out = np.where(~np.isfinite(u) | (cell < 0), below, np.where(cell >= table.lines.shape[1], above, out))
        return np.clip(out, 0.0, 1.0).reshape(t.shape)

    def _integral(self, t_a: float, t_b: float, upper: bool) -> float:
        """∫ of the CDF (or sf) bound over [t_a, t_b]: cell by cell in u, where the bound is linear
        and t(u) smooth, Gauss–Legendre nodes are exact to rounding; constant outside the table."""
        if not t_b > t_a:
            return 0.0
        u_lo, u_hi = np.sort(self._scaled_threshold(np.array([t_a, t_b])))
        table, du = self._table, self._du
        start, stop = table.first * du, (table.first + table.lines.shape[1]) * du  # the table's u-range
        total = 0.0
        for a, b in ((u_lo, min(u_hi, start)), (max(u_lo, stop), u_hi)):  # constant stretches
            if b > a:
                t_ends = self._loss(np.array([a, b]))
                total += float(self._evaluate(np.array(np.mean(t_ends)), upper)) * abs(t_ends[1] - t_ends[0])
        a, b = max(u_lo, start), min(u_hi, stop)
        if b > a:
            first = math.floor(a / du) - table.first
            cells = np.arange(first, math.floor(b / du) - table.first + 1)
            cells = cells[cells < table.lines.shape[1]]  # [c] table indices
            lo = np.maximum((cells + table.first) * du, a)
            hi = np.minimum((cells + table.first + 1) * du, b)
            nodes = (lo + hi)[:, None] / 2 + (hi - lo)[:, None] / 2 * _GL4_X  # [c, 4]
            value = table.lines[2 * upper, cells][:, None] + table.lines[2 * upper + 1, cells][:, None] * (
                nodes - ((cells + table.first) * du)[:, None])
            total += float(np.sum(value * self._loss_slope(nodes) * ((hi - lo) / 2)[:, None] * _GL4_W))
        return total

    def truncated_mean(self, t_min: float, t_max: float) -> float:
        """E[L | t_min ≤ L ≤ t_max] of this distribution, by parts — the CDF below 0, the sf above —
        with exact cell-wise integrals (adaptive quadrature would stumble over the many kinks)."""
        cdf_min, sf_max = float(self.cdf(np.array(t_min))), float(self.sf(np.array(t_max)))
        lo = -t_min * cdf_min - self._integral(t_min, min(0.0, t_max), upper=False)
        hi = -t_max * sf_max + self._integral(max(0.0, t_min), t_max, upper=True)
        return (lo + hi) / (1.0 - cdf_min - sf_max)

    def cdf(self, t: np.ndarray) -> np.ndarray:
        return self._evaluate(t, upper=False)

    def sf(self, t: np.ndarray) -> np.ndarray:
        return self._evaluate(t, upper=True)

    def rdp(self, orders: np.ndarray) -> np.ndarray:
        """An upper bound on the RDP of the Z-revealed mixture, (α−1)⁻¹ log E_Z[e^{(α−1)·RDP_α(σ/Z)}]:
        atoms are merged into groups spanning a factor ≤ RDP_GROUP_RATIO in z, each rounded up
        to its largest z (it sizes the domain and backs the RDP fallback; any upper bound is valid)."""
        orders = np.asarray(orders, dtype=float)
        z, w = self.atoms.z, self.atoms.weights / self.atoms.weights.sum()
        group = np.floor(np.log(z) / math.log(RDP_GROUP_RATIO)).astype(int)  # [m] non-decreasing
        last = np.flatnonzero(np.diff(group, append=group[-1] + 1))  # last atom of each group
        weights = np.add.reduceat(w, np.concatenate([[0], last[:-1] + 1]))
        per_group = subsampled_gaussian_rdp_atoms(self.sample_rate, self.noise_multiplier / z[last], orders)
        top = per_group.max(axis=0)
        return top + np.log(weights @ np.exp((orders - 1) * (per_group - top))) / (orders - 1)


def subsampled_gaussian_rdp_atoms(sample_rate: float, noise_multipliers: np.ndarray,
                                  orders: np.ndarray) -> np.ndarray:
    """RDP of the Poisson-subsampled Gaussian at integer ``orders`` for many noise multipliers
    at once (Mironov et al. 2019, Eq. 3; the remove direction, which dominates add): [m, orders]."""
    q, s = sample_rate, np.asarray(noise_multipliers, dtype=float)[:, None]  # [m, 1]
    if q == 1.0:
        return orders[None, :] / (2 * s**2)
    out = np.empty((s.shape[0], len(orders)))
    for j, a in enumerate(orders.astype(int)):
        i = np.arange(a + 1, dtype=float)
        log_binom = (special.gammaln(a + 1) - special.gammaln(i + 1) - special.gammaln(a - i + 1)
                     + i * math.log(q) + (a - i) * math.log1p(-q))  # [a+1]
        terms = log_binom + (i * i - i) / (2 * s**2)  # [m, a+1]
        top = terms.max(axis=1, keepdims=True)
        out[:, j] = (top[:, 0] + np.log(np.exp(terms - top).sum(axis=1))) / (a - 1)
    return out


def randomized_clipping(noise_multiplier: float, sample_rate: float, sketch_k: int | None, *, delta: float,
                        steps: int) -> list[GaussianMixturePRV]:
    """DP-SGD-RC with k probes (Hutchinson or Hutch++): the Z_env mixture, both directions; the
    tail beyond z_max, TAIL_FRACTION·δ/T per step, is charged to δ (at most TAIL_FRACTION·δ in all)."""
    if sketch_k is None:
        raise UserError("randomized clipping needs sketch_k")
    atoms = envelope_atoms(noise_multiplier, sketch_k, tail_mass=TAIL_FRACTION * delta / steps)
    directions = ("remove",) if sample_rate == 1.0 else ("remove", "add")
    return [GaussianMixturePRV(sample_rate, noise_multiplier, atoms, d) for d in directions]
