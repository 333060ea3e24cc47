"""A Ray Tune searcher over a whole sweep plan: grid, random or Optuna TPE, cell by cell.

Use it as ``TuneConfig(search_alg=SweepSearcher(plan, metric="accuracy", mode="max"), num_samples=-1)``.
Each suggested Ray Tune config is the flat config of a trial (:mod:`.trial_config`: C, B, η, ε,
δ, epochs, model, dataset, the trial options and the plan's figures as top-level keys). It hands
out the trials of the first cell, then the next, and returns ``Searcher.FINISHED`` when every
cell's configurations are out. Every configuration runs once per training seed; the searcher
sees the mean over seeds. Under private selection (``selection.mode: private``) a cell hands out
its K draws (``CellPlan.draws``), each once with its own training seed.

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
from typing import TYPE_CHECKING, Callable, Optional

from ray.tune.search import Searcher


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
class _Chain:
    """Clip-equivalence in a grid cell: the C grid of one (B, η multiplier), largest C first."""

    batch_size: int
    multiplier: float
    remaining: list                     # clipping bounds not yet handed out, descending
    running: bool = False


@dataclass
class _Proposal:
    cell: int
    indices: Indices
    remaining: int                      # seeds still running
    values: list = field(default_factory=list)
    chain: Optional[_Chain] = None
    clipped: dict = field(default_factory=dict)   # seed → (Ray trial id, clipped every example at every step)


class SweepSearcher(Searcher):
    """Hands out the trials of a :class:`SweepPlan` to Ray Tune (see the module docstring)."""

    def __init__(self, plan: "SweepPlan", *, metric: str = "accuracy", mode: str = "max",
                 clip_equivalence: bool = True,
                 on_equivalent: Optional[Callable[[list[dict]], None]] = None) -> None:
        super().__init__(metric=metric, mode=mode)
        self.plan = plan
        self.clip_equivalence = clip_equivalence
        self.on_equivalent = on_equivalent                 # called with the equivalents found so far
        self._chains: dict[int, list[_Chain]] = {}         # grid cells with clip-equivalence
        self._seeds: dict[str, int] = {}                   # Ray trial id → training seed
        #: trials recorded, not trained: {"source": Ray trial id, "config": trial config} (see chained)
        self.equivalents: list[dict] = []
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
            done = all(n >= c.num_configurations for n, c in zip(self._issued, self.plan.cells))
            return Searcher.FINISHED if done else None     # None: waiting for a larger C (clip-equivalence)
        config, pid = self._pending.popleft()
        self._trials[trial_id] = pid
        self._seeds[trial_id] = int(config["seed"])
        return config

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        pid = self._trials.pop(trial_id, None)
        if pid is None:
            return
        value = None if error or not result else result.get(self.metric)
        proposal = self._proposals[pid]
        proposal.values.append(float(value) if value is not None and math.isfinite(value) else None)
        seed = self._seeds.pop(trial_id, None)
        proposal.clipped[seed] = (trial_id, not error and bool(result) and result.get("fully_clipped") == 1
                                  and result.get("step") == result.get("steps"))
        proposal.remaining -= 1
        if proposal.remaining == 0:
            del self._proposals[pid]
            mean = None if None in proposal.values else sum(proposal.values) / len(proposal.values)
            self._finish(proposal.cell, pid, proposal.indices, mean)
            if proposal.chain is not None:
                self._chain_done(proposal, mean)

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

    # --- clip-equivalence (grid) ----------------------------------------------------------------------

    def chained(self, cell: int) -> bool:
        """Whether clip-equivalence applies in a cell: a private grid cell with flat clipping and more
        than one C. There, with ĝ normalised by B·C, a trial that clipped every example at every step
        gives the same trajectory for every smaller C (same B, η, seed, options): the update is
        (Σ g_i/‖g_i‖ + σξ)/B whatever C is. Its C grid runs largest first, and once a configuration
        is fully clipped in every seed, the smaller C are recorded as equivalent instead of trained.
        The decision reads private gradient norms: it is NOT differentially private."""
        plan = self.plan.cells[cell]
        options = plan.trial.config()
        return (self.clip_equivalence and self.plan.space.search.algorithm == "grid"
                and options.get("clip_fn", "flat") == "flat" and math.isfinite(plan.cell.epsilon)
                and len(plan.clip_bounds) > 1)

    def _next_in_chain(self, i: int) -> tuple[str, Indices, _Chain] | None:
        cell = self.plan.cells[i]
        if i not in self._chains:
            self._chains[i] = [_Chain(b, m, sorted(cell.clip_bounds, reverse=True))
                               for b in cell.searched_batch_sizes for m in self.plan.space.learning_rate.multipliers]
        for chain in self._chains[i]:
            if not chain.running and chain.remaining:
                c = chain.remaining.pop(0)
                chain.running = True
                indices = (cell.clip_bounds.index(c), cell.searched_batch_sizes.index(chain.batch_size),
                           self.plan.space.learning_rate.multipliers.index(chain.multiplier))
                return self._new_pid(i), indices, chain
        return None

    def _chain_done(self, proposal: _Proposal, mean: Optional[float]) -> None:
        chain = proposal.chain
        chain.running = False
        if not chain.remaining or not all(fully for _, fully in proposal.clipped.values()):
            return
        cell = self.plan.cells[proposal.cell]
        for c in chain.remaining:
            for seed, (source, _) in sorted(proposal.clipped.items()):
                self.equivalents.append({"source": source,
                                         "config": cell.trial_config(c, chain.batch_size, chain.multiplier, seed)})
            indices = (cell.clip_bounds.index(c), proposal.indices[1], proposal.indices[2])
            self._finished[proposal.cell][indices] = mean
        self._issued[proposal.cell] += len(chain.remaining)
        chain.remaining = []
        if self.on_equivalent is not None:
            self.on_equivalent(list(self.equivalents))

    def _propose(self) -> None:
        """Queue the trials (one per seed) of the next configuration, if any is left (a cell whose
        C chains all wait for a larger C lets the next cells hand out trials meanwhile)."""
        cells = self.plan.cells
        i = self._cursor
        while i < len(cells):
            cell = cells[i]
            if self._issued[i] >= cell.num_configurations:
                if i == self._cursor:
                    self._cursor += 1
                i += 1
                continue
            if self.chained(i):
                asked = self._next_in_chain(i)
                if asked is None:                       # every chain waits for its running larger C
                    i += 1
                    continue
                pid, indices, chain = asked
                self._queue(i, pid, indices)
                self._proposals[pid].chain = chain
                return
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
                indices = (cell.clip_bounds.index(c), cell.searched_batch_sizes.index(b),
                           self.plan.space.learning_rate.multipliers.index(m))
                pid = self._new_pid(i)
            self._queue(i, pid, indices)
            return

    def _queue(self, i: int, pid: str, indices: Indices) -> None:
        """Hand out one configuration of cell ``i``: a trial per training seed."""
        cell = self.plan.cells[i]
        draw = self._issued[i]
        self._issued[i] += 1
        if cell.private:   # private selection: draw k is one trial with its own training seed
            self._proposals[pid] = _Proposal(i, indices, 1)
            self._pending.append((cell.draw_config(draw), pid))
            return
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
        return self.plan.cells[cell].clip_bounds[ci], batch_sizes[bi], space.learning_rate.multipliers[mi]

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
        sizes = (len(plan.clip_bounds), len(plan.searched_batch_sizes), len(space.learning_rate.multipliers))
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
            if j == cell or ((other.dataset, other.epochs, other.delta, other.options)
                             != (me.dataset, me.epochs, me.delta, me.options)):
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
