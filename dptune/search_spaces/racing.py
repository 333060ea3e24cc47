"""Racing: seeds spent where they decide.

With a cell's search and bracketing done on the spec's seeds, the configurations that cannot be
told from the cell's optimum (the contenders, by the same test as the error bars:
:func:`~.comparisons.against_best`) get further seeds, the same new seeds for
all of them, and the others none; the test is repeated, round after round, until every contender
is told from the optimum or ``max_seeds`` is reached. The seeds of round r are fixed in advance
(:func:`seed_rounds`: the count doubles each round — or, within a budget, goes to ``max_seeds`` at
once —, the new seeds being the smallest integers not yet used), so a cell makes at most
:func:`looks` tests of each configuration whatever the data say.

A cell's racing spends at most ``max_added`` × the compute its search and bracketing spent, counted
in full trials' worth of steps (a trial multi-fidelity stopped early counts its share; a raced trial
always trains to the end) (:data:`DEFAULT_MAX_ADDED` unless the spec says otherwise): the contenders are served in the order of
their means, best first, each admitted only while the budget can carry every admitted contender to
``max_seeds`` — so the configurations nearest the optimum get all their seeds, and those beyond the
budget keep the spec's seeds (the closing lines count them). Which contenders get seeds may depend on
the data in any way without touching the error rate below: the correction covers every test that
could be made.

The error rate under this sequential use: a configuration as good as the optimum could be called
"distinguishable" at any of the looks, so every test of a raced cell — the contenders' rounds and
the closing lines' — is Bonferroni-corrected for the K settings compared *and* the L looks
planned: p × K × L < α (the sweep records L per trial, ``looks``, for the analysis to read). Pure
functions: the platform runs the rounds (:mod:`dptune.platform.sweep.race`).
"""
from __future__ import annotations

from typing import Sequence

#: Seeds per contender unless the spec says otherwise (``search: {racing: {max_seeds: N}}``).
DEFAULT_MAX_SEEDS = 10
#: At most how much compute a cell's racing adds, as a multiple of what its search and bracketing
#: spent (full trials' worth of steps), unless the spec says otherwise (``search: {racing: {max_added: 0.25}}``; ``off``:
#: no limit): what keeps the default sweep within 1.5× of its time without racing (BENCHMARKS.md).
DEFAULT_MAX_ADDED = 0.25


def seed_rounds(seeds: Sequence[int], max_seeds: int, budget: bool = False) -> list[tuple[int, ...]]:
    """The seed set of each look: the spec's seeds, then twice as many (at most ``max_seeds``), …;
    new seeds are the smallest non-negative integers not in the spec's list. Within a ``budget``
    (``max_added``), which reserves every admitted contender's seeds up to ``max_seeds`` anyway, the
    spec's seeds and then ``max_seeds`` at once: one round instead of one per doubling (a cell waits
    for each round's results), and two looks."""
    rounds = [tuple(seeds)]
    used = set(seeds)
    fresh = (s for s in range(len(seeds) + max_seeds + 1) if s not in used)
    while len(rounds[-1]) < max_seeds:
        count = (max_seeds if budget else min(max_seeds, 2 * len(rounds[-1]))) - len(rounds[-1])
        rounds.append(rounds[-1] + tuple(next(fresh) for _ in range(count)))
    return rounds


def looks(seeds: Sequence[int], max_seeds: int | None, budget: bool = False) -> int:
    """How many times a cell tests its configurations against its optimum: 1 without racing (None),
    else one per seed round (:func:`seed_rounds`)."""
    return 1 if max_seeds is None else len(seed_rounds(seeds, max_seeds, budget))
