"""`dptune heatmap` and `dptune report`: figure files, and one self-contained HTML page.

The report embeds every figure as a base64 PNG, so the single ``report.html`` can be mailed or
archived. Sections: the sweep summary, the optimal (C, B, η) per cell with the cost of one fixed
setting, the heatmaps, the σ√T noise curves, the per-class gradient norms and retention weights
(labelled NOT differentially private), and the errored trials.
"""
from __future__ import annotations

import datetime as _dt
import html
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, TextIO

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..errors import UserError
from ..platform.store.layout import ExperimentPaths
from ..platform.store.results_store import ResultsStore
from ..schema import BATCH_SIZE, CLIP_BOUND, LEARNING_RATE, shown
from . import figures
from .denoise_cosine import cosine_curves, cosine_figure
from .gradnorms import QUANTILE_COLUMNS, class_norms
from .cumulative_noise import MIN_STEPS, PLATEAU_TOL, cell_noise_curves
from .results import Sweep, eta_note, fmt
from .uncertainty import ALPHA, SINGLE_SEED, fixed_setting_lines, with_error_bars


@dataclass
class Analysis:
    """Every table the figures and the report are drawn from."""

    sweep: Sweep
    across: str
    heatmap: pd.DataFrame
    optima: pd.DataFrame
    fixed_setting: tuple[float, float] | None
    fixed_cost: pd.DataFrame | None
    notes: list[str] = field(default_factory=list)
    noise_curves: pd.DataFrame | None = None
    norms: pd.DataFrame | None = None
    cosines: pd.DataFrame | None = None   # the denoise_cosine diagnostic per (cell, epoch); NOT private
    min_steps: int = MIN_STEPS            # the pruning rules the noise curves are drawn with
    plateau_tol: float = PLATEAU_TOL
    rules: str = "the pruning rules' defaults (no saved plan)"   # where they come from
    audits: list[dict] = field(default_factory=list)   # `dptune audit` results kept for its trials
    comparisons: list[str] = field(default_factory=list)  # between-cell statements on the optimal C


#: How the note on a missing fixed-setting chart begins (it says why there is none).
FIXED_NOTE = "no chart of the cost of a fixed setting"


def _fixed_note(a: "Analysis") -> str | None:
    return next((n for n in a.notes if n.startswith(FIXED_NOTE)), None)


def analyse(store: ResultsStore, *, across: str = "epsilon", fixed: tuple[float, float] | None = None,
            noise: bool = True, noise_batch_sizes: Sequence[int] | None = None, min_steps: int | None = None,
            plateau_tol: float | None = None, gradnorms: bool = True) -> Analysis:
    """Read the store and compute the tables (noise curves and gradient norms on request).

    The noise curves use the pruning rules and the batch sizes of the plan the sweep ran (saved
    beside the store), unless ``min_steps``/``plateau_tol``/``noise_batch_sizes`` are given; a store
    without a saved plan gets the rules' defaults."""
    sweep = Sweep.from_store(store)
    if sweep.trials.empty:
        raise UserError(f"the results store at {store.root!r} has no trials yet")
    if across not in sweep.cell_columns:
        raise UserError(f"--across must be one of {', '.join(sweep.cell_columns)}; got {across!r}")
    heatmap, optima, comparisons = with_error_bars(sweep, sweep.heatmap_table(), sweep.optima(), across)
    result = Analysis(sweep, across, heatmap, optima, None, None, comparisons=comparisons)
    if comparisons == [SINGLE_SEED]:
        result.notes.append(SINGLE_SEED)
    try:
        result.fixed_setting, result.fixed_cost = sweep.fixed_setting_cost(*(fixed or (None, None)))
        result.comparisons += fixed_setting_lines(heatmap, result.fixed_cost, result.fixed_setting,
                                                  metric=sweep.metric_label, lower_is_better=sweep.lower_is_better)
        complete, tried = sweep.fixed_setting_pool()
        if not fixed and complete < tried:
            result.comparisons.append(
                f"the fixed setting is the best of the {complete} (C, B) with a result (or stopped by multi-fidelity) "
                f"in every cell; the other {tried - complete} errored or were not run in some cell and are not compared")
    except ValueError as exc:
        if fixed:
            raise
        result.notes.append(f"{FIXED_NOTE}: {exc}")
    paths = ExperimentPaths.find(store.root)
    plan = paths.saved_plan() or {}
    result.audits = paths.saved_audits()
    brackets = paths.saved_bracketing()
    if brackets and "cell" in result.optima:
        result.optima["bracketing"] = [bracketing_text(brackets.get(key)) for key in result.optima["cell"]]
        result.optima["racing"] = [racing_text(brackets.get(key)) for key in result.optima["cell"]]
    pruning = plan.get("pruning", {})
    if pruning:
        result.rules = "the sweep's own pruning rules (from its saved plan)"
    if min_steps is not None or plateau_tol is not None:
        result.rules = "the rules given to the report"
    result.min_steps = int(min_steps if min_steps is not None else pruning.get("min_steps", MIN_STEPS))
    result.plateau_tol = float(plateau_tol if plateau_tol is not None else pruning.get("plateau_tol", PLATEAU_TOL))
    if noise:
        result.noise_curves, notes = cell_noise_curves(sweep, batch_sizes=noise_batch_sizes,
                                                       min_steps=result.min_steps, plateau_tol=result.plateau_tol,
                                                       planned=planned_batch_sizes(sweep, plan))
        result.notes += notes
    if gradnorms:
        result.norms = class_norms(sweep, store.table("gradnorms"))
    result.cosines = cosine_curves(sweep, store.table("epochs"))
    return result


