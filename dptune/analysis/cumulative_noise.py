"""Cumulative DP noise σ√T against the batch size B, with the plateau and minimum-step rules.

Fixed-epoch budget of "On optimal hyperparameters for DP deep transfer learning" (ICLR 2026):
T = ⌈E·N/B⌉ steps, σ_B calibrated for (ε, δ, q = B/N, T). Batch sizes with T < ``min_steps`` are
too few steps to learn; among the rest, those with σ√T ≤ (1 + ``plateau_tol``)·min σ√T are on the
plateau, and the smallest of them is the recommended B. q, T, the rules and their defaults are the
search space's own (:mod:`dptune.search_spaces.batches`), which prunes candidates with them before
a sweep; this module draws the curves after it, from the store's cells.
"""
from __future__ import annotations

import functools
import math
from typing import Iterable, Mapping, Sequence

import pandas as pd

from ..privacy import calibrate_noise
from ..search_spaces.batches import MIN_STEPS, PLATEAU_TOL, batch_rows, min_step_floor
from .results import DEFAULT_DELTA, Sweep
from ..schema import BATCH_SIZE

__all__ = ["MIN_STEPS", "PLATEAU_TOL", "noise_curve", "default_batch_grid", "cell_noise_curves", "min_step_floor"]

CURVE_COLUMNS = [BATCH_SIZE, "sample_rate", "steps", "noise_multiplier", "noise_sqrt_steps", "reason"]


def noise_curve(epsilon: float, delta: float, dataset_size: int, epochs: float, batch_sizes: Iterable[int], *,
                min_steps: int = MIN_STEPS, plateau_tol: float = PLATEAU_TOL, norm_estimator: str = "exact",
                sketch_k: int | None = None) -> pd.DataFrame:
    """One row per B: sample_rate, steps, noise_multiplier, noise_sqrt_steps, kept, reason.

    ``kept`` marks the plateau after the minimum-step floor; ``reason`` says why a B is not kept.
    A B that cannot be calibrated (ε unreachable) gets NaN noise and the accountant's message.
    """
    rows = batch_rows(dataset_size, epochs, sorted({int(b) for b in batch_sizes if 1 <= int(b) <= dataset_size}),
                      functools.partial(calibrate_noise, epsilon, delta, norm_estimator=norm_estimator,
                                        sketch_k=sketch_k), min_steps=min_steps, plateau_tol=plateau_tol)
    floor = min((row["noise_sqrt_steps"] for row in rows if row["reason"] in (None, "off_plateau")), default=math.nan)
    for row in rows:
        if row["reason"] == "min_steps":
            row["reason"] = f"T = {row['steps']} < {min_steps} steps"
        elif row["reason"] == "off_plateau":
            row["reason"] = (f"σ√T {row['noise_sqrt_steps'] / floor - 1:.0%} above the minimum "
                             f"(plateau: {plateau_tol:.0%})")
        elif row["reason"] is None:
            row["reason"] = ""
    curve = pd.DataFrame(rows, columns=CURVE_COLUMNS)
    curve["kept"] = curve["reason"] == ""
    return curve


def default_batch_grid(dataset_size: int, smallest_tried: float) -> list[int]:
    """Powers of two from a quarter of the smallest B tried up to N, and N itself."""
    low = max(1, int(smallest_tried // 4))
    powers = [2**k for k in range(int(math.log2(low)), int(math.log2(dataset_size)) + 1)]
    return sorted({b for b in powers if low <= b <= dataset_size} | {dataset_size})


def cell_noise_curves(sweep: Sweep, *, batch_sizes: Sequence[int] | None = None, min_steps: int = MIN_STEPS,
                      plateau_tol: float = PLATEAU_TOL, planned: Mapping[str, Sequence[int]] | None = None
                      ) -> tuple[pd.DataFrame, list[str]]:
    """σ√T-versus-B curves of every private cell (long format, with ``cell_name``, ``tried``:
    whether the sweep ran that B, and ``planned``: whether the sweep's plan listed it), and notes on
    cells that could not be drawn.

    N comes from the store (B/q); δ, the norm estimator and k from the cell's trials. The grid is
    the Bs the sweep tried plus ``batch_sizes``, else the candidates its plan listed for the cell
    (``planned``, by cell name), else :func:`default_batch_grid`.
    """
    curves, notes = [], []
    for _, cell in sweep.cells().iterrows():
        name = cell["cell_name"]
        if not cell["private"]:
            continue
        n = sweep.dataset_size(name)
        if n is None:
            notes.append(f"{name}: no noise curve (no trial recorded its sample rate)")
            continue
        tried = sorted(sweep.trials.loc[sweep.trials["cell_name"] == name, BATCH_SIZE].dropna().unique())
        listed = [int(b) for b in (planned or {}).get(name, ())]
        grid = list(batch_sizes) if batch_sizes else listed or default_batch_grid(n, min(tried))
        sketch_k = sweep.cell_option(name, "sketch_k")
        curve = noise_curve(float(cell["epsilon"]), float(sweep.cell_option(name, "delta", DEFAULT_DELTA)), n,
                            float(cell["epochs"]), grid + [int(b) for b in tried], min_steps=min_steps,
                            plateau_tol=plateau_tol,
                            norm_estimator=str(sweep.cell_option(name, "norm_estimator", "exact")),
                            sketch_k=None if sketch_k is None else int(float(sketch_k)))
        curve["tried"] = curve[BATCH_SIZE].isin([int(b) for b in tried])
        curve["planned"] = curve[BATCH_SIZE].isin(listed)
        curve.insert(0, "cell_name", name)
        curve["dataset_size"] = n
        curves.append(curve)
    frame = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(
        columns=["cell_name", BATCH_SIZE, "sample_rate", "steps", "noise_multiplier", "noise_sqrt_steps",
                 "reason", "kept", "tried", "planned", "dataset_size"])
    return frame, notes
