"""Batch-size candidates of one cell: σ for each B, and the minimum-step and σ√T plateau rules.

For a fixed number of epochs E, T = ⌈E·N/B⌉ falls as B grows, and the noise that accumulates over
training is σ_B·√T ("On optimal hyperparameters for DP deep transfer learning", ICLR 2026).
Two rules pick the batch sizes worth searching:

* **minimum steps**: too few steps and training cannot converge, whatever the noise (T < min_steps);
* **plateau**: among the rest, keep B whose σ_B√T ≤ (1 + plateau_tol)·min σ√T.

The smallest kept B is the recommended one. Stronger privacy widens the plateau towards small B.
A cap on the searched B (``max_batch_sizes``) keeps B spread across the plateau (:func:`spread`).
This module is the one home of both rules and their defaults (:data:`MIN_STEPS`,
:data:`PLATEAU_TOL`): the planner prunes candidates with them before a sweep, and the analysis
draws the same curves from a store after it.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Iterable

import pandas as pd

from ..errors import UserError
from ..privacy import calibrate_noise
from ..privacy.schedule import num_steps, sample_rate
from ..schema import BATCH_SIZE

#: Columns of a batch plan, in order.
COLUMNS = (BATCH_SIZE, "sample_rate", "steps", "noise_multiplier", "noise_sqrt_steps", "kept", "reason")
#: Why a candidate was dropped.
REASONS = ("exceeds_dataset", "min_steps", "off_plateau")
#: Default minimum-step floor: a B with T < MIN_STEPS is dropped.
MIN_STEPS = 20
#: Default plateau tolerance: a B is kept when σ√T ≤ (1 + PLATEAU_TOL)·min σ√T.
PLATEAU_TOL = 0.05


def sample_rate_and_steps(batch_size: int, dataset_size: int, epochs: float) -> tuple[float, int]:
    """q = B/N and T = ⌈E·N/B⌉, computed exactly as the trainer does (:mod:`dptune.privacy.schedule`)."""
    return sample_rate(batch_size, dataset_size), num_steps(epochs, dataset_size, batch_size)


def min_step_floor(dataset_size: int, epochs: float, min_steps: int = MIN_STEPS) -> float:
    """The largest B with ⌈E·N/B⌉ ≥ min_steps, i.e. B < E·N/(min_steps − 1) (larger B: too few steps)."""
    if min_steps <= 1:
        return float(dataset_size)
    return float(min(dataset_size, math.ceil(epochs * dataset_size / (min_steps - 1)) - 1))


def _check_inputs(dataset_size: int, epochs: float, candidates: Iterable[int], min_steps: int,
                  plateau_tol: float) -> list[int]:
    if isinstance(dataset_size, bool) or int(dataset_size) != dataset_size or dataset_size < 1:
        raise UserError(f"dataset_size must be a whole number >= 1; got {dataset_size!r}")
    if not (epochs > 0 and math.isfinite(epochs)):
        raise UserError(f"epochs must be a finite number > 0; got {epochs!r}")
    if isinstance(min_steps, bool) or int(min_steps) != min_steps or min_steps < 1:
        raise UserError(f"min_steps must be a whole number >= 1; got {min_steps!r}")
    if not (plateau_tol >= 0 and math.isfinite(plateau_tol)):
        raise UserError(f"plateau_tol must be a finite number >= 0; got {plateau_tol!r}")
    batch_sizes = sorted(set(candidates))
    if not batch_sizes:
        raise UserError("candidates must contain at least one batch size")
    for b in batch_sizes:
        if isinstance(b, bool) or int(b) != b or b < 1:
            raise UserError(f"batch sizes must be whole numbers >= 1; got {b!r}")
    return [int(b) for b in batch_sizes]


Row = dict  # one candidate: the COLUMNS as keys


def candidate_rows(dataset_size: int, epochs: float, candidates: Iterable[int]) -> list[Row]:
    """(B, q, T) for each candidate; B > N is marked ``exceeds_dataset`` (Poisson sampling with
    q > 1 does not exist). σ and σ√T are NaN until filled."""
    rows = []
    for b in candidates:
        q, steps = sample_rate_and_steps(b, dataset_size, epochs)
        rows.append({BATCH_SIZE: b, "sample_rate": q, "steps": steps, "noise_multiplier": math.nan,
                     "noise_sqrt_steps": math.nan, "kept": False,
                     "reason": "exceeds_dataset" if b > dataset_size else None})
    return rows


def fill_noise(rows: list[Row], noise: Callable[[float, int], float]) -> list[Row]:
    """Copies of ``rows`` with σ = ``noise(q, T)`` and σ√T for every candidate that fits the data; a
    candidate ``noise`` cannot calibrate (ε unreachable: a UserError) is dropped with the reason."""
    out = []
    for row in rows:
        row = dict(row)
        if row["reason"] is None:
            try:
                row["noise_multiplier"] = sigma = noise(row["sample_rate"], row["steps"])
                row["noise_sqrt_steps"] = sigma * math.sqrt(row["steps"])
            except UserError as exc:
                row["reason"] = f"not calibrated: {exc}"
        out.append(row)
    return out


def batch_rows(dataset_size: int, epochs: float, candidates: Iterable[int], noise: Callable[[float, int], float], *,
               min_steps: int, plateau_tol: float) -> list[Row]:
    """The batch-size rule, the one path every caller takes (``batch_plan``, the planner, the
    analysis's noise curves): (B, q, T) per candidate, σ = ``noise(q, T)`` where B fits the data,
    then the minimum-step and plateau rules."""
    rows = fill_noise(candidate_rows(dataset_size, epochs, candidates), noise)
    return prune_rows(rows, min_steps=min_steps, plateau_tol=plateau_tol)


def prune_rows(rows: list[Row], *, min_steps: int, plateau_tol: float) -> list[Row]:
    """Copies of ``rows`` with the minimum-step rule, then the plateau rule applied (σ√T must be
    filled in for every candidate not already dropped)."""
    out = [dict(row, reason=row["reason"] if isinstance(row["reason"], str) else None) for row in rows]
    for row in out:
        if row["reason"] is None and row["steps"] < min_steps:
            row["reason"] = "min_steps"
    alive = [row for row in out if row["reason"] is None]
    if alive:
        ceiling = (1.0 + plateau_tol) * min(row["noise_sqrt_steps"] for row in alive)
        for row in alive:
            if row["noise_sqrt_steps"] > ceiling:
                row["reason"] = "off_plateau"
    for row in out:
        row["kept"] = row["reason"] is None
    return out


def spread(kept: Iterable[int], limit: int | None) -> tuple[int, ...]:
    """At most ``limit`` of the ``kept`` batch sizes, spread across them: the smallest (the
    recommended one), the largest, and evenly spaced ranks between; all of them when ``limit`` is
    None or not below their number. On the plateau σ√T hardly changes with B, but which end trains
    best does (at ε = 1 on digits the largest B won: BENCHMARKS.md, "Time to an answer"), so a cap
    keeps both ends rather than the smallest few."""
    ordered = sorted(set(kept))
    if limit is None or limit >= len(ordered):
        return tuple(ordered)
    if limit == 1:
        return tuple(ordered[:1])
    last = len(ordered) - 1
    return tuple(ordered[i] for i in sorted({round(k * last / (limit - 1)) for k in range(limit)}))


def rows_frame(rows: list[Row], columns: Iterable[str] = COLUMNS) -> pd.DataFrame:
    """A frame of candidate rows; ``reason`` stays an object column, None for kept rows."""
    frame = pd.DataFrame(rows, columns=list(columns))
    frame["reason"] = pd.Series([row["reason"] for row in rows], index=frame.index, dtype=object)
    return frame


def prune_batches(frame: pd.DataFrame, *, min_steps: int, plateau_tol: float) -> pd.DataFrame:
    """The minimum-step and plateau rules on a batch-plan frame whose σ√T is filled in for every
    candidate not already dropped; returns a new frame with ``kept`` and ``reason`` set."""
    rows = prune_rows(frame.to_dict("records"), min_steps=min_steps, plateau_tol=plateau_tol)
    return rows_frame(rows, frame.columns)


def batch_plan(epsilon: float, delta: float, dataset_size: int, epochs: float, candidates: Iterable[int], *,
               min_steps: int = MIN_STEPS, plateau_tol: float = PLATEAU_TOL, norm_estimator: str = "exact",
               sketch_k: int | None = None) -> pd.DataFrame:
    """One row per candidate B (ascending): batch_size, sample_rate, steps, noise_multiplier,
    noise_sqrt_steps, kept, reason (None when kept; else exceeds_dataset, min_steps or off_plateau).

    σ = ``calibrate_noise(ε, δ, q, T)`` for q = B/N, T = ⌈E·N/B⌉ (cached in memory and on disk),
    so the trials of a sweep can reuse it instead of calibrating again.
    """
    batch_sizes = _check_inputs(dataset_size, epochs, candidates, min_steps, plateau_tol)
    noise = functools.partial(calibrate_noise, epsilon, delta, norm_estimator=norm_estimator, sketch_k=sketch_k)
    return rows_frame(batch_rows(dataset_size, epochs, batch_sizes, noise, min_steps=min_steps,
                                 plateau_tol=plateau_tol))