def planned_batch_sizes(sweep: Sweep, plan: dict) -> dict[str, list[int]]:
    """{report cell name: every candidate B the sweep's plan listed for it} (the plan keys cells
    as the store's ``cell`` column does)."""
    cells = plan.get("cells", {})
    if not cells or "cell" not in sweep.trials:
        return {}
    listed: dict[str, set[int]] = {}
    for name, key in sweep.trials[["cell_name", "cell"]].drop_duplicates().itertuples(index=False):
        listed.setdefault(name, set()).update(cells.get(key, {}).get("batch_sizes", ()))
    return {name: sorted(bs) for name, bs in listed.items() if bs}


def _slug(text: str) -> str:
    text = text.replace("ε", "eps").replace("∞", "inf").replace(" epochs", "ep").replace(" epoch", "ep")
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", text).strip("_") or "all"


def _baseline_for(a: Analysis, cell: pd.Series) -> float | None:
    """The selected metric's best value in the cell's non-private sibling (same cell, ε = ∞), if run."""
    rest = [c for c in a.sweep.cell_columns if c != "epsilon"]
    key = tuple(cell[c] for c in rest)
    for _, other in a.optima[~a.optima["private"]].iterrows():
        if tuple(other[c] for c in rest) == key and pd.notna(other["value"]):
            return float(other["value"])
    return None


def heatmap_figures(a: Analysis) -> list[tuple[str, Figure]]:
    """(facet name, figure) for every group of private cells across ``a.across``."""
    out = []
    for facet, cells in a.sweep.facets(a.across):
        baseline = _baseline_for(a, cells.iloc[0]) if a.across == "epsilon" else None
        out.append((facet, figures.heatmap_figure(a.heatmap, cells, facet, across=a.across, baseline=baseline,
                                                  metric=a.sweep.metric_label,
                                                  lower_is_better=a.sweep.lower_is_better)))
    return out


def noise_figures(a: Analysis) -> list[tuple[str, Figure]]:
    """(facet name, σ√T-against-B figure) for every group of cells with noise curves."""
    if a.noise_curves is None or a.noise_curves.empty:
        return []
    out = []
    for facet, cells in a.sweep.facets(a.across):
        cells = cells[cells["cell_name"].isin(a.noise_curves["cell_name"])]
        if not cells.empty:
            out.append((facet, figures.noise_figure(a.noise_curves, cells, facet, a.optima, min_steps=a.min_steps,
                                                    plateau_tol=a.plateau_tol)))
    return out


def gradnorm_figures(a: Analysis) -> list[tuple[str, Figure, Figure]]:
    """(facet name, per-class norm distributions, retention w_y(C)) for every group of cells with
    gradient-norm statistics (NOT differentially private)."""
    if a.norms is None or a.norms.empty:
        return []
    out = []
    for facet, cells in a.sweep.facets(a.across):
        cells = cells[cells["cell_name"].isin(a.norms["cell_name"])]
        if not cells.empty:
            out.append((facet, figures.gradnorm_figure(a.norms, cells, facet, across=a.across),
                        figures.retention_figure(a.norms, cells, facet)))
    return out


