"""Where a cell's search starts: the spec's starting points (``search.start``) and an earlier sweep's
optima (``search.prior``), tried first.

An earlier sweep's optimum of a cell with the same data, backbone, epochs, δ and options seeds this
sweep's cell at the nearest ε (in log), as transfer does between the cells of one sweep ("On optimal
hyperparameters for DP deep transfer learning": the optimum moves smoothly with ε). Each point becomes a position of the cell (its nearest searched
B; C and η's multiplier at their place along their grids: the nearest grid point, or for a continuous
search the point itself, kept within the grid's range) and is proposed first by the cell's strategy.
Read before Ray starts (:func:`check_prior` refuses a folder without a results store in one line).
"""
from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Sequence

from ...search_spaces.spec import Catalog, Spec, SpecError, register_check
from ..store.layout import ExperimentPaths
from ..store.results_store import ResultsStore, selected_values
from ...schema import BATCH_SIZE, CLIP_BOUND

if TYPE_CHECKING:
    from ...search_spaces.planner import CellPlan

#: The ε of a cell key (``…/eps=8``) and where it stands in it.
EPSILON = re.compile(r"/eps=([^/]+)")


def prior_optima(folder: str) -> dict[str, tuple[float, float, int, float]]:
    """An earlier sweep's optimum per cell: cell key → (ε, C, B, η multiplier), the best seed-mean
    score (higher is better, whatever the metric) of its finished full-scale trials."""
    trials = ResultsStore(ExperimentPaths.find(folder).store).table("trials")
    if trials.empty:
        return {}
    trials = trials.assign(score=selected_values(trials)["score"])   # a store written before the score: signed here
    done = trials[trials["status"].isin(["finished", "equivalent"]) & trials["score"].notna()].copy()
    done["lr_multiplier"] = [json.loads(c).get("lr_multiplier", math.nan) if isinstance(c, str) else math.nan
                             for c in done.get("config_json", [None] * len(done))]
    keys = ["cell", "epsilon", CLIP_BOUND, BATCH_SIZE, "lr_multiplier"]
    means = done.dropna(subset=["lr_multiplier"]).groupby(keys)["score"].mean().reset_index()
    best = means.loc[means.groupby("cell")["score"].idxmax()] if len(means) else means
    return {r.cell: (float(r.epsilon), float(r.clip_bound), int(r.batch_size), float(r.lr_multiplier))
            for r in best.itertuples()}


def matched(key: str, epsilon: float, optima: dict) -> tuple[float, int, float] | None:
    """The optimum of the earlier cell like ``key`` but for ε, at the ε nearest ``epsilon`` (log)."""
    shape = EPSILON.sub("/eps=*", key)
    found = [(abs(math.log(eps / epsilon)) if math.isfinite(eps) and math.isfinite(epsilon) else
              (0.0 if eps == epsilon else math.inf), point)
             for cell, (eps, *point) in optima.items() if EPSILON.sub("/eps=*", cell) == shape]
    found = [f for f in found if math.isfinite(f[0])]
    return tuple(min(found)[1]) if found else None


def position(grid: Sequence[float], value: float, continuous: bool) -> float:
    """Where ``value`` stands along ``grid`` (ascending): the nearest grid point's index, or for a
    continuous search its place between the grid points (in log), kept within the grid's range."""
    if len(grid) < 2:
        return 0
    if not continuous:
        return min(range(len(grid)), key=lambda k: (abs(math.log(grid[k] / value)), grid[k]))
    value = min(max(value, grid[0]), grid[-1])
    k = max(i for i in range(len(grid)) if grid[i] <= value)
    if k == len(grid) - 1:
        return float(k)
    return round(k + math.log(value / grid[k]) / math.log(grid[k + 1] / grid[k]), 4)


def start_keys(cell: "CellPlan", points: Sequence[tuple[float, int, float]], continuous: bool) -> list[tuple]:
    """The cell's positions of starting points (C, B, η multiplier), without repeats."""
    out = []
    for c, b, m in points:
        key = (position(cell.clip_bounds, c, continuous),
               position(cell.searched_batch_sizes, b, False),
               position(cell.space.learning_rate.multipliers, m, continuous))
        if key not in out:
            out.append(key)
    return out


def cell_starts(cell: "CellPlan", search: object, optima: dict, continuous: bool) -> list[tuple]:
    """A cell's starting positions: the earlier sweep's matched optimum first, then the spec's points."""
    prior = matched(cell.cell.key, cell.cell.epsilon, optima) if optima else None
    return start_keys(cell, ([prior] if prior is not None else []) + list(search.start), continuous)


@register_check
def check_prior(spec: Spec, catalog: Catalog) -> None:
    """``search.prior`` names an experiment folder with a results store (read now, before Ray)."""
    folder = spec["search"].prior
    if folder is None:
        return
    try:
        optima = prior_optima(folder)
    except (OSError, ValueError) as exc:
        raise SpecError(f"search.prior: {folder} cannot be read as an experiment ({exc})") from None
    if not optima:
        raise SpecError(f"search.prior: {folder} holds no finished trial to start from (give an earlier sweep's "
                        "<storage>/<experiment> folder)")
