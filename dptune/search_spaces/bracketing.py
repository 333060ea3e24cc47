"""Bracketing: an optimum on an edge of the values a cell searched is not an answer yet.

When a cell's optimum (its seed-mean; under proxy runs, the proxies' ranking) is the smallest or
largest value of C, B or η its cell tried — η among those tried at its (C, B), C among those at its
B, B among the cell's (:func:`edges`: the same slices the analysis flags) — the sweep adds the next
value beyond that edge, in the grid's own spacing (:func:`extended`: the geometric step between the
grid's two end values), along the optimum's own line rather than a whole slab:

- η: the next η at its (C, B);
- C: the next C at its B, with its η and one η step either side;
- B: the next B with its C and its η scaled by √(B′/B) (the same η multiplier), one η step either side.

An optimum that moved along η (an η extension, or a race) may have left its C and B neighbours behind:
a neighbour tried only at η multipliers all below (or all above) the optimum's says nothing of whether
that neighbour would win at the optimum's η (:func:`stale`). Its line is added as an extension of that
axis is — the neighbour at the optimum's η multiplier and one step either side — so C and B are
searched again where η now is (a coordinate search; in a full grid no neighbour is ever stale).

It repeats until the optimum lies inside, or a data-independent rule stops it (:data:`RULES`): the
planner's minimum steps and σ√T plateau, B within [:data:`MIN_BATCH_SIZE`, N/2], smaller C that are
clip-equivalent, and at most ``max_extensions`` extensions per axis and cell. The rules read no
private data but the clip-equivalence decision (already non-private, and off under private
selection, as bracketing is: an adaptive search has no fixed trial count). Pure functions: the
platform runs the rounds (:mod:`dptune.platform.sweep.bracket`), the analysis reads the edges.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

#: The searched axes of a configuration, in its order (C, B, η multiplier).
AXES = ("C", "B", "η")
#: The smallest batch size an extension goes to (below it a DP step's noise swamps any signal).
MIN_BATCH_SIZE = 16
#: Extensions per axis and cell unless the spec says otherwise (``search: {bracket: {max_extensions: N}}``).
DEFAULT_MAX_EXTENSIONS = 2
#: The rules that stop an extension, as the closing lines name them.
RULES = {"max_extensions": "at most {n} extensions", "min_batch": f"B ≥ {MIN_BATCH_SIZE}",
         "max_batch": "B ≤ N/2 ({n})", "min_steps": "at least {n} steps (pruning.min_steps)",
         "plateau": "the σ√T plateau (pruning.plateau_tol)", "clip_equivalent": "smaller C are clip-equivalent "
         "(every example clipped at every step: the same result)"}
#: Added to a rule that stopped a :func:`stale` neighbour's line (the optimum is inside that axis's range).
STALE_NOTE = " (its neighbour was not tried at its η)"


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def edges(tried: Iterable[Sequence[float]], optimum: Sequence[float]) -> list[tuple[int, int]]:
    """(axis, side) for each of the optimum's C, B, η on an edge of what its cell tried: side −1 the
    smallest, +1 the largest. ``tried``: the cell's configurations as (C, B, η) — values, or
    positions along each axis in the same order — errored and stopped ones included (a larger η
    that diverged brackets the optimum; one stopped at a rung lost there). B among the cell's, C among
    those tried at the optimum's B, η among those at its (C, B); an axis with one value tried has no edge."""
    tried = [tuple(t) for t in tried]
    slices = [(1, tried)]
    at_b = [t for t in tried if _close(t[1], optimum[1])]
    if optimum[0] is not None and not (isinstance(optimum[0], float) and math.isnan(optimum[0])):
        slices.append((0, at_b))
        at_b = [t for t in at_b if _close(t[0], optimum[0])]
    slices.append((2, at_b))
    out = []
    for axis, rows in slices:
        values = sorted({t[axis] for t in rows})
        if len(values) < 2:
            continue
        if _close(optimum[axis], values[-1]):
            out.append((axis, 1))
        elif _close(optimum[axis], values[0]):
            out.append((axis, -1))
    return sorted(out)


def stale(tried: Iterable[Sequence[int]], optimum: Sequence[int]) -> list[tuple[int, int]]:
    """(axis, side) for each C or B neighbour of ``optimum`` (positions (C, B, η multiplier); side −1 the
    next smaller, +1 the next larger, with the optimum's other coordinate) that its cell tried, but only at
    η multipliers all smaller or all larger than the optimum's: the optimum moved along η past what its
    neighbour was searched at. A neighbour never tried is not stale (:func:`edges` reads those)."""
    tried = [tuple(t) for t in tried]
    out = []
    for axis in (0, 1):
        if axis == 0 and optimum[0] is None:
            continue
        for side in (-1, 1):
            neighbour = list(optimum[:2])
            neighbour[axis] += side
            etas = [t[2] for t in tried if tuple(t[:2]) == tuple(neighbour)]
            if etas and not min(etas) <= optimum[2] <= max(etas):
                out.append((axis, side))
    return out


def extended(grid: Sequence[float], index: float) -> float | None:
    """The value at position ``index`` of ``grid`` (sorted ascending) and beyond it, in its own
    spacing: the ratio of its two end values at each end (geometric, as the grids are log-spaced); a
    position between two grid points (a continuous search's) lies between their values in log. None
    beyond a grid of one value (it has no spacing: the axis was not searched)."""
    n = len(grid)
    if 0 <= index <= n - 1:
        low = math.floor(index)
        if low == index:
            return grid[int(index)]
        return grid[low] * (grid[low + 1] / grid[low]) ** (index - low)
    if n < 2:
        return None
    if index < 0:
        return grid[0] * (grid[0] / grid[1]) ** (-index)
    return grid[-1] * (grid[-1] / grid[-2]) ** (index - n + 1)


def extended_batch_size(grid: Sequence[int], index: int, dataset_size: int) -> int | None:
    """The batch size at ``index`` of the searched B (beyond it: :func:`extended`, rounded and kept
    within [:data:`MIN_BATCH_SIZE`, N/2] — so the last step may be shorter than the grid's). B is never
    searched between its values: each needs its own σ."""
    if index != int(index):
        return None
    index = int(index)
    value = extended(grid, index)
    if value is None:
        return None
    if 0 <= index < len(grid):
        return int(value)
    return int(min(max(round(value), MIN_BATCH_SIZE), dataset_size // 2))


def line(optimum: tuple[int, int, int], axis: int, side: int) -> list[tuple[int, int, int]]:
    """The configurations (positions) an extension of ``axis`` beyond ``optimum`` adds (see the module
    docstring): η alone; C or B with the optimum's η multiplier and one step either side."""
    ci, bi, mi = optimum
    if axis == 2:
        return [(ci, bi, mi + side)]
    moved = (ci + side, bi) if axis == 0 else (ci, bi + side)
    return [(*moved, mi + step) for step in (-1, 0, 1)]