def optimum_lines(optima: pd.DataFrame, comparisons: Sequence[str] = (), metric: str = "accuracy") -> list[str]:
    """One line per cell: its optimal (C, B, η) and value (of the selected ``metric``, as
    :attr:`Sweep.metric_label` names it), with its error bar where seeds allow; then the between-cell
    statements (or the one line saying a single seed cannot tell)."""
    lines = []
    for _, r in optima.iterrows():
        if pd.isna(r["value"]):
            lines.append(f"{r['cell_name']}: no finished trial")
            continue
        clip = f"C={fmt(r[CLIP_BOUND])}" if r["private"] else "no clipping"
        line = (f"{r['cell_name']}: {clip}, B={fmt(r[BATCH_SIZE])}, η={fmt(r[LEARNING_RATE])}: "
                f"{metric} {r['value']:.4f} (mean of {int(r['seeds'])} seed(s))")
        if pd.notna(r.get("value_low")):
            line += (f", {1 - ALPHA:.0%} interval [{r['value_low']:.4f}, {r['value_high']:.4f}]; "
                     f"{int(r['indistinguishable'])} setting(s) not distinguishable from it, C in "
                     f"[{fmt(r['clip_bound_min'])}, {fmt(r['clip_bound_max'])}], B in "
                     f"[{fmt(r['batch_size_min'])}, {fmt(r['batch_size_max'])}]")
            if r.get("stopped"):   # no test: the scheduler excluded them, not the t-test
                line += (f"; {int(r['stopped'])} other(s) stopped by multi-fidelity at rung {r['stopped_rungs']} "
                         "(they lost there: excluded by the scheduler, not by a test)")
        bracketing = r.get("bracketing") if isinstance(r.get("bracketing"), str) else ""
        if r.get("grid_edge") and bracketing.startswith("stopped"):
            line += f"; on the edge of the values searched ({r['grid_edge']}): bracketing {bracketing}"
        elif r.get("grid_edge"):
            line += f"; on the edge of the grid searched ({r['grid_edge']}): the optimum may lie beyond it"
        elif bracketing:
            line += f"; {bracketing}"
        if isinstance(r.get("racing"), str) and r["racing"]:
            line += f"; {r['racing']}"
        lines.append(line)
    return lines + list(comparisons)


def bracketing_text(record: dict | None) -> str:
    """A cell's bracketing as the closing lines, optima.csv and the report say it: "bracketed" (with
    the trials it added), "stopped …" naming the rule per axis, or "" where the sweep kept none."""
    if not record:
        return ""
    added = int(record.get("added", 0)) * int(record.get("seeds", 1))
    extra = f" (+{added} trial{'s' if added != 1 else ''} beyond the grid)" if added else ""
    outcome = str(record.get("outcome", ""))
    if outcome == "bracketed":
        return "bracketed" + extra
    if outcome.startswith("stopped"):
        return outcome + extra
    return "bracketing unfinished" + extra


def racing_text(record: dict | None) -> str:
    """A cell's racing as the closing lines and optima.csv say it: the contenders of each round and
    the seeds they reached, the trials it added, the looks its tests are corrected for; "" unraced."""
    racing = (record or {}).get("racing")
    if not racing:
        return ""
    contenders = " → ".join(str(n) for n in racing.get("contenders", []))
    admitted = racing.get("admitted", racing.get("contenders", []))
    given = "" if admitted == racing.get("contenders") else f" (within the budget {' → '.join(map(str, admitted))})"
    rounds = (f"contenders {contenders}{given} given more seeds, up to {racing['seeds']} seeds" if contenders
              else "no contender to race")
    left = racing.get("left_out", 0)
    budget = (f"; {left} contender(s) left on fewer seeds by the budget of {racing.get('allowance')} full trials"
              if left else "")
    return (f"raced: {rounds} (+{racing.get('added', 0)} trials; tests corrected for {racing['looks']} looks{budget})"
            + ("" if racing.get("settled") else ", unfinished"))


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    """A table as CSV, with float columns that hold only whole numbers (B, seeds, C = 10) written
    as whole numbers (``64``, not ``64.0``)."""
    frame = frame.copy()
    for column in frame.columns:
        values = frame[column]
        if pd.api.types.is_float_dtype(values):
            finite = values.dropna()
            if len(finite) and np.isfinite(finite).all() and (finite == np.round(finite)).all():
                frame[column] = values.astype("Int64")
    frame.to_csv(path, index=False)


