"""The sweep as tables: cells, best accuracy over η per (C, B), optima, cost of a fixed setting.

A **cell** is one point of the difficulty axes (dataset × backbone × ε × epochs) plus
any training option that takes more than one value in the store (optimizer, δ, clipping function,
norm estimator, …), so trials that differ only in C, B, η and seed share a cell. Accuracies of
seeds of the same (C, B, η) are averaged before the best η is taken. Non-private rows (ε stored as
NULL) form their own cells at ε = ∞; they have no clipping, so they get no C × B heatmap but are
listed as baselines. Errored trials are counted, never used as results.

A trial's ``value`` here is the metric the sweep selected on (the store's ``metric`` column names
it, ``metric_mode`` gives its direction: ``max``, or ``min`` for a language model's NLL; a store
written before the signed score kept it in ``accuracy``). Every ranking compares ``score`` = the
value with its sign (−value where lower is better, as the store keeps it), so the optimum, the
heatmaps' star and the cost of a fixed setting are right for either direction; the tables show the
metric's own value, and again under an ``accuracy`` name where the metric is an accuracy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd

from ..errors import UserError
from ..platform.store.results_store import ResultsStore, selected_values
from ..privacy.randomness_modes import RANDOMNESS, RANDOMNESS_LABELS
from ..schema import BATCH_SIZE, CLIP_BOUND, FIELDS, HYPERPARAMETERS, LEARNING_RATE, METRICS, Metric, names, shown
from ..search_spaces.bracketing import AXES, edges

CELL_AXES = ("dataset", "backbone", "epsilon", "epochs")
#: Training options that split cells when they vary within a store (NULL means the default): the
#: trial schema's fields declared ``cell``.
OPTION_COLUMNS = names(cell=True)
#: The schema's δ unless set (a NULL delta in the store is the default).
DEFAULT_DELTA = FIELDS["delta"].default


def fmt(value: object) -> str:
    """A short label for an axis or hyperparameter value (ε = ∞ for non-private)."""
    if isinstance(value, (float, np.floating)):
        return "∞" if math.isinf(value) else f"{value:g}"
    return str(value)


def null_label(column: str) -> str:
    """How a cell names a training option the store holds as NULL (the trainer's default): that
    default's value, or "none" where the default is no value (no denoiser, no sketch)."""
    default = FIELDS[column].default
    return "none" if default is None else fmt(default)


def cell_title(key: dict) -> str:
    parts = []
    for column, value in key.items():
        if column == "epsilon":
            parts.append(f"ε={fmt(value)}" + (" (non-private)" if math.isinf(value) else ""))
        elif column == "epochs":
            parts.append(f"{fmt(value)} epoch" + ("" if value == 1 else "s"))
        elif column in ("dataset", "backbone"):
            parts.append(fmt(value))
        else:
            parts.append(f"{column}={fmt(value)}")
    return " · ".join(parts)


#: How a table aggregates the seeds of one setting: the mean value, accuracy (NaN where the metric
#: is not one) and score, and how many seeds had a result.
MEANS = {"value": ("value", "mean"), "accuracy": ("accuracy", "mean"), "score": ("score", "mean"),
         "seeds": ("value", "size")}


@dataclass
class Sweep:
    """The ``trials`` view normalised for analysis; every table of the report is a method."""

    trials: pd.DataFrame
    cell_columns: tuple[str, ...]
    #: proxy runs (``search.proxy``) with the full-scale B they stand for: where C and η were searched
    #: in a proxied cell, so the edge check reads them (``cell`` names their cell, as their trials')
    proxies: pd.DataFrame | None = None

    @classmethod
    def from_store(cls, store: ResultsStore) -> "Sweep":
        """Read the ``trials`` view through the store's public reader."""
        return cls.from_frame(store.table("trials"))

    @classmethod
    def from_frame(cls, trials: pd.DataFrame) -> "Sweep":
        """Normalise a ``trials`` frame: ε = ∞ for non-private rows, defaults for NULL options,
        and a ``cell_name`` column naming each trial's cell. Proxy runs (``search.proxy``) are left out:
        they only rank, at their own B, σ and epochs, and would read as cells of their own."""
        proxied = trials["proxy_divisor"].notna() if "proxy_divisor" in trials else pd.Series(False, index=trials.index)
        proxies = trials[proxied]
        if len(proxies):
            proxies = proxies.assign(batch_size=proxies["full_batch_size"])
        t = trials[~proxied].copy()
        for column in CELL_AXES + OPTION_COLUMNS + HYPERPARAMETERS + ("status", "private"):
            if column not in t:
                t[column] = None
        if t["backbone"].isna().all() and "model" in t:
            t["backbone"] = t["model"]
        private = t["private"].astype("boolean").fillna(t["epsilon"].notna())
        t["private"] = private.astype(bool) & t["epsilon"].notna()
        t["epsilon"] = np.where(t["private"], pd.to_numeric(t["epsilon"], errors="coerce"), np.inf)
        for column in HYPERPARAMETERS + ("epochs",):
            t[column] = pd.to_numeric(t[column], errors="coerce").astype(float)
        # an errored or stopped trial has no result; a clip-equivalent one has its source's (same trajectory)
        complete = t["status"].isin(["finished", "equivalent"])
        selected = selected_values(t)
        t["value"] = selected["value"].where(complete)
        t["score"] = selected["score"].where(complete)
        t["sign"] = selected["sign"]
        t["accuracy"] = t["value"].where(selected["accuracy"])
        for column in ("dataset", "backbone"):
            t[column] = t[column].astype(object).where(t[column].notna(), "?")
        varying = []
        for column in OPTION_COLUMNS:
            t[column] = t[column].astype(object).where(t[column].notna(), null_label(column))
            if t[column].map(fmt).nunique() > 1:
                varying.append(column)
                t[column] = t[column].map(fmt)
        cell_columns = CELL_AXES + tuple(varying)
        t["cell_name"] = [cell_title(dict(zip(cell_columns, row)))
                          for row in t[list(cell_columns)].itertuples(index=False)]
        return cls(t.reset_index(drop=True), cell_columns, proxies.reset_index(drop=True))

    @property
    def metric_label(self) -> str:
        """How lines and figures name the stored metric: its label, with its direction where lower
        is better ("accuracy" for a store that predates the ``metric`` column or mixes metrics)."""
        metric = self._metric()
        return metric.titled if metric is not None else "accuracy"

    @property
    def metric_name(self) -> str:
        """The stored metric's label without its direction (a table column's name)."""
        metric = self._metric()
        return metric.label if metric is not None else "accuracy"

    def _metric(self) -> Metric | None:
        metrics = set(self.trials["metric"].dropna()) if "metric" in self.trials else set()
        return METRICS[metrics.pop()] if len(metrics) == 1 and next(iter(metrics)) in METRICS else None

    @property
    def lower_is_better(self) -> bool:
        """Whether the stored metric is one where lower is better (a language model's NLL)."""
        return bool((self.trials["sign"] < 0).any())

    # -- cells ---------------------------------------------------------------------------------
    def cells(self) -> pd.DataFrame:
        """One row per cell: its axis values and name, private cells first, ordered by the axes."""
        cols = list(self.cell_columns)
        cells = self.trials.drop_duplicates("cell_name")[cols + ["cell_name", "private"]]
        return cells.sort_values(["private"] + cols, ascending=[False] + [True] * len(cols)).reset_index(drop=True)

    def facets(self, across: str, *, private_only: bool = True) -> Iterator[tuple[str, pd.DataFrame]]:
        """Groups of cells that differ only in ``across``: (facet name, cells ordered by ``across``)."""
        if across not in self.cell_columns:
            raise UserError(f"--across must be one of {', '.join(self.cell_columns)}; got {across!r}")
        cells = self.cells()
        if private_only:
            cells = cells[cells["private"]]
        rest = [c for c in self.cell_columns if c != across]
        if not rest:
            yield "all cells", cells.sort_values(across).reset_index(drop=True)
            return
        for _, group in cells.groupby(rest, sort=True, dropna=False):
            name = cell_title(dict(zip(rest, group[rest].iloc[0])))
            yield name, group.sort_values(across).reset_index(drop=True)

    # -- results ---------------------------------------------------------------------------------
    def finished(self) -> pd.DataFrame:
        """Trials with a result (status finished, or equivalent, and a value)."""
        return self.trials[self.trials["value"].notna()]

    def heatmap_table(self) -> pd.DataFrame:
        """Per private cell and (C, B): the best mean value (the selected metric) over η and that η.

        Seeds of one (C, B, η) are averaged first. A (C, B) whose trials all errored is kept with
        value NaN and its error count, so a figure can mark it; likewise trials an early-stopping
        scheduler stopped (status ``stopped``: fewer epochs, so no comparable result) are counted in
        ``stopped`` and never enter the value.
        """
        private = self.trials[self.trials["private"]]
        keys = ["cell_name", CLIP_BOUND, BATCH_SIZE]
        per_lr = (private[private["value"].notna()]
                  .groupby(keys + [LEARNING_RATE], dropna=False)
                  .agg(**MEANS)
                  .reset_index().sort_values(keys + [LEARNING_RATE]))
        best = per_lr.loc[per_lr.groupby(keys)["score"].idxmax()] if len(per_lr) else per_lr
        counts = per_lr.groupby(keys).size().rename("learning_rates")
        errored = (private.assign(errored=private["status"] == "error", stopped=private["status"] == "stopped")
                   .groupby(keys)[["errored", "stopped"]].sum())
        table = (errored.join(best.set_index(keys)).join(counts).reset_index())
        table["learning_rates"] = table["learning_rates"].fillna(0).astype(int)
        table["seeds"] = table["seeds"].fillna(0).astype(int)
        table["errored"] = table["errored"].astype(int)
        table["stopped"] = table["stopped"].astype(int)
        return table.sort_values(keys).reset_index(drop=True)

    def eta_tuned(self) -> bool:
        """Whether η was searched: some private cell ran a (C, B) at more than one η. Without it, "the
        optimum" is over C and B at each B's one η, and the analysis' lines say so."""
        table = self.heatmap_table()
        return bool(len(table)) and int(table["learning_rates"].max()) > 1

    def optima(self) -> pd.DataFrame:
        """Per cell, the best (C, B, η) and its mean value, with σ, T and σ√T of that setting.

        Ties go to the smaller C, then B, then η. Non-private cells optimise (B, η) only (C: NaN).
        """
        done = self.finished()
        settings = ["cell_name", CLIP_BOUND, BATCH_SIZE, LEARNING_RATE]
        done = done.assign(clip_bound=done[CLIP_BOUND].where(done["private"]))
        extra = {c: (c, "mean") for c in ("noise_multiplier", "steps", "noise_sqrt_steps", "clipped_fraction")
                 if c in done}
        per_setting = (done.groupby(settings, dropna=False)
                       .agg(**MEANS, **extra)
                       .reset_index().sort_values(settings))
        if per_setting.empty:
            return per_setting.assign(private=pd.Series(dtype=bool))
        best = per_setting.loc[per_setting.groupby("cell_name")["score"].idxmax()]
        best = best.assign(grid_edge=[self.grid_edge(r) for _, r in best.iterrows()],
                           cell=[self.cell_key(name) for name in best["cell_name"]])
        stops = self.stopped_settings().groupby("cell_name")["rung"].agg(["size", "min", "max"])
        best = best.assign(stopped=[int(stops.loc[c, "size"]) if c in stops.index else 0 for c in best["cell_name"]],
                           stopped_rungs=[(f"{stops.loc[c, 'min']}" + (f"–{stops.loc[c, 'max']}" if stops.loc[c, "max"]
                                                                       != stops.loc[c, "min"] else ""))
                                          if c in stops.index else "" for c in best["cell_name"]])
        cells = self.cells()
        return cells.merge(best, on="cell_name", how="left")

    def cell_key(self, cell_name: str) -> str | None:
        """The plan's key of a cell (its trials' ``cell``), for what the sweep kept per cell."""
        keys = self.trials.loc[self.trials["cell_name"] == cell_name, "cell"].dropna() if "cell" in self.trials \
            else pd.Series(dtype=object)
        return str(keys.iloc[0]) if len(keys) else None

    def tried(self, cell_name: str) -> pd.DataFrame:
        """Every (C, B, η) a cell tried: its trials, errored and stopped ones too (a larger η that
        diverged brackets the optimum; one stopped at a rung lost there), and its proxy runs."""
        cell = self.trials[self.trials["cell_name"] == cell_name]
        if self.proxies is None or self.proxies.empty or "cell" not in cell:
            return cell
        return pd.concat([cell, self.proxies[self.proxies["cell"].isin(set(cell["cell"].dropna()))]])

    def grid_edge(self, optimum: pd.Series) -> str:
        """Which of an optimum's C, B, η is the smallest or largest value its cell tried ("" if
        none), by the rule bracketing uses (:func:`dptune.search_spaces.bracketing.edges`): η among
        those tried at its (C, B), C among those at its B, B among the cell's (:meth:`tried`). An
        optimum on the edge of what was searched may lie beyond it: the grid, not the problem, chose it."""
        tried = self.tried(optimum["cell_name"])[[CLIP_BOUND, BATCH_SIZE, LEARNING_RATE]]
        rows = [tuple(float(v) for v in r) for r in tried.itertuples(index=False) if not pd.isna(r[1])]
        point = (None if pd.isna(optimum[CLIP_BOUND]) else float(optimum[CLIP_BOUND]),
                 float(optimum[BATCH_SIZE]), float(optimum[LEARNING_RATE]))
        fixed = {1: (), 0: (1,), 2: (1,) if point[0] is None else (1, 0)}   # the slice each axis is read in
        out = []
        for axis, side in sorted(edges(rows, point), key=lambda e: (e[0] != 1, e[0])):   # B, C, η
            values = {r[axis] for r in rows if all(math.isclose(r[a], point[a]) for a in fixed[axis])}
            out.append(f"{AXES[axis]} the {'largest' if side > 0 else 'smallest'} of {len(values)} tried")
        return "; ".join(out)

    def fixed_setting_cost(self, clip_bound: float | None = None,
                           batch_size: float | None = None) -> tuple[tuple[float, float], pd.DataFrame]:
        """The value of one global (C, B) (η still tuned per cell) against each private cell's optimum.

        By default the global setting is the (C, B) with the best mean score among those run
        (with a result) in every private cell, the best a practitioner could do with a single fixed
        setting; when no (C, B) was run in every cell (each cell searched its own pruned batch
        sizes), there is no such setting and this raises ValueError saying so. Returns the setting
        and one row per private cell: optimum, fixed value (NaN where not run), cost.
        """
        table = self.heatmap_table().dropna(subset=["value"])
        if table.empty:
            raise UserError("no finished private trials: nothing to compare")
        if (clip_bound is None) != (batch_size is None):
            raise UserError("give both the clipping bound and the batch size of the fixed setting, or neither")
        if clip_bound is None:
            cells, stats = self._settings_in_every_cell(table)
            # fewest cells where multi-fidelity stopped it first (it lost there), then the best mean
            stats = stats.sort_values(["stopped_cells", "mean", CLIP_BOUND, BATCH_SIZE],
                                      ascending=[True, False, True, True])
            if stats.empty:
                raise UserError(f"no (C, B) was run in all {cells} private cells (each cell searched its own "
                                 "batch sizes), so no single setting can be compared across them; "
                                 "--fixed C,B compares one anyway")
            clip_bound, batch_size = float(stats[CLIP_BOUND].iloc[0]), float(stats[BATCH_SIZE].iloc[0])
        at = table[np.isclose(table[CLIP_BOUND], clip_bound) & np.isclose(table[BATCH_SIZE], batch_size)]
        stops = self.stopped_settings()
        stopped_at = stops[np.isclose(stops[CLIP_BOUND], clip_bound) & np.isclose(stops[BATCH_SIZE], batch_size)]
        if at.empty and stopped_at.empty:
            raise UserError(f"the fixed setting C={clip_bound:g}, B={batch_size:g} was not run in any cell")
        optima = self.optima()
        optima = optima[optima["private"] & optima["value"].notna()]
        out = optima[["cell_name", CLIP_BOUND, BATCH_SIZE, LEARNING_RATE, "value", "accuracy", "score"]].merge(
            at[["cell_name", LEARNING_RATE, "value", "accuracy", "score"]].rename(
                columns={LEARNING_RATE: "fixed_learning_rate", "value": "fixed_value", "accuracy": "fixed_accuracy",
                         "score": "fixed_score"}),
            on="cell_name", how="left")
        out["cost"] = out["score"] - out["fixed_score"]   # ≥ 0: how much worse, in the metric's units
        out = out.drop(columns=["score", "fixed_score"])
        # where multi-fidelity stopped it (and nothing of it finished): it lost there, at that rung
        lost = stopped_at.groupby("cell_name")["rung"].min()
        out["fixed_stopped"] = [f"stopped at rung {int(lost[c])}" if c in lost.index and pd.isna(acc) else None
                                for c, acc in zip(out["cell_name"], out["fixed_value"])]
        return (clip_bound, batch_size), out.reset_index(drop=True)

    def fixed_setting_pool(self) -> tuple[int, int]:
        """How many (C, B) the default fixed setting was chosen from: those with a result, or stopped by
        multi-fidelity (it lost there), in every private cell; and all (C, B) with either somewhere (the
        rest errored or were not run in some cell, so there is nothing of them to compare there)."""
        table = self.heatmap_table().dropna(subset=["value"])
        _, stats = self._settings_in_every_cell(table)
        stops = self.stopped_settings()
        tried = pd.concat([table[[CLIP_BOUND, BATCH_SIZE]], stops[[CLIP_BOUND, BATCH_SIZE]]])
        return len(stats), len(tried.drop_duplicates())

    def _settings_in_every_cell(self, table: pd.DataFrame) -> tuple[int, pd.DataFrame]:
        """The number of private cells, and the (C, B) of ``table`` with a result, or stopped by
        multi-fidelity, in every one of them: their mean score where they have one, and in how many
        cells they were stopped (``stopped_cells``)."""
        cells = table["cell_name"].nunique()
        keys = [CLIP_BOUND, BATCH_SIZE]
        stops = self.stopped_settings()
        stopped = stops[["cell_name", *keys]].drop_duplicates()
        stopped = stopped.merge(table[["cell_name", *keys]].drop_duplicates(), on=["cell_name", *keys], how="left",
                                indicator=True)
        stopped = stopped[stopped["_merge"] == "left_only"].groupby(keys).size().rename("stopped_cells")
        stats = table.groupby(keys)["score"].agg(["size", "mean"]).join(stopped, how="outer").reset_index()
        stats["size"] = stats["size"].fillna(0)
        stats["stopped_cells"] = stats["stopped_cells"].fillna(0).astype(int)
        return cells, stats[stats["size"] + stats["stopped_cells"] == cells]

    def stopped_settings(self) -> pd.DataFrame:
        """The configurations multi-fidelity stopped in a private cell (every trial of theirs there
        stopped: none complete), each with the step it was stopped at and its rung (the stop's place
        among the distinct steps where that cell's runs at its B were stopped: 1 the first)."""
        keys = ["cell_name", CLIP_BOUND, BATCH_SIZE, LEARNING_RATE]
        private = self.trials[self.trials["private"]]
        complete = private[private["value"].notna()][keys].drop_duplicates()
        stopped = private[private["status"] == "stopped"]
        if stopped.empty:
            return pd.DataFrame(columns=[*keys, "step", "rung"])
        stopped = stopped.assign(step=pd.to_numeric(stopped["step"], errors="coerce") if "step" in stopped else np.nan)
        stopped = stopped.groupby(keys)["step"].min().reset_index()
        stopped = stopped.merge(complete, on=keys, how="left", indicator=True)
        stopped = stopped[stopped["_merge"] == "left_only"].drop(columns="_merge")
        stopped["rung"] = stopped.groupby(["cell_name", BATCH_SIZE])["step"].rank(method="dense").fillna(1).astype(int)
        return stopped.reset_index(drop=True)

    def summary(self) -> pd.DataFrame:
        """Per cell: trial counts by status, the C, B and η values tried, best and median value (and
        accuracy, where the metric is one)."""
        rows = []
        for _, cell in self.cells().iterrows():
            t = self.trials[self.trials["cell_name"] == cell["cell_name"]]
            values = t["value"].dropna()
            best = t.loc[t["score"].idxmax()] if len(values) else {"value": np.nan, "accuracy": np.nan}
            row = {"cell": cell["cell_name"], "trials": len(t),
                   "finished": int((t["status"] == "finished").sum()),
                   "errored": int((t["status"] == "error").sum()),
                   "stopped": int((t["status"] == "stopped").sum()),
                   "equivalent": int((t["status"] == "equivalent").sum()),
                   "C": _values(t[CLIP_BOUND]) if cell["private"] else "— (no clipping)",
                   "B": _values(t[BATCH_SIZE]), "η": _values(t[LEARNING_RATE]),
                   "best value": best["value"], "median value": values.median() if len(values) else np.nan,
                   "best accuracy": best["accuracy"], "median accuracy": t["accuracy"].median()}
            if "train_time_s" in t:
                row[shown("train time (s)", "train_time_s")] = float(pd.to_numeric(t["train_time_s"], errors="coerce").sum())
            # a store without the column predates secure mode: its runs were seeded
            modes = t["randomness"].fillna(RANDOMNESS[0]) if "randomness" in t else pd.Series([RANDOMNESS[0]])
            row["randomness"] = ", ".join(RANDOMNESS_LABELS[m] for m in sorted(set(modes)))
            rows.append(row)
        return pd.DataFrame(rows)

    def errors(self) -> pd.DataFrame:
        """The errored trials: cell, (C, B, η) and the error message."""
        t = self.trials[self.trials["status"] == "error"]
        cols = ["trial_id", "cell_name", CLIP_BOUND, BATCH_SIZE, LEARNING_RATE, "error"]
        return t.reindex(columns=cols).reset_index(drop=True)

    def dataset_size(self, cell_name: str) -> int | None:
        """N of a cell's training set, from B and q = B/N of its trials (None if none recorded)."""
        t = self.trials[self.trials["cell_name"] == cell_name]
        if "sample_rate" not in t:
            return None
        q = pd.to_numeric(t["sample_rate"], errors="coerce")
        n = (t[BATCH_SIZE] / q)[q > 0].dropna()
        return int(round(float(n.median()))) if len(n) else None

    def cell_option(self, cell_name: str, column: str, default: object = None) -> object:
        """A cell's value of a training option (``default`` where the store has NULL)."""
        values = self.trials.loc[self.trials["cell_name"] == cell_name, column]
        value = values.iloc[0] if len(values) else None
        return default if value is None or value == null_label(column) else value


def eta_note(tuned: bool) -> str:
    """How the analysis' lines name η: tuned per cell, or not tuned (one η per B)."""
    return "η tuned per cell" if tuned else "η not tuned: one η per B"


def _values(column: pd.Series) -> str:
    values = sorted(v for v in column.dropna().unique())
    return ", ".join(fmt(float(v)) for v in values) if values else "—"
