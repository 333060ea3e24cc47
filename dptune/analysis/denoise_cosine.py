"""The ``denoise_cosine`` diagnostic in the report: does RMT denoising bring ĝ closer to the signal?

Trials run with ``trial: {diagnostics: [denoise_cosine]}`` store, per epoch, the mean over (2-D
layer, step) pairs of cos(ĝ, ḡ) and cos(rmt(ĝ), ḡ), ḡ being the step's clipped mean before noise,
and over the pairs whose gate opened the share whose cosine improved and the mean gain
("Re-examining low-rank adaptation for private LLM fine-tuning" claims it never decreases). ḡ is
computed from private examples: everything here is **NOT differentially private**.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from .results import Sweep

#: Epoch-row columns the diagnostic writes (``dptune.trainables.engine.denoise.COSINE_METRICS``).
COSINE_COLUMNS = ("nonprivate_cos_noisy", "nonprivate_cos_denoised", "nonprivate_cos_gain",
                  "nonprivate_cos_improved", "nonprivate_cos_gate_rate", "nonprivate_cos_rank",
                  "nonprivate_cos_shrinkage")


def cosine_curves(sweep: Sweep, epochs: pd.DataFrame) -> pd.DataFrame:
    """Per (cell, epoch): the diagnostic's columns averaged over the cell's trials that recorded it
    (finished or stopped), and ``trials``, how many did. Empty when no trial ran the diagnostic."""
    columns = ["cell_name", "epoch", "trials", *COSINE_COLUMNS]
    if epochs.empty or "nonprivate_cos_noisy" not in epochs:
        return pd.DataFrame(columns=columns)
    e = epochs[epochs["nonprivate_cos_noisy"].notna()]
    cells = sweep.trials[["trial_id", "cell_name"]].astype({"trial_id": str})
    e = e.astype({"trial_id": str}).merge(cells, on="trial_id")
    if e.empty:
        return pd.DataFrame(columns=columns)
    for column in COSINE_COLUMNS:
        if column not in e:
            e[column] = float("nan")
    grouped = e.groupby(["cell_name", "epoch"])
    out = grouped[list(COSINE_COLUMNS)].mean().reset_index()
    out.insert(2, "trials", grouped["trial_id"].nunique().to_numpy())
    return out[columns].sort_values(["cell_name", "epoch"], ignore_index=True)


def cosine_figure(curves: pd.DataFrame, *, max_cells: int = 12) -> Figure:
    """One panel per cell: cos(ĝ, ḡ) and cos(rmt(ĝ), ḡ) per epoch (left axis), and the gate-open
    share and the share of gate-open pairs whose cosine improved (right axis, dotted)."""
    from .figures import NONPRIVATE_NOTE, panel_grid, wrapped_text

    names = list(dict.fromkeys(curves["cell_name"]))[:max_cells]
    fig, axes = panel_grid(len(names), 4.2, 3.0)
    legend: list = []
    for ax, name in zip(axes, names):
        c = curves[curves["cell_name"] == name]
        ax.plot(c["epoch"], c["nonprivate_cos_noisy"], "o-", color="C0", label="cos(ĝ, ḡ): as trained")
        ax.plot(c["epoch"], c["nonprivate_cos_denoised"], "s--", color="C3", label="cos(rmt(ĝ), ḡ)")
        ax.set_ylim(min(0.0, float(c[["nonprivate_cos_noisy", "nonprivate_cos_denoised"]].min().min())), 1.0)
        ax.set_xlabel("epoch")
        ax.set_ylabel("cosine to the clipped mean ḡ")
        share = ax.twinx()
        share.plot(c["epoch"], c["nonprivate_cos_gate_rate"], ":", color="grey", label="gate open (share)")
        share.plot(c["epoch"], c["nonprivate_cos_improved"], ":", color="C2", marker=".",
                   label="improved, of gate-open")
        share.set_ylim(0, 1.05)
        share.set_ylabel("share of (layer, step) pairs", fontsize=8)
        ax.set_title(wrapped_text(str(name)), fontsize=9)
        legend = legend or [*ax.get_legend_handles_labels()[0], *share.get_legend_handles_labels()[0]]
    if legend:
        fig.legend(legend, [h.get_label() for h in legend], loc="outside lower center", ncol=4, fontsize=8)
    fig.suptitle(f"RMT denoising: cosine to the pre-noise clipped mean, per epoch\n{NONPRIVATE_NOTE}", fontsize=11)
    return fig
