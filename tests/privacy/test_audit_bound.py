"""The one-run audit's bound ("Privacy auditing with one (1) training run", Steinke, Nasr &
Jagielski, NeurIPS 2023), checked against independent computations: the binomial tails summed
term by term in exact arithmetic, the closed form of r correct guesses out of r, guesses counted
by a loop, and randomised response (a mechanism that is exactly ε-DP per canary): the bound
exceeds ε in at most 5% of runs, and it does exceed ε for randomised response at 2ε."""
import math
from fractions import Fraction

import numpy as np
import pytest

from dptune.privacy.audit_bound import (SIGNIFICANCE, audit_bound, correct_guesses, epsilon_lower_bound,
                                        guess_grid, p_value)


def tail(r: int, v: int, q: Fraction) -> Fraction:
    """P[Bin(r, q) ≥ v], summed term by term."""
    return sum((math.comb(r, j) * q ** j * (1 - q) ** (r - j) for j in range(max(v, 0), r + 1)), Fraction(0))


def brute_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    q = Fraction(math.exp(epsilon)) / (1 + Fraction(math.exp(epsilon)))
    beta = tail(r, v, q)
    alpha = max([(tail(r, v - i, q) - beta) / i for i in range(1, v + 1)], default=Fraction(0))
    return float(min(beta + 2 * m * Fraction(delta) * alpha, Fraction(1)))


@pytest.mark.parametrize("m,r,v,epsilon,delta", [
    (100, 10, 10, 1.0, 0.0), (100, 10, 7, 0.5, 0.0), (1000, 30, 25, 2.0, 1e-5), (1000, 30, 30, 3.0, 1e-3),
    (50, 20, 12, 0.2, 1e-2), (10, 1, 1, 0.0, 0.0), (500, 25, 0, 1.0, 1e-5)])
def test_p_value_is_the_binomial_tail_with_the_delta_term(m, r, v, epsilon, delta):
    assert p_value(m, r, v, epsilon, delta) == pytest.approx(brute_p_value(m, r, v, epsilon, delta), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("r", [5, 20, 100, 1000])
def test_all_guesses_right_without_delta_give_the_closed_form(r):
    """v = r, δ = 0: p = q^r, so ε = logit(α^(1/r)) (e.g. 100 of 100 right at 95%: ε ≥ 3.49)."""
    q = SIGNIFICANCE ** (1 / r)
    assert epsilon_lower_bound(1000, r, r, 0.0) == pytest.approx(math.log(q / (1 - q)), abs=1e-5)
    assert epsilon_lower_bound(1000, r, r, 1e-5) < epsilon_lower_bound(1000, r, r, 0.0)   # δ only weakens it


def test_no_bound_from_chance_guesses():
    assert epsilon_lower_bound(1000, 100, 50, 1e-5) == 0.0
    assert epsilon_lower_bound(1000, 0, 0, 1e-5) == 0.0


def test_guesses_are_counted_as_a_loop_counts_them():
    rng = np.random.default_rng(3)
    scores, included = rng.normal(size=200).round(1), rng.random(200) < 0.5   # ties broken by index
    order = sorted(range(200), key=lambda i: (-scores[i], i))
    for positive, negative in guess_grid(200):
        expected = sum(included[i] for i in order[:positive]) + sum(not included[i] for i in order[200 - negative:])
        assert correct_guesses(scores, included, positive, negative) == expected


def randomised_response(epsilon: float, m: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Each canary's membership reported truthfully with probability e^ε/(1+e^ε): ε-DP per canary
    (the uniform jitter breaks ties independently of the memberships)."""
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    truthful = rng.random(m) < math.exp(epsilon) / (1 + math.exp(epsilon))
    return np.where(truthful, included, ~included) + 0.01 * rng.random(m), included


def test_the_bound_holds_for_an_exactly_dp_mechanism_and_catches_one_twice_as_leaky():
    runs = 200
    valid = [audit_bound(*randomised_response(1.0, 1000, seed), delta=0.0).epsilon for seed in range(runs)]
    assert sum(e > 1.0 for e in valid) <= 0.05 * runs   # 95% confidence (Bonferroni over the grid: fewer)
    assert np.median(valid) > 0.5                        # and not vacuous: RR is the tight case
    leaky = [audit_bound(*randomised_response(2.0, 1000, seed), delta=0.0).epsilon for seed in range(50)]
    assert sum(e > 1.0 for e in leaky) >= 45
