"""An empirical lower bound on ε from one training run ("Privacy auditing with one (1) training run",
Steinke, Nasr & Jagielski, NeurIPS 2023). Pure numpy/scipy: the run and its scores are elsewhere.

m canaries are each included in the training data independently with probability ½. After the
run, an auditor scores every canary (a higher score: more likely included), guesses "in" for
the k₊ highest and "out" for the k₋ lowest, and abstains on the rest: r = k₊ + k₋ guesses, v of
them correct. If the run is (ε, δ)-DP, then (their Theorem 5.2, with δ)

    P[v correct or more] ≤ β + 2mδ·α,   β = P[Bin(r, q) ≥ v],   q = e^ε / (1 + e^ε),
                                        α = max_{1≤i≤v} (P[Bin(r, q) ≥ v − i] − β) / i,

so an outcome with p-value below the significance rejects (ε, δ)-DP, and the largest ε that is
rejected is the lower bound. The guess counts are taken from a fixed grid (:data:`GUESS_FRACTIONS`,
with and without negative guesses), each tested at significance / (grid size) (Bonferroni), so
that choosing the best of them after seeing the scores keeps the 95% confidence. scipy is imported
where it is used, so the defaults below load without it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

#: The fractions of the m canaries guessed on (each split evenly into k₊ and k₋, and k₊ alone).
GUESS_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
#: The default significance: the bound holds with 95% confidence.
SIGNIFICANCE = 0.05
#: Default canary counts of an audit run: gradient (white-box) and input (black-box) canaries.
GRADIENT_CANARIES, INPUT_CANARIES = 1000, 100


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The p-value of v or more correct out of r guesses on m canaries under (ε, δ)-DP (module docstring)."""
    from scipy import special, stats   # here: `dptune --help` reads this module's defaults without scipy

    q = special.expit(epsilon)
    beta = float(stats.binom.sf(v - 1, r, q))
    if delta == 0 or v == 0:
        return beta
    i = np.arange(1, v + 1)
    alpha = float(np.max((stats.binom.sf(v - i - 1, r, q) - beta) / i, initial=0.0))
    return min(beta + 2 * m * delta * alpha, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, significance: float = SIGNIFICANCE) -> float:
    """The largest ε whose (ε, δ)-DP the outcome (r guesses, v correct) rejects at ``significance``;
    0 when it rejects none."""
    from scipy import optimize

    def rejected(epsilon: float) -> float:   # > 0 where (ε, δ)-DP is rejected
        return significance - p_value(m, r, v, epsilon, delta)

    if r == 0 or rejected(0.0) <= 0:
        return 0.0
    high = 1.0
    while rejected(high) > 0:   # ends: q = expit(ε) is 1.0 in float64 from ε ≈ 37 on, and then β = 1
        if high >= 1024:
            return high
        high *= 2
    return float(optimize.brentq(rejected, high / 2 if high > 1 else 0.0, high, xtol=1e-6))


@dataclass(frozen=True)
class AuditBound:
    """The best guess of the grid: its counts, how many were right, and the ε lower bound."""

    epsilon: float              # the lower bound (0: nothing rejected)
    guesses: int                # r = k₊ + k₋
    correct: int                # v
    positive: int               # k₊
    negative: int               # k₋
    canaries: int               # m
    significance: float         # overall (the grid's tests are Bonferroni-corrected)


def guess_grid(m: int) -> list[tuple[int, int]]:
    """(k₊, k₋) of every guess count tested on m canaries."""
    grid = []
    for fraction in GUESS_FRACTIONS:
        r = max(1, round(fraction * m))
        grid += [(r, 0), (math.ceil(r / 2), r // 2)]
    return sorted(set(grid))


def correct_guesses(scores: Sequence[float], included: Sequence[bool], positive: int, negative: int) -> int:
    """Correct guesses when the ``positive`` highest scores are guessed in and the ``negative``
    lowest out (ties broken by canary index, which the auditor knows before the run)."""
    scores, included = np.asarray(scores, dtype=float), np.asarray(included, dtype=bool)
    order = np.lexsort((np.arange(len(scores)), -scores))   # highest score first
    top, bottom = order[:positive], order[len(order) - negative:] if negative else order[:0]
    return int(included[top].sum() + (~included[bottom]).sum())


def audit_bound(scores: Sequence[float], included: Sequence[bool], delta: float,
                significance: float = SIGNIFICANCE) -> AuditBound:
    """The ε lower bound of one run's canary scores: the best of :func:`guess_grid`, each guess
    count tested at ``significance`` / (grid size)."""
    m = len(scores)
    if m == 0 or len(included) != m:
        raise ValueError(f"need one inclusion flag per score; got {m} scores, {len(included)} flags")
    grid = guess_grid(m)
    level = significance / len(grid)
    best = None
    for positive, negative in grid:
        r = positive + negative
        v = correct_guesses(scores, included, positive, negative)
        bound = AuditBound(epsilon_lower_bound(m, r, v, delta, level), r, v, positive, negative, m, significance)
        if best is None or bound.epsilon > best.epsilon:
            best = bound
    return best