def write_heatmaps(store: ResultsStore, out_dir: str | Path, *, across: str = "epsilon",
                   fixed: tuple[float, float] | None = None, out: TextIO | None = None) -> list[Path]:
    """Heatmaps (PNG and SVG) per facet, the fixed-setting cost chart, and their tables as CSV;
    with ``out``, also print each cell's optimum there."""
    a = analyse(store, across=across, fixed=fixed, noise=False, gradnorms=False)
    for line in optimum_lines(a.optima, a.comparisons, a.sweep.metric_label) if out is not None else ():
        print(line, file=out)
    printing, out = out, Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for facet, fig in heatmap_figures(a):
        paths += figures.save(fig, out / f"heatmap_{_slug(facet)}")
    write_csv(a.heatmap, out / "heatmap.csv")
    write_csv(a.optima, out / "optima.csv")
    paths += [out / "heatmap.csv", out / "optima.csv"]
    if a.fixed_cost is not None:
        paths += figures.save(_fixed_cost_figure(a), out / "fixed_setting_cost")
        write_csv(a.fixed_cost, out / "fixed_setting_cost.csv")
        paths.append(out / "fixed_setting_cost.csv")
    elif printing and _fixed_note(a):
        print(_fixed_note(a), file=printing)
    return paths


# -- HTML ----------------------------------------------------------------------------------------
STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #1d2433;
       background: #f6f7f9; line-height: 1.45; }
