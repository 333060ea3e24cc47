"""A Ray Tune searcher over a whole sweep plan: grid, random or Optuna TPE, cell by cell.

Use it as ``TuneConfig(search_alg=SweepSearcher(plan, metric="accuracy", mode="max"), num_samples=-1)``.
Each suggested Ray Tune config is the flat config of a trial (:mod:`.trial_config`: C, B, η, ε,
δ, epochs, backbone, dataset and the trial options as top-level keys), or ``{config_key:
trial_spec}`` when a ``config_key`` is given. It hands
out the trials of the first cell, then the next, and returns ``Searcher.FINISHED`` when every
cell's configurations are out. Every configuration runs once per training seed; the searcher
sees the mean over seeds.

For ``optuna`` each cell has its own Ray Tune ``OptunaSearch`` with a define-by-run space over
*indices* into the cell's pruned candidates (C grid, searched B, η multipliers): only pruned
values can be proposed, and the integer indices keep their order, which TPE exploits. The TPE
sampler is seeded per cell (with ``constant_liar`` so parallel trials spread out), so a fixed
seed and the same sequence of results give the same proposals. A proposal that repeats a finished
configuration is answered from its known result, and one that repeats a running configuration is
discarded, without training again; when TPE proposes only such repeats ``MAX_REPEATS`` times in a
row, the cell's search has converged and stops before its budget. With ``warm_start`` a cell's
first proposal is the best finished configuration of a neighbouring cell (the adjacent ε, or the
other backbone), moved to the nearest searched B; with trials in parallel that is the best
finished *so far* when the cell starts. ``save``/``restore`` pickle the whole state, so
``Tuner.restore`` resumes the search where it stopped.

Use the plan's trial count as ``num_samples`` or -1 (until ``FINISHED``): a converged cell hands
out fewer trials than its budget.
"""
from __future__ import annotations

import math
import pickle
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from ray.tune.search import Searcher

from .trial_config import flatten

if TYPE_CHECKING:
    from ..search_spaces.planner import SweepPlan

INDEX_NAMES = ("clip_index", "batch_index", "lr_index")
#: Repeated proposals in a row after which a cell's TPE search counts as converged.
MAX_REPEATS = 100
Indices = tuple[int, int, int]


class IndexSpace:
    """Define-by-run Optuna space: one integer index per searched dimension of a cell."""

    def __init__(self, sizes: tuple[int, int, int]) -> None:
        self.sizes = sizes

    def __call__(self, trial: object) -> None:
        for name, size in zip(INDEX_NAMES, self.sizes):
            trial.suggest_int(name, 0, size - 1)


