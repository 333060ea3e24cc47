"""Matplotlib figures of the analysis (object API only: no pyplot state, any backend, any thread).

Every function takes the tables of :mod:`.results`, :mod:`.cumulative_noise` and :mod:`.gradnorms` and
returns a :class:`~matplotlib.figure.Figure`; :func:`save` writes PNG and SVG, :func:`png_base64`
embeds one in HTML. Awkward inputs (one C or one B, all trials errored, no finite value) give a
readable panel instead of an exception.
"""
from __future__ import annotations

import base64
import io
import math
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import NullLocator

from .optimal_clipping import ClipMSE, class_retention
from .gradnorms import QUANTILE_COLUMNS, retention_curves, retention_grid
from .cumulative_noise import min_step_floor
from .results import fmt
from ..schema import BATCH_SIZE, CLIP_BOUND, LEARNING_RATE

MAX_COLUMNS = 4
NONPRIVATE_NOTE = "NOT differentially private (computed from private training examples)"


def panel_grid(panels: int, width: float, height: float) -> tuple[Figure, list]:
    cols = max(1, min(panels, MAX_COLUMNS))
    rows = max(1, math.ceil(panels / cols))
    fig = Figure(figsize=(width * cols, height * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, axes[:panels]


def _edges(values: Sequence[float]) -> np.ndarray:
    """Cell edges on a log axis: geometric midpoints, ends mirrored (a factor 2 for one value)."""
    v = np.asarray(values, dtype=float)
    if len(v) == 1:
        return np.array([v[0] / 2, v[0] * 2])
    mid = np.sqrt(v[:-1] * v[1:])
    return np.concatenate([[v[0] ** 2 / mid[0]], mid, [v[-1] ** 2 / mid[-1]]])


def _log_ticks(axis, values: Sequence[float]) -> None:
    axis.set_ticks(list(values), labels=[fmt(float(v)) for v in values])
    axis.set_minor_locator(NullLocator())


def wrapped_text(title: str, width: int = 42) -> str:
    """Break a long cell name at its ' · ' separators."""
    lines, line = [], ""
    for part in title.split(" · "):
        candidate = f"{line} · {part}" if line else part
        if line and len(candidate) > width:
            lines.append(line)
            candidate = part
        line = candidate
    return "\n".join(lines + [line])


# -- heatmaps ------------------------------------------------------------------------------------
def heatmap_figure(table: pd.DataFrame, cells: pd.DataFrame, facet: str, *, across: str = "epsilon",
                   baseline: float | None = None, metric: str = "test accuracy",
                   lower_is_better: bool = False) -> Figure:
    """C × B heatmaps of the best value of the selected ``metric`` over η, one panel per cell of a
    facet (ordered by ``across``), on one colour scale (one colour bar: a colour means the same value
    in every panel; reversed where lower is better, so the bright end is always the better); the
    optimum is starred with its η; errored-only settings read "error"."""
    fig, axes = panel_grid(len(cells), 4.4, 3.9)
    shown = table[table["cell_name"].isin(cells["cell_name"])]
    values = shown["value"].to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if hi - lo < 1e-3:
        lo, hi = lo - 0.005, hi + 0.005
    meshes = [_heatmap_panel(ax, table[table["cell_name"] == cell["cell_name"]], cell["cell_name"], lo, hi,
                             lower=lower_is_better)
              for ax, (_, cell) in zip(axes, cells.iterrows())]
    meshes = [m for m in meshes if m is not None]
    if meshes and finite.size:
        fig.colorbar(meshes[0], ax=axes, label=f"best {metric} over η (all panels)", shrink=0.9)
    note = f"; non-private baseline {baseline:.3f}" if baseline is not None and math.isfinite(baseline) else ""
    outlined = "; dashed = not distinguishable from it" if bool(table.get("indistinguishable", pd.Series(
        dtype=bool)).any()) else ""
    fig.suptitle(f"{facet}: best {metric} over η for each (C, B), across {_axis_name(across)}\n"
                 f"★ = optimum (its η written){outlined}{note}", fontsize=11)
    return fig


def _axis_name(column: str) -> str:
    return {"epsilon": "ε", "epochs": "epochs"}.get(column, column)


def _heatmap_panel(ax, table: pd.DataFrame, title: str, lo: float, hi: float, lower: bool = False):
    """One cell's panel on the colour scale [lo, hi] (reversed where ``lower`` is better); returns its
    mesh (None: nothing drawn). The star marks the best ``score`` (the metric signed so that higher
    is better)."""
    cs = sorted(table[CLIP_BOUND].dropna().unique())
    bs = sorted(table[BATCH_SIZE].dropna().unique())
    ax.set_title(wrapped_text(title), fontsize=10)
    if not cs or not bs:
        ax.text(0.5, 0.5, "no (C, B) recorded", transform=ax.transAxes, ha="center", va="center")
        return None
    acc = np.full((len(bs), len(cs)), np.nan)
    score = np.full_like(acc, np.nan)
    errored = np.zeros_like(acc, dtype=bool)
    tied = np.zeros_like(acc, dtype=bool)   # not distinguishable from the optimum (uncertainty.py)
    eta = np.full_like(acc, np.nan)
    for _, r in table.iterrows():
        i, j = bs.index(r[BATCH_SIZE]), cs.index(r[CLIP_BOUND])
        acc[i, j], eta[i, j], errored[i, j] = r["value"], r[LEARNING_RATE], r["errored"] > 0
        score[i, j] = r["score"]
        tied[i, j] = bool(r.get("indistinguishable", False))
    finite = acc[np.isfinite(acc)]
    xe, ye = _edges(cs), _edges(bs)
    ax.set_facecolor("#e8e8e8")  # settings that were not run
    mesh = ax.pcolormesh(xe, ye, np.ma.masked_invalid(acc), cmap="viridis_r" if lower else "viridis", vmin=lo, vmax=hi,
                         edgecolors="white", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(xe[0], xe[-1])
    ax.set_ylim(ye[0], ye[-1])
    _log_ticks(ax.xaxis, cs)
    _log_ticks(ax.yaxis, bs)
    if len(cs) > 6:
        ax.tick_params(axis="x", labelrotation=45)
    ax.set_xlabel("clipping bound C")
    ax.set_ylabel("batch size B")
    size = 8 if max(len(cs), len(bs)) <= 6 else 6 if max(len(cs), len(bs)) <= 10 else 0
    def bright(value: float) -> bool:   # the colour under the text: black text on the bright end
        shade = (value - lo) / (hi - lo)
        return (1 - shade if lower else shade) > 0.6

    best = None
    if finite.size:  # ties go to the smaller C, then the smaller B (as in Sweep.optima)
        j_best, i_best = np.unravel_index(np.nanargmax(score.T), score.T.shape)
        best = (i_best, j_best)
    for i in range(len(bs)):
        for j in range(len(cs)):
            x, y = math.sqrt(xe[j] * xe[j + 1]), math.sqrt(ye[i] * ye[i + 1])
            if (i, j) == best:
                continue
            if tied[i, j]:
                ax.add_patch(Rectangle((xe[j], ye[i]), xe[j + 1] - xe[j], ye[i + 1] - ye[i], fill=False,
                                       edgecolor="#ff2d55", linewidth=1.4, linestyle="--"))
            if np.isfinite(acc[i, j]) and size:
                ax.text(x, y, f"{acc[i, j]:.3f}", ha="center", va="center", fontsize=size,
                        color="black" if bright(acc[i, j]) else "white")
            elif errored[i, j]:
                ax.text(x, y, "error", ha="center", va="center", fontsize=max(size, 6), color="#b00020")
    if best is None:
        ax.text(0.5, 0.97, "no finished trial in this cell", transform=ax.transAxes, ha="center", va="top",
                color="#b00020", bbox={"facecolor": "white", "edgecolor": "#b00020"})
        return mesh
    i, j = best
    ax.add_patch(Rectangle((xe[j], ye[i]), xe[j + 1] - xe[j], ye[i + 1] - ye[i], fill=False, edgecolor="#ff2d55",
                           linewidth=2.2))
    ax.text(math.sqrt(xe[j] * xe[j + 1]), math.sqrt(ye[i] * ye[i + 1]),
            f"★ {acc[i, j]:.3f}\nη={float(eta[i, j]):.2g}", ha="center", va="center", fontsize=max(size, 7),
            fontweight="bold", color="black" if bright(acc[i, j]) else "white")
    return mesh


def fixed_cost_figure(cost: pd.DataFrame, setting: tuple[float, float], eta_tuned: bool = True, *,
                      metric: str = "test accuracy", lower_is_better: bool = False) -> Figure:
    """Per private cell: its optimum against one global (C, B), with η tuned per cell (``eta_tuned``) or
    at each B's one η, in the selected ``metric`` (accuracy points, or its own units where lower is
    better)."""
    n = max(len(cost), 1)
    fig = Figure(figsize=(8.5, 1.6 + 0.45 * n), layout="constrained")
    ax = fig.subplots()
    y = np.arange(len(cost))
    ax.barh(y - 0.2, cost["value"], height=0.38, color="#2a9d8f", label="each cell's optimal (C, B, η)")
    ax.barh(y + 0.2, cost["fixed_value"].fillna(0), height=0.38, color="#e76f51",
            label=f"fixed C={fmt(setting[0])}, B={fmt(setting[1])} ({'η tuned' if eta_tuned else 'η not tuned'})")
    top = 1.0 if not lower_is_better else float(np.nanmax([cost["value"].max(), cost["fixed_value"].max()]))
    for k, (_, r) in enumerate(cost.iterrows()):
        worse = f"+{r['cost']:.3f}" if lower_is_better else f"−{100 * r['cost']:.1f} pts"
        text = "not run" if pd.isna(r["fixed_value"]) else worse if r["cost"] > 0 else "optimal"
        ax.text(max(r["value"], r["fixed_value"] if pd.notna(r["fixed_value"]) else 0, 0) + 0.01 * top, k,
                text, va="center", fontsize=8)
    ax.set_yticks(y, labels=[wrapped_text(c, 60) for c in cost["cell_name"]], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.12 * top)
    ax.set_xlabel(metric)
    ax.set_title(f"Cost of one fixed setting: C={fmt(setting[0])}, B={fmt(setting[1])} in every cell", fontsize=11)
    fig.legend(loc="outside lower center", ncol=2, fontsize=8)
    return fig


# -- noise curves --------------------------------------------------------------------------------
def noise_figure(curves: pd.DataFrame, cells: pd.DataFrame, facet: str, optima: pd.DataFrame, *,
                 min_steps: int, plateau_tol: float) -> Figure:
    """σ√T against B per cell: plateau band, minimum-step floor, recommended B, Bs tried, best B."""
    fig, axes = panel_grid(len(cells), 4.6, 3.5)
    for ax, (_, cell) in zip(axes, cells.iterrows()):
        curve = curves[curves["cell_name"] == cell["cell_name"]].sort_values(BATCH_SIZE)
        best = optima.loc[optima["cell_name"] == cell["cell_name"], BATCH_SIZE]
        _noise_panel(ax, curve, cell, best.iloc[0] if len(best) else None, min_steps, plateau_tol)
    if axes:
        handles, labels = axes[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="outside lower center", ncol=min(len(handles), 4), fontsize=8)
    fig.suptitle(f"{facet}: cumulative DP noise σ√T against the batch size B (fixed epochs)", fontsize=11)
    return fig


def _noise_panel(ax, curve: pd.DataFrame, cell: pd.Series, best_batch: float | None, min_steps: int,
                 plateau_tol: float) -> None:
    ax.set_title(wrapped_text(cell["cell_name"]), fontsize=10)
    ax.set_xscale("log")
    ax.set_xlabel("batch size B")
    ax.set_ylabel("σ√T")
    ok = curve[np.isfinite(curve["noise_sqrt_steps"])]
    if ok.empty:
        ax.text(0.5, 0.5, "no calibrated σ", transform=ax.transAxes, ha="center", va="center")
        return
    n, epochs = int(curve["dataset_size"].iloc[0]), float(cell["epochs"])
    ax.plot(ok[BATCH_SIZE], ok["noise_sqrt_steps"], "-", color="#264653", linewidth=1.2, zorder=2)
    kept = ok[ok["kept"]]
    dropped = ok[~ok["kept"]]
    ax.scatter(dropped[BATCH_SIZE], dropped["noise_sqrt_steps"], facecolors="white", edgecolors="#264653",
               zorder=3, label="dropped B")
    ax.scatter(kept[BATCH_SIZE], kept["noise_sqrt_steps"], color="#2a9d8f", zorder=3, label="kept B (plateau)")
    tried = ok[ok["tried"]]
    ax.scatter(tried[BATCH_SIZE], tried["noise_sqrt_steps"], marker="x", color="#e76f51", s=60, zorder=4,
               label="B tried in the sweep")
    eligible = ok[ok["steps"] >= min_steps]
    if len(eligible):
        floor = eligible["noise_sqrt_steps"].min()
        ax.axhspan(floor, floor * (1 + plateau_tol), color="#2a9d8f", alpha=0.18,
                   label=f"plateau: ≤ {1 + plateau_tol:g} × min σ√T")
    if len(kept):
        rec = kept.iloc[0]
        ax.scatter([rec[BATCH_SIZE]], [rec["noise_sqrt_steps"]], marker="*", s=220, color="#f4a261",
                   edgecolors="black", zorder=5, label="recommended B (smallest kept)")
    b_max = min_step_floor(n, epochs, min_steps)
    right = ok[BATCH_SIZE].max() * 1.5
    if b_max < right:
        ax.axvspan(max(b_max, ok[BATCH_SIZE].min() / 1.5), right, color="grey", alpha=0.15,
                   label=f"T < {min_steps} steps (minimum-step floor)")
        ax.axvline(b_max, color="grey", linestyle="--", linewidth=1)
    if best_batch is not None and np.isfinite(best_batch):
        ax.axvline(best_batch, color="#e76f51", linestyle=":", linewidth=1.5, label="best B by accuracy")
    ax.set_xlim(ok[BATCH_SIZE].min() / 1.5, right)
    ax.set_ylim(0, ok["noise_sqrt_steps"].max() * 1.1)
    bs = ok[BATCH_SIZE].tolist()
    planned = ok.loc[ok["planned"], BATCH_SIZE].tolist() if "planned" in ok else []
    if 0 < len(planned) <= 12:  # every B the sweep's plan listed is labelled
        shown = planned
    else:
        shown = bs if len(bs) <= 8 else bs[:: math.ceil(len(bs) / 8)]
    _log_ticks(ax.xaxis, shown)
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)


# -- gradient norms (non-private) ----------------------------------------------------------------
def gradnorm_figure(norms: pd.DataFrame, cells: pd.DataFrame, facet: str, *, across: str = "epsilon") -> Figure:
    """Per-class norm distributions (10–90% whiskers, 25–75% bars, median) and the share of each
    class clipped at the cell's optimal C, one colour per cell of the facet."""
    fig = Figure(figsize=(13, 5), layout="constrained")
    dist, share = fig.subplots(1, 2, width_ratios=[3, 2])
    labels = sorted(norms["label"].unique())
    x = {label: k for k, label in enumerate(labels)}
    k_cells = max(len(cells), 1)
    width = 0.8 / k_cells
    thick = 5 if len(labels) * k_cells <= 60 else 2
    for k, (_, cell) in enumerate(cells.iterrows()):
        rows = norms[norms["cell_name"] == cell["cell_name"]]
        if rows.empty:
            continue
        colour = f"C{k % 10}"
        name = f"{_axis_name(across)}={fmt(cell[across])}"
        pos = np.array([x[label] for label in rows["label"]]) + (k - (k_cells - 1) / 2) * width
        q10, q25, q50, q75, q90 = (rows[c].to_numpy() for c in QUANTILE_COLUMNS)
        dist.vlines(pos, q10, q90, color=colour, linewidth=1)
        dist.vlines(pos, q25, q75, color=colour, linewidth=thick)
        dist.scatter(pos, q50, color="white", edgecolors=colour, s=14, zorder=3)
        clip = rows[CLIP_BOUND].iloc[0]
        dist.axhline(clip, color=colour, linestyle="--", linewidth=0.9)
        share.bar(pos, rows["clipped_fraction"], width=width, color=colour, label=f"{name} (optimal C={fmt(clip)})")
    every = math.ceil(len(labels) / 30) if labels else 1  # at most 30 tick labels
    for ax in (dist, share):
        ax.set_xticks(range(0, len(labels), every), labels=[str(v) for v in labels[::every]], fontsize=8)
        ax.set_xlabel("class")
    dist.set_yscale("log")
    dist.set_ylabel("per-sample gradient norm ‖g_i‖")
    dist.set_title("norm distribution per class (dashed: the cell's optimal C)", fontsize=10)
    share.set_ylim(0, 1.05)
    share.set_ylabel("share of examples clipped")
    share.set_title("share clipped per class at the cell's optimal C", fontsize=10)
    handles, names = share.get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="outside lower center", ncol=min(len(handles), 6), fontsize=8)
    fig.suptitle(f"{facet}: per-class gradient norms at each cell's optimum\n{NONPRIVATE_NOTE}", fontsize=11)
    return fig


def retention_figure(norms: pd.DataFrame, cells: pd.DataFrame, facet: str) -> Figure:
    """w_y(C) against C per class, one panel per cell, the cell's optimal C marked."""
    fig, axes = panel_grid(len(cells), 4.4, 3.4)
    grid = retention_grid(norms)
    curves = retention_curves(norms, grid)
    labels = sorted(norms["label"].unique())
    colours = {label: f"C{k % 10}" if len(labels) <= 10 else colormaps["viridis"](k / max(len(labels) - 1, 1))
               for k, label in enumerate(labels)}
    for ax, (_, cell) in zip(axes, cells.iterrows()):
        ax.set_title(wrapped_text(cell["cell_name"]), fontsize=10)
        c = curves[curves["cell_name"] == cell["cell_name"]]
        for label, per_class in c.groupby("label"):
            ax.plot(per_class[CLIP_BOUND], per_class["retention"], color=colours[label], linewidth=1.1,
                    label=str(label))
        clip = norms.loc[norms["cell_name"] == cell["cell_name"], CLIP_BOUND]
        if len(clip):
            ax.axvline(clip.iloc[0], color="black", linestyle="--", linewidth=1)
            ax.text(clip.iloc[0], 0.02, f" optimal C={fmt(clip.iloc[0])}", fontsize=8, va="bottom")
        else:
            ax.text(0.5, 0.5, "no gradient-norm statistics", transform=ax.transAxes, ha="center", va="center")
        ax.set_xscale("log")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("clipping bound C")
        ax.set_ylabel("retention w_y(C)")
    if axes and len(labels) <= 10:
        handles, names = axes[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, names, loc="outside right center", title="class", fontsize=8)
    fig.suptitle(f"{facet}: retention weights w_y(C) = mean over class y of min(1, C/‖g_i‖)\n{NONPRIVATE_NOTE}",
                 fontsize=11)
    return fig


# -- C* from per-sample gradients ----------------------------------------------------------------
def clip_mse_figure(curve: ClipMSE, norms: np.ndarray, labels: np.ndarray, *, trial_clip: float | None = None,
                    title: str = "") -> Figure:
    """MSE(C) with its bias and noise terms and C* (left); per-class retention w_y(C) (right)."""
    c_star = curve.argmin()
    positive = norms[norms > 0]
    lo = (positive.min() if positive.size else 1e-3) / 10
    hi = (positive.max() if positive.size else 1.0) * 5
    marks = [v for v in (c_star, trial_clip) if v]
    grid = np.logspace(np.log10(min([lo] + [m / 3 for m in marks])), np.log10(max([hi] + [m * 3 for m in marks])),
                       400)
    fig = Figure(figsize=(12, 4.4), layout="constrained")
    left, right = fig.subplots(1, 2)
    left.plot(grid, curve(grid), color="black", linewidth=1.6, label="MSE(C)")
    left.plot(grid, curve.bias(grid), color="#e76f51", linewidth=1, label="clipping bias ‖Σḡ_i − Σg_i‖²")
    left.plot(grid, curve.noise(grid), color="#2a9d8f", linewidth=1, label="noise σ²C²d")
    left.scatter([c_star], [curve(c_star)], marker="*", s=200, color="#f4a261", edgecolors="black", zorder=5,
                 label=f"C* = {c_star:.4g}")
    if trial_clip:
        left.axvline(trial_clip, color="grey", linestyle="--", label=f"trial's C = {fmt(trial_clip)}")
    left.set_xscale("log")
    left.set_yscale("log")
    values = curve(grid)[curve(grid) > 0]
    if values.size:  # the bias drops to 0 past the largest norm: show three decades below the minimum
        left.set_ylim(values.min() / 1e3, values.max() * 2)
    left.set_xlabel("clipping bound C")
    left.set_ylabel("MSE of the noisy clipped sum")
    left.set_title(f"MSE(C), σ = {curve.noise_multiplier:.4g}, d = {curve.dim:,}, n = {len(norms)}", fontsize=10)
    left.legend(fontsize=8)
    classes = sorted(np.unique(labels).tolist())
    coarse = grid[::8]
    retained = [class_retention(norms, labels, c) for c in coarse]
    for k, label in enumerate(classes):
        colour = f"C{k % 10}" if len(classes) <= 10 else colormaps["viridis"](k / (len(classes) - 1))
        right.plot(coarse, [w[label] for w in retained], color=colour, linewidth=1.1, label=str(label))
    right.axvline(c_star, color="black", linestyle="-", label="C*")
    if trial_clip:
        right.axvline(trial_clip, color="grey", linestyle="--", label="trial's C")
    right.set_xscale("log")
    right.set_ylim(0, 1.05)
    right.set_xlabel("clipping bound C")
    right.set_ylabel("retention w_y(C)")
    right.set_title("per-class retention at this batch's norms", fontsize=10)
    if len(classes) <= 12:
        right.legend(fontsize=7, ncol=2, title="class")
    fig.suptitle((title + "\n" if title else "") + f"Optimal clipping (Theorem 5.2): {NONPRIVATE_NOTE}",
                 fontsize=11)
    return fig


# -- output --------------------------------------------------------------------------------------
#: Rounds of growing a figure whose text still runs off its canvas once wrapped.
FIT_ROUNDS = 6


def outside(fig: Figure, dpi: float) -> list[tuple[str, float, float]]:
    """What of ``fig`` drawn at ``dpi`` runs off its canvas, by matplotlib's own tight bounding boxes: each
    title and figure text, and each axes with its tick labels, axis labels and legend: (what, how much
    wider and how much taller the canvas would have to be, as factors ≥ 1)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig.set_dpi(dpi)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    parts = [(t.get_text(), t.get_window_extent(renderer)) for t in [*fig.texts, *(ax.title for ax in fig.axes)]
             if t.get_visible() and t.get_text().strip()]
    parts += [(f"axes {ax.get_title() or i}", ax.get_tightbbox(renderer)) for i, ax in enumerate(fig.axes)
              if ax.get_visible()]
    out = []
    for what, box in parts:
        if box is None:
            continue
        over_x = max(0.0, -box.x0, box.x1 - width)
        over_y = max(0.0, -box.y0, box.y1 - height)
        if over_x > 0.5 or over_y > 0.5:
            out.append((what, (width + 2 * over_x) / width, (height + 2 * over_y) / height))
    return out


def fit_text(fig: Figure, dpi: float) -> None:
    """Every text of ``fig`` inside its canvas: its titles wrap at the canvas' edge (matplotlib's own
    wrapping), and where a text still runs off — a label, a word longer than the line — the figure grows
    until it fits. Called before a figure is written, so a long title never loses its ends."""
    for text in [*fig.texts, *(ax.title for ax in fig.axes)]:   # titles wrap (not labels, ticks, legends)
        text.set_wrap(True)
    for _ in range(FIT_ROUNDS):
        runs_off = outside(fig, dpi)
        if not runs_off:
            return
        wider = max(x for _, x, _ in runs_off)
        taller = max(y for _, _, y in runs_off)
        w, h = fig.get_size_inches()
        fig.set_size_inches(w * min(wider * 1.05, 2.0), h * min(taller * 1.05, 2.0))


def save(fig: Figure, stem: Path, formats: Sequence[str] = ("png", "svg"), dpi: int = 130) -> list[Path]:
    """Write ``stem.png`` and ``stem.svg`` (or the given formats), their text fitted to the canvas
    (:func:`fit_text`); returns the paths."""
    fit_text(fig, dpi)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in formats:
        path = stem.with_suffix(f".{ext}")
        fig.savefig(path, dpi=dpi)
        paths.append(path)
    return paths


def png_base64(fig: Figure, dpi: int = 110) -> str:
    """The figure as a base64 PNG for an ``<img src="data:image/png;base64,…">``, its text fitted
    to the canvas (:func:`fit_text`)."""
    fit_text(fig, dpi)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return base64.b64encode(buffer.getvalue()).decode("ascii")
