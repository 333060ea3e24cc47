"""Cumulative DP noise σ√T against the batch size B, with the plateau and minimum-step rules.

Paper 000 (fixed-epoch budget): T = ⌈E·N/B⌉ steps, σ_B calibrated for (ε, δ, q = B/N, T).
Batch sizes with T < ``min_steps`` are too few steps to learn; among the rest, those with
σ√T ≤ (1 + ``plateau_tol``)·min σ√T are on the plateau, and the smallest of them is the
recommended B. The rules and defaults are DESIGN.md's (the search space applies the same ones
to prune candidates before a sweep; this module draws them after it, from the store's cells).
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import pandas as pd

from ..privacy import calibrate_noise
from .results import DEFAULT_DELTA, Sweep

MIN_STEPS = 20
PLATEAU_TOL = 0.05


def noise_curve(epsilon: float, delta: float, dataset_size: int, epochs: float, batch_sizes: Iterable[int], *,
                min_steps: int = MIN_STEPS, plateau_tol: float = PLATEAU_TOL, norm_estimator: str = "exact",
                sketch_k: int | None = None) -> pd.DataFrame:
    """One row per B: sample_rate, steps, noise_multiplier, noise_sqrt_steps, kept, reason.

    ``kept`` marks the plateau after the minimum-step floor; ``reason`` says why a B is not kept.
    A B that cannot be calibrated (ε unreachable) gets NaN noise and the accountant's message.
    """
    rows = []
    for b in sorted({int(b) for b in batch_sizes if 1 <= int(b) <= dataset_size}):
        q = b / dataset_size
        steps = math.ceil(epochs * dataset_size / b)
        try:
            sigma = calibrate_noise(epsilon, delta, q, steps, norm_estimator=norm_estimator, sketch_k=sketch_k)
            reason = f"T = {steps} < {min_steps} steps" if steps < min_steps else ""
        except ValueError as exc:
            sigma, reason = math.nan, f"not calibrated: {exc}"
        rows.append({"batch_size": b, "sample_rate": q, "steps": steps, "noise_multiplier": sigma,
                     "noise_sqrt_steps": sigma * math.sqrt(steps), "reason": reason})
    curve = pd.DataFrame(rows, columns=["batch_size", "sample_rate", "steps", "noise_multiplier",
                                        "noise_sqrt_steps", "reason"])
    eligible = curve["reason"] == ""
    floor = curve.loc[eligible, "noise_sqrt_steps"].min()
    above = eligible & (curve["noise_sqrt_steps"] > (1 + plateau_tol) * floor)
    curve.loc[above, "reason"] = [f"σ√T {v / floor - 1:.0%} above the minimum (plateau: {plateau_tol:.0%})"
                                  for v in curve.loc[above, "noise_sqrt_steps"]]
    curve["kept"] = curve["reason"] == ""
    return curve


def default_batch_grid(dataset_size: int, smallest_tried: float) -> list[int]:
    """Powers of two from a quarter of the smallest B tried up to N, and N itself."""
    low = max(1, int(smallest_tried // 4))
    powers = [2**k for k in range(int(math.log2(low)), int(math.log2(dataset_size)) + 1)]
    return sorted({b for b in powers if low <= b <= dataset_size} | {dataset_size})


def cell_noise_curves(sweep: Sweep, *, batch_sizes: Sequence[int] | None = None, min_steps: int = MIN_STEPS,
                      plateau_tol: float = PLATEAU_TOL) -> tuple[pd.DataFrame, list[str]]:
    """σ√T-versus-B curves of every private cell (long format, with ``cell_name`` and ``tried``:
    whether the sweep ran that B), and notes on cells that could not be drawn.

    N comes from the store (B/q); δ, the norm estimator and k from the cell's trials. The grid is
    the Bs the sweep tried plus ``batch_sizes`` or, by default, :func:`default_batch_grid`.
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
        tried = sorted(sweep.trials.loc[sweep.trials["cell_name"] == name, "batch_size"].dropna().unique())
        grid = list(batch_sizes) if batch_sizes else default_batch_grid(n, min(tried))
        sketch_k = sweep.cell_option(name, "sketch_k")
        curve = noise_curve(float(cell["epsilon"]), float(sweep.cell_option(name, "delta", DEFAULT_DELTA)), n,
                            float(cell["epochs"]), grid + [int(b) for b in tried], min_steps=min_steps,
                            plateau_tol=plateau_tol,
                            norm_estimator=str(sweep.cell_option(name, "norm_estimator", "exact")),
                            sketch_k=None if sketch_k is None else int(float(sketch_k)))
        curve["tried"] = curve["batch_size"].isin([int(b) for b in tried])
        curve.insert(0, "cell_name", name)
        curve["dataset_size"] = n
        curves.append(curve)
    frame = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(
        columns=["cell_name", "batch_size", "sample_rate", "steps", "noise_multiplier", "noise_sqrt_steps",
                 "reason", "kept", "tried", "dataset_size"])
    return frame, notes


def min_step_floor(dataset_size: int, epochs: float, min_steps: int = MIN_STEPS) -> float:
    """The largest B with ⌈E·N/B⌉ ≥ min_steps, i.e. B < E·N/(min_steps − 1) (larger B: too few steps)."""
    if min_steps <= 1:
        return float(dataset_size)
    return float(min(dataset_size, math.ceil(epochs * dataset_size / (min_steps - 1)) - 1))