def default_startup_trials(budget: int) -> int:
    """Random proposals before TPE models the results: a third of the budget, 1 to 10."""
    return max(1, min(10, budget // 3))


@dataclass
class _Proposal:
    cell: int
    indices: Indices
    remaining: int                      # seeds still running
    values: list = field(default_factory=list)


class SweepSearcher(Searcher):
    """Hands out the trials of a :class:`SweepPlan` to Ray Tune (see the module docstring)."""

    def __init__(self, plan: "SweepPlan", *, metric: str = "accuracy", mode: str = "max",
                 config_key: str | None = None) -> None:
        super().__init__(metric=metric, mode=mode)
        self.plan = plan
        self.config_key = config_key
        self._cursor = 0                                   # the cell handing out trials
        self._issued = [0] * len(plan.cells)               # configurations handed out per cell
        self._asks = [0] * len(plan.cells)                 # proposal ids used per cell
        self._orders: dict[int, list] = {}                 # grid/random: configurations per cell
        self._optuna: dict[int, object] = {}               # optuna: an OptunaSearch per cell
        self._pending: deque = deque()                     # (config, proposal id) ready to hand out
        self._proposals: dict[str, _Proposal] = {}
        self._trials: dict[str, str] = {}                  # Ray trial id → proposal id
        self._finished: list[dict[Indices, Optional[float]]] = [{} for _ in plan.cells]

    # --- Ray Tune's Searcher interface -----------------------------------------------------------

    def suggest(self, trial_id: str) -> Optional[dict] | str:
        if not self._pending:
            self._propose()
        if not self._pending:
            return Searcher.FINISHED
        config, pid = self._pending.popleft()
        self._trials[trial_id] = pid
        return flatten(config) if self.config_key is None else {self.config_key: config}

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        pid = self._trials.pop(trial_id, None)
        if pid is None:
            return
        value = None if error or not result else result.get(self.metric)
        proposal = self._proposals[pid]
        proposal.values.append(float(value) if value is not None and math.isfinite(value) else None)
        proposal.remaining -= 1
        if proposal.remaining == 0:
            del self._proposals[pid]
            mean = None if None in proposal.values else sum(proposal.values) / len(proposal.values)
            self._finish(proposal.cell, pid, proposal.indices, mean)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))

    # --- results -----------------------------------------------------------------------------------

    def best(self, cell: int) -> tuple[Indices, float] | None:
        """The best finished configuration of a cell (indices, mean metric), or None."""
        done = [(v, i) for i, v in self._finished[cell].items() if v is not None]
        if not done:
            return None
        value, indices = (max if self.mode == "max" else min)(done)
        return indices, value

    # --- internals ---------------------------------------------------------------------------------

    def _finish(self, cell: int, pid: str, indices: Indices, mean: Optional[float]) -> None:
        self._finished[cell][indices] = mean
        inner = self._optuna.get(cell)
        if inner is not None:
            inner.on_trial_complete(pid, None if mean is None else {self.metric: mean}, error=mean is None)

    def _propose(self) -> None:
        """Queue the trials (one per seed) of the next configuration, if any is left."""
        cells = self.plan.cells
        while self._cursor < len(cells):
            i = self._cursor
            cell = cells[i]
            if self._issued[i] >= cell.num_configurations:
                self._cursor += 1
                continue
            if self.plan.space.search.algorithm == "optuna":
                asked = self._ask_optuna(i)
                if asked is None:                       # converged: this cell is done
                    self._issued[i] = cell.num_configurations
                    continue
                pid, indices = asked
            else:
                if i not in self._orders:
                    self._orders[i] = cell.configurations()
                c, b, m = self._orders[i][self._issued[i]]
                indices = (self.plan.space.clip_bounds.index(c), cell.searched_batch_sizes.index(b),
                           self.plan.space.learning_rate.multipliers.index(m))
                pid = self._new_pid(i)
            self._queue(i, pid, indices)
            return

    def _queue(self, i: int, pid: str, indices: Indices) -> None:
        """Hand out one configuration of cell ``i``: a trial per training seed."""
        cell = self.plan.cells[i]
        self._issued[i] += 1
        seeds = self.plan.space.seeds
        self._proposals[pid] = _Proposal(i, indices, len(seeds))
        c, b, m = self._values(i, indices)
        for seed in seeds:
            self._pending.append((cell.trial_config(c, b, m, seed), pid))

    def _new_pid(self, cell: int) -> str:
        pid = f"{self.plan.cells[cell].cell.key}#{self._asks[cell]}"
        self._asks[cell] += 1
        return pid

    def _values(self, cell: int, indices: Indices) -> tuple[float, int, float]:
        space = self.plan.space
        ci, bi, mi = indices
        batch_sizes = self.plan.cells[cell].searched_batch_sizes
        return space.clip_bounds[ci], batch_sizes[bi], space.learning_rate.multipliers[mi]

    def _ask_optuna(self, cell: int) -> tuple[str, Indices] | None:
        """A new configuration from the cell's TPE, or None once it only repeats known ones."""
        inner = self._optuna.get(cell) or self._start_optuna(cell)
        running = {p.indices for p in self._proposals.values() if p.cell == cell}
        for _ in range(MAX_REPEATS):
            pid = self._new_pid(cell)
            params = inner.suggest(pid)
            indices = tuple(int(params[name]) for name in INDEX_NAMES)
            if indices not in self._finished[cell] and indices not in running:
                return pid, indices
            known = self._finished[cell].get(indices)  # a repeat: answered (or discarded) without training
            inner.on_trial_complete(pid, None if known is None else {self.metric: known}, error=known is None)
        return None

    def _start_optuna(self, cell: int) -> object:
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # one INFO line per study and trial otherwise
        plan = self.plan.cells[cell]
        space = self.plan.space
        budget = plan.num_configurations
        sampler = optuna.samplers.TPESampler(seed=plan.sampler_seed(), constant_liar=True, n_startup_trials=
                                             space.search.startup_trials or default_startup_trials(budget))
        sizes = (len(space.clip_bounds), len(plan.searched_batch_sizes), len(space.learning_rate.multipliers))
        start = self._warm_start_point(cell) if space.search.warm_start else None
        inner = OptunaSearch(IndexSpace(sizes), metric=self.metric, mode=self.mode, sampler=sampler,
                             points_to_evaluate=[dict(zip(INDEX_NAMES, start))] if start else None)
        self._optuna[cell] = inner
        return inner

    def neighbours(self, cell: int) -> list[int]:
        """Cells next to ``cell``: the adjacent ε on the axis (same data, backbone, epochs, δ), and
        the other backbones at the same ε."""
        cells = [c.cell for c in self.plan.cells]
        eps = self.plan.space.axes.epsilon
        me = cells[cell]
        out = []
        for j, other in enumerate(cells):
            if j == cell or (other.dataset, other.epochs, other.delta) != (me.dataset, me.epochs, me.delta):
                continue
            adjacent_eps = other.backbone == me.backbone and abs(eps.index(other.epsilon) - eps.index(me.epsilon)) == 1
            other_backbone = other.backbone != me.backbone and other.epsilon == me.epsilon
            if adjacent_eps or other_backbone:
                out.append(j)
        return out

    def _warm_start_point(self, cell: int) -> Indices | None:
        """The best finished neighbouring configuration, mapped into this cell's candidates."""
        found = [(best[1], j, best[0]) for j in self.neighbours(cell) if (best := self.best(j)) is not None]
        if not found:
            return None
        _, source, indices = (max if self.mode == "max" else min)(found, key=lambda f: f[0])
        batch = self.plan.cells[source].searched_batch_sizes[indices[1]]
        mine = self.plan.cells[cell].searched_batch_sizes
        nearest = min(range(len(mine)), key=lambda k: (abs(math.log(mine[k] / batch)), mine[k]))
        return indices[0], nearest, indices[2]