main { max-width: 1280px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { margin: 0 0 4px; font-size: 26px; } h2 { margin-top: 40px; border-bottom: 2px solid #d8dde6;
     padding-bottom: 4px; } h3 { margin: 24px 0 8px; font-size: 16px; }
.meta { color: #5b6475; margin: 0 0 12px; }
nav a { margin-right: 14px; color: #2457c5; text-decoration: none; }
table { border-collapse: collapse; background: white; font-size: 13px; margin: 8px 0 16px;
        box-shadow: 0 1px 2px rgba(0,0,0,.06); }
th, td { padding: 5px 10px; border-bottom: 1px solid #e4e7ec; text-align: left; white-space: nowrap; }
th { background: #eef1f6; position: sticky; top: 0; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
td.wrap { white-space: normal; max-width: 560px; } #summary + .scroll td.wrap { max-width: 220px; }
figure { margin: 12px 0 24px; background: white; padding: 12px; box-shadow: 0 1px 2px rgba(0,0,0,.06); }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { color: #5b6475; font-size: 13px; margin-top: 6px; }
.nonprivate { border-left: 5px solid #d97706; padding-left: 16px; }
.badge { background: #d97706; color: white; font-size: 12px; padding: 2px 8px; border-radius: 10px;
         vertical-align: middle; margin-left: 8px; }
.warning { background: #fff4e0; border: 1px solid #f3c98b; padding: 8px 12px; border-radius: 4px; }
.note { color: #5b6475; font-size: 13px; }
.scroll { overflow-x: auto; }
"""


def _table(frame: pd.DataFrame, wrap: Sequence[str] = ()) -> str:
    """An HTML table (everything escaped); numeric columns right-aligned, ``wrap`` columns wrapped."""
    texts = frame.apply(lambda column: column.map(_cell_text)) if len(frame) else frame
    style = {c: "num" if len(texts) and texts[c].map(_numeric).all() else "wrap" if c in wrap else ""
             for c in frame.columns}

    def attr(column: str) -> str:
        return f' class="{style[column]}"' if style[column] else ""

    head = "".join(f"<th{attr(c)}>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td{attr(c)}>{html.escape(v)}</td>" for c, v in zip(frame.columns, row))
                   + "</tr>" for row in texts.itertuples(index=False))
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?( pts)?|∞|—")


def _numeric(text: str) -> bool:
    """A number, a number of points, ∞, or a dash for a missing number."""
    return NUMBER.fullmatch(text) is not None


def _cell_text(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, (float, np.floating)):
        return fmt(float(value)) if float(value).is_integer() or math.isinf(value) else f"{value:.4g}"
    return str(value)


def _acc(value: object) -> str:
    return "—" if value is None or pd.isna(value) else f"{float(value):.3f}"


def _figure_html(fig: Figure, alt: str, caption: str) -> str:
    return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{figures.png_base64(fig)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _summary_section(a: Analysis) -> str:
    s = a.sweep.summary().drop(columns=["best accuracy", "median accuracy"])
    for col in ("best value", "median value"):
        s[col] = s[col].map(_acc)
    name = a.sweep.metric_name   # the table names the metric it holds
    s = s.rename(columns={"best value": f"best {name}", "median value": f"median {name}"})
    train_time = shown("train time (s)", "train_time_s")
    if train_time in s:
        s[train_time] = s[train_time].map(lambda v: f"{v:.1f}")
    note = ("<p class='note'>Trials run with reproducible randomness drew their batches and noise from "
            "the spec's seeds: anyone holding the spec can regenerate the noise, so their models are NOT "
            "for release (rerun the chosen setting with <code>trial: {randomness: secure}</code>).</p>"
            if s["randomness"].str.contains("NOT for release").any() else "")
    return "<h2 id='summary'>Sweep summary</h2>" + _table(s, wrap=("cell", "C", "B", "η", "randomness")) + note


def _private_selection_section(a: Analysis) -> str:
    """Private selection ("Hyperparameter Tuning with Renyi Differential Privacy", Papernot & Steinke,
    ICLR 2022): per cell, K drawn, per-trial and total ε, the released trial and its test accuracy."""
    t = a.sweep.trials
    if "selection_k" not in t or t["selection_k"].isna().all():
        return ""
    rows = []
    for cell, group in t[t["selection_k"].notna()].groupby("cell_name", sort=True):
        chosen = group[group["selected"].fillna(False).astype(bool)] if "selected" in group else group.iloc[:0]
        r = chosen.iloc[0] if len(chosen) else None
        ended = group[(group["status"] == "finished") & group["selection_score"].notna()]
        rows.append({"cell": cell, "K": int(group["selection_k"].iloc[0]), "ended": len(ended),
                     "per-trial ε": _cell_text(group["trial_epsilon"].max()),
                     "total ε": _cell_text(group["total_epsilon"].max()),
                     "released trial": "— (not released)" if r is None else r["trial_id"],
                     "C": "—" if r is None else _cell_text(r[CLIP_BOUND]),
                     "B": "—" if r is None else _cell_text(r[BATCH_SIZE]),
                     "η": "—" if r is None else _cell_text(r[LEARNING_RATE]),
                     "noisy score": "—" if r is None else _acc(r["selection_score"]),
                     "test accuracy": "—" if r is None else _acc(r["test_accuracy"])})
    return ("<h2 id='selection'>Private selection: the released model per cell</h2>"
            "<p class='note'>Each cell is one private selection: K trials drawn at random, each releasing its "
            "validation accuracy with Gaussian noise; the best noisy score's model is released with the total ε "
            "(tuning included, from dp-accounting's RDP accountant) and is the only one evaluated on the test data. "
            "In the other sections a private-selection trial's accuracy is its noisy validation score.</p>"
            + _table(pd.DataFrame(rows)))


def _audit_section(a: Analysis) -> str:
    """The one-run privacy audits of this experiment's trials ("Privacy auditing with one (1) training
    run", Steinke, Nasr & Jagielski, NeurIPS 2023), each bound beside the accountant's ε."""
    if not a.audits:
        return ""
    rows = [{"trial": r["trial_id"], "cell": r.get("cell") or "—", "workers": r.get("workers", 1),
             "canaries (gradient + input)": f"{(r.get('gradient') or {}).get('canaries', 0)} + "
                                            f"{(r.get('inputs') or {}).get('canaries', 0)}",
             "accountant ε": f"{r['epsilon']:.3f}", "lower bound on ε (95%)": f"{r['lower_bound']:.3f}",
             "verdict": "VIOLATED" if r["violated"] else "consistent"} for r in a.audits]
    return ("<h2 id='audit'>Privacy audit (one training run)</h2>"
            "<p class='note'>Canaries, each included with probability ½, trained once with the trial's settings; "
            "from how well their inclusion can be guessed, a lower bound on ε that holds with 95% confidence. "
            "A bound above the accountant's ε means the run is not DP as claimed; one below shows no violation "
            "(one run's bound is loose) and does not prove the guarantee.</p>" + _table(pd.DataFrame(rows)))


def _fixed_cost_figure(a: Analysis) -> Figure:
    return figures.fixed_cost_figure(a.fixed_cost, a.fixed_setting, a.sweep.eta_tuned(), metric=a.sweep.metric_label,
                                     lower_is_better=a.sweep.lower_is_better)


def _cost_text(a: Analysis, cost: float) -> str:
    """A fixed setting's cost: accuracy points, or how much higher a lower-is-better metric is."""
    return f"+{cost:.3f}" if a.sweep.lower_is_better else f"{100 * cost:.1f} pts"


def _optima_section(a: Analysis) -> str:
    o = a.optima
    label = a.sweep.metric_label
    rows = []
    for _, r in o.iterrows():
        baseline = _baseline_for(a, r) if r["private"] else None
        row = {"cell": r["cell_name"], "C": "— (no clipping)" if not r["private"] else _cell_text(r[CLIP_BOUND]),
               "B": _cell_text(r[BATCH_SIZE]), "η": _cell_text(r[LEARNING_RATE]),
               label: _acc(r["value"]), "seeds": _cell_text(r.get("seeds")),
               f"{1 - ALPHA:.0%} interval": (f"{_acc(r['value_low'])}–{_acc(r['value_high'])}"
                                           if pd.notna(r.get("value_low")) else "—"),
               "not distinguishable": (f"{int(r['indistinguishable'])} (C {fmt(r['clip_bound_min'])}–"
                                       f"{fmt(r['clip_bound_max'])})" if pd.notna(r.get("indistinguishable")) else "—"),
               "σ": _cell_text(r.get("noise_multiplier")) if r["private"] else "0",
               "T": _cell_text(r.get("steps")),
               "σ√T": _cell_text(r.get("noise_sqrt_steps")) if r["private"] else "0",
               shown("clipped", "clipped_fraction"): _acc(r.get("clipped_fraction")) if r["private"] else "—",
               "non-private": _acc(baseline), "on the grid's edge": r.get("grid_edge") or "—",
               "bracketing": r.get("bracketing") if isinstance(r.get("bracketing"), str) and r.get("bracketing") else "—"}
        if a.fixed_cost is not None:
            fixed = a.fixed_cost[a.fixed_cost["cell_name"] == r["cell_name"]]
            row["at fixed (C, B)"] = _acc(fixed["fixed_value"].iloc[0]) if len(fixed) else "—"
            row["cost"] = (_cost_text(a, fixed["cost"].iloc[0])
                           if len(fixed) and pd.notna(fixed["cost"].iloc[0]) else "—")
        rows.append(row)
    parts = ["<h2 id='optima'>Optimal (C, B, η) per cell</h2>",
             f"<p class='note'>Mean {html.escape(label)} over seeds at the best setting of each cell (ties: smaller C, "
             "then B, then η); σ, T, σ√T and the share of per-sample gradients clipped during training are those "
             f"of that setting. Non-private: the {html.escape(a.sweep.metric_name)} of the same cell without DP. Error bars (several seeds): "
             f"the t-interval of the best setting's mean, and the settings a one-sided paired t-test over seeds "
             f"(α = {ALPHA:g}, its p-value × the K settings compared: the best was selected among them) cannot "
             "tell from the best, with their range of C (outlined on the heatmaps).</p>",
             _table(pd.DataFrame(rows), wrap=("on the grid's edge", "bracketing"))]
    if a.comparisons:
        parts.append("<ul>" + "".join(f"<li>{html.escape(c)}</li>" for c in a.comparisons) + "</ul>")
    if a.fixed_cost is not None:
        parts.append(_figure_html(_fixed_cost_figure(a), "cost of a fixed setting",
                                  _fixed_caption(a)))
    elif _fixed_note(a):
        parts.append(f"<p class='note'>{html.escape(_fixed_note(a))}.</p>")
    return "".join(parts)


def _fixed_caption(a: Analysis) -> str:
    """What the fixed-setting chart shows, with its largest loss (data, not a claim)."""
    c, b = a.fixed_setting
    cost = a.fixed_cost["cost"].dropna()
    text = (f"One global setting C={fmt(c)}, B={fmt(b)} (the best on average among the settings run in every "
            f"cell, unless --fixed was given; {eta_note(a.sweep.eta_tuned())}) against each cell's optimal (C, B, η). ")
    missing = int(a.fixed_cost["fixed_value"].isna().sum())
    if missing:
        text += f"It was not run in {missing} cell(s). "
    if cost.empty or cost.max() <= 0:
        return text + "Here it is optimal in every cell where it was run."
    worst = a.fixed_cost.loc[cost.idxmax()]
    loss = (f"{cost.max():.3f} of {a.sweep.metric_label}" if a.sweep.lower_is_better
            else f"{100 * cost.max():.1f} accuracy points")
    return text + (f"It is optimal in {int((cost <= 0).sum())} of {len(cost)} cell(s) and loses up to "
                   f"{loss} ({worst['cell_name']}).")


def _heatmap_section(a: Analysis) -> str:
    label = html.escape(a.sweep.metric_label)
    parts = [f"<h2 id='heatmaps'>Heatmaps of the best {label} over η</h2>"]
    figs = heatmap_figures(a)
    if not figs:
        parts.append("<p class='note'>No private cells: nothing to draw.</p>")
    for facet, fig in figs:
        parts.append(f"<h3>{html.escape(facet)}</h3>")
        parts.append(_figure_html(fig, f"heatmap {facet}",
                                  "Each panel is one cell; one column per clipping bound C and one row per "
                                  f"batch size B the sweep ran; colour: best mean {label} over η for each "
                                  "(C, B), on one scale for all panels; grey: not run, or only errored trials (marked error); ★: the "
                                  "cell's optimum with its η."))
    return "".join(parts)


def _noise_section(a: Analysis) -> str:
    min_steps, plateau_tol = a.min_steps, a.plateau_tol
    parts = ["<h2 id='noise'>Cumulative DP noise σ√T against B</h2>",
             f"<p class='note'>σ calibrated with the PRV accountant for each B at the cell's ε, δ and epochs "
             f"(T = ⌈E·N/B⌉). Grey: fewer than {min_steps} steps (minimum-step floor). Band: within "
             f"{plateau_tol:.0%} of the smallest σ√T above the floor (the plateau); the smallest B on it is "
             f"recommended. Rules: {html.escape(a.rules)}.</p>"]
    figs = noise_figures(a)
    if not figs:
        parts.append("<p class='note'>No noise curves (no private cell with a recorded sample rate).</p>")
    for facet, fig in figs:
        parts.append(f"<h3>{html.escape(facet)}</h3>" + _figure_html(fig, f"noise curves {facet}",
                                                                  "σ√T per B; × marks the Bs the sweep ran."))
    return "".join(parts)


def _gradnorm_section(a: Analysis) -> str:
    parts = ["<section class='nonprivate'><h2 id='gradnorms'>Per-class gradient norms and retention"
             "<span class='badge'>NOT differentially private</span></h2>",
             "<p class='warning'><b>Not differentially private.</b> Everything in this section is computed from "
             "the private training examples (per-sample gradient norms recorded during training). Do not publish "
             "it as if it were protected by the trials' (ε, δ).</p>",
             "<p class='note'>Trials at each cell's optimal (C, B, η), all seeds and epochs pooled; quantiles and "
             "retention w_y(C) = mean over class y of min(1, C/‖g_i‖) are read off histograms with 4 log bins per "
             "decade.</p>"]
    norms = a.norms
    if norms is None or norms.empty:
        parts.append("<p class='note'>No gradient-norm statistics in the store.</p></section>")
        return "".join(parts)
    for facet, distribution, retention in gradnorm_figures(a):
        parts.append(f"<h3>{html.escape(facet)}</h3>")
        parts.append(_figure_html(distribution, f"gradient norms {facet}",
                                  "Per class: 10–90% (thin) and 25–75% (thick) of the per-sample norms, median "
                                  "(dot); right: share clipped at the cell's optimal C."))
        parts.append(_figure_html(retention, f"retention {facet}",
                                  "How much of each class's gradient survives clipping at C; small C "
                                  "down-weights the classes with large norms."))
    table = norms[["cell_name", "label", "count", "clipped_fraction", *QUANTILE_COLUMNS, CLIP_BOUND]].copy()
    table["clipped_fraction"] = table["clipped_fraction"].map(_acc)
    table = table.rename(columns={"cell_name": "cell", CLIP_BOUND: "C", "clipped_fraction": "clipped"})
    parts.append("<details><summary>Per-class table</summary>" + _table(table) + "</details></section>")
    return "".join(parts)


def _cosine_section(a: Analysis) -> str:
    """The denoise_cosine diagnostic (only when some trial ran it); labelled NOT private."""
    curves = a.cosines
    if curves is None or curves.empty:
        return ""
    last = curves.sort_values("epoch").groupby("cell_name").tail(1)
    table = last.rename(columns={"cell_name": "cell", "nonprivate_cos_noisy": "cos(ĝ,ḡ)",
                                 "nonprivate_cos_denoised": "cos(rmt(ĝ),ḡ)", "nonprivate_cos_gain": "gain (gate open)",
                                 "nonprivate_cos_improved": "improved (gate open)",
                                 "nonprivate_cos_gate_rate": "gate open", "nonprivate_cos_rank": "kept rank",
                                 "nonprivate_cos_shrinkage": "shrinkage"})
    for column in table.columns[3:]:
        table[column] = table[column].map(lambda v: "—" if pd.isna(v) else f"{v:.3g}")
    return ("<section class='nonprivate'><h2 id='denoise'>RMT denoising: cosine to the signal"
            "<span class='badge'>NOT differentially private</span></h2>"
            "<p class='warning'><b>Not differentially private.</b> ḡ, the clipped mean gradient before noise, is "
            "computed from the private training examples.</p>"
            "<p class='note'>Per step and 2-D layer, cos(ĝ, ḡ) of the gradient the trial stepped with and "
            "cos(rmt(ĝ), ḡ) of its RMT-denoised version (for a trial without denoising: what rmt would have made "
            "of it), averaged over (layer, step) pairs and the cell's trials; gain and improved are over the pairs "
            "whose gate opened.</p>"
            + _figure_html(cosine_figure(curves), "denoise cosine", "Solid: cos(ĝ, ḡ); dashed: cos(rmt(ĝ), ḡ); "
                           "dotted (right axis): gate-open share and the share of gate-open pairs that improved.")
            + "<details><summary>Last epoch per cell</summary>" + _table(table) + "</details></section>")


def _errors_section(a: Analysis) -> str:
    errors = a.sweep.errors()
    parts = ["<h2 id='errors'>Errored trials</h2>"]
    if errors.empty:
        return parts[0] + "<p class='note'>None.</p>"
    errors = errors.rename(columns={"cell_name": "cell", CLIP_BOUND: "C", BATCH_SIZE: "B",
                                    LEARNING_RATE: "η"})
    errors["error"] = errors["error"].fillna("").map(lambda e: e if len(e) <= 240 else e[:237] + "…")
    return parts[0] + _table(errors, wrap=("error",))


def build_report(store: ResultsStore, *, across: str = "epsilon", fixed: tuple[float, float] | None = None,
                 noise_batch_sizes: Sequence[int] | None = None, min_steps: int | None = None,
                 plateau_tol: float | None = None) -> str:
    """The report page as one HTML string (figures embedded as base64 PNG); the pruning rules are
    the sweep's own unless given (see :func:`analyse`)."""
    a = analyse(store, across=across, fixed=fixed, noise_batch_sizes=noise_batch_sizes, min_steps=min_steps,
                plateau_tol=plateau_tol)
    t = a.sweep.trials
    names = t["experiment"].dropna().unique() if "experiment" in t else []
    experiment = ", ".join(map(str, names)) or store.root
    counts = t["status"].value_counts()
    status = ", ".join(f"{n} {s}" for s, n in counts.items())
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in a.notes)
    body = [f"<h1>dptune report: {html.escape(experiment)}</h1>",
            f"<p class='meta'>{len(t)} trials ({html.escape(status)}) in {len(a.sweep.cells())} cells · store "
            f"<code>{html.escape(store.root)}</code> · generated {html.escape(now)}</p>",
            "<nav><a href='#summary'>Summary</a><a href='#optima'>Optima</a><a href='#heatmaps'>Heatmaps</a>"
            "<a href='#noise'>Noise curves</a><a href='#gradnorms'>Gradient norms (non-private)</a>"
            "<a href='#errors'>Errors</a></nav>",
            f"<ul class='note'>{notes}</ul>" if notes else "",
            _summary_section(a), _private_selection_section(a), _audit_section(a), _optima_section(a), _heatmap_section(a), _noise_section(a),
            _gradnorm_section(a), _cosine_section(a), _errors_section(a)]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>dptune report: {html.escape(experiment)}</title><style>{STYLE}</style></head>"
            f"<body><main>{''.join(body)}</main></body></html>")


def write_report(store: ResultsStore, out_dir: str | Path, **options: object) -> Path:
    """Write ``report.html`` under ``out_dir`` (see :func:`build_report` for the options)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.html"
    tmp = out / f".report.html.{os.getpid()}.tmp"
    tmp.write_text(build_report(store, **options), encoding="utf-8")
    tmp.replace(path)
    return path
