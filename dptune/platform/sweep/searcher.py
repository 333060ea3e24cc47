"""A Ray Tune searcher over a whole sweep plan: one :class:`~dptune.platform.sweep.cell_search.CellSearch` per cell, cell by cell.

Use it as ``TuneConfig(search_alg=SweepSearcher(plan, metric="score"), num_samples=-1)``: it maximises the trials' signed score.
Each suggested Ray Tune config is the flat config of a trial (:mod:`dptune.platform.sweep.trial_config`). It hands out
the trials of the first cell, then the next (a cell whose clip-equivalence chains all wait for a
larger C lets the next cells hand out trials meanwhile), and returns ``Searcher.FINISHED`` when
every cell is done. Which strategy a cell gets (:func:`cell_strategy`): the grid or a random
search's seeded sample in order (``grid`` cells with flat clipping through :class:`ClipChains`),
Optuna TPE over the indices (with ``warm_start``, first the best finished configuration of a
neighbouring cell: the adjacent ε, or the other backbone, moved to the nearest searched B), or
private selection's K draws; with ``search.transfer`` a grid cell searches only near the best of
the cell before it in its ε chain (:class:`~dptune.platform.sweep.cell_search.Transfer`). ``save``/``restore`` pickle the whole state, so ``Tuner.restore``
resumes the search where it stopped (the pickle is read only from the experiment's own folder:
as for any pickle, resume only experiments whose folder nobody else can write, see the README).
With ``pack`` (:mod:`dptune.platform.sweep.packs`), the trial configs the cells can hand out now that can share a model
are handed out together as one pack trial; each member's result is told to its cell alone.
A restored searcher is told, before its first suggestion, which trials Ray Tune's snapshot holds
(:func:`reconcile_restored`): the two snapshots are written one after the other and can disagree
after a kill, and a configuration handed out before the kill that the trial snapshot lost is handed
out again instead of never being trained.

Use the plan's trial count as ``num_samples`` or -1 (until ``FINISHED``): a converged cell hands
out fewer trials than its budget.
"""
from __future__ import annotations

import math
import pickle
from collections import deque
from typing import TYPE_CHECKING, Callable, Optional

from ray.tune.search import Searcher

from pyarrow.fs import LocalFileSystem

from .bracket import Bracket
from .race import Race
from ...search_spaces.search_sections import MODEL_BASED
from ...schema.metrics import oriented
from .cell_search import GP, WAIT, CellSearch, ClipChains, Indices, Ordered, TPE, Transfer, WarmStart
from .starts import cell_starts, prior_optima
from ..store.durable import read_file, write_bytes
from ..faults import fault_point
from .pack_policy import PackPolicy, PackSpeeds, pack_config, take_pack
from .packs import member_result, member_results, member_trial_id

if TYPE_CHECKING:
    from ...search_spaces.planner import SweepPlan
    from ..store.layout import ExperimentPaths

def default_startup_trials(budget: int) -> int:
    """Random proposals before TPE models the results: a third of the budget, 1 to 10."""
    return max(1, min(10, budget // 3))


class SweepSearcher(Searcher):
    """Hands out the trials of a :class:`SweepPlan` to Ray Tune (see the module docstring).
    ``on_equivalent`` is called with every trial recorded as clip-equivalent so far."""

    def __init__(self, plan: "SweepPlan", *, metric: str, mode: str = "max", clip_equivalence: bool = True,
                 on_equivalent: Optional[Callable[[list[dict]], None]] = None,
                 pack: PackPolicy | None = None, paths: "ExperimentPaths | None" = None) -> None:
        super().__init__(metric=metric, mode=mode)
        self.plan = plan
        #: packed trials (None: each trial config runs alone), on where the plan's lever is
        self.pack = pack if plan.space.search.pack else None
        self.on_equivalent = on_equivalent
        #: where each cell's bracketing is kept as it goes (None: not kept)
        self.paths = paths
        extensions, max_seeds = plan.space.search.bracket_extensions, plan.space.search.racing_max_seeds
        self.cells = [CellSearch(cell, cell_strategy(plan, i, clip_equivalence=clip_equivalence,
                                                     warm_start=lambda i=i: self.warm_start_point(i)),
                                 plan.space.seeds,
                                 bracket=Bracket(extensions) if extensions is not None and not cell.private else None,
                                 race=Race.of(tuple(plan.space.seeds), max_seeds,
                                              paired=plan.space.trial.config().get("randomness") != "secure",
                                              max_added=plan.space.search.racing_max_added)
                                 if max_seeds is not None and not cell.private else None)
                      for i, cell in enumerate(plan.cells)]
        search = plan.space.search
        if search.transfer_radius is not None:
            for cell, source in plan.transfer_sources().items():
                self.cells[cell].strategy = Transfer(self.cells[cell].strategy, self.cells[source], plan.cells[cell],
                                                     search.transfer_radius, search.transfer_lr_scaling)
        if search.start or search.prior:   # starting points first: the spec's, an earlier sweep's optima
            optima = prior_optima(search.prior) if search.prior else {}
            for cell, c in zip(self.cells, plan.cells):
                if not c.private:
                    cell.strategy.start_with(cell_starts(c, search, optima, continuous=search.algorithm == "gp"))
        #: trials recorded, not trained: {"source": Ray trial id, "config": trial config}
        self.equivalents: list[dict] = []
        self._cursor = 0                                   # the first cell not done
        self._pending: deque = deque()                     # (cell, proposal id, trial config) to hand out
        #: Ray trial id → its (cell, proposal id, trial config): one, or a pack's members
        self._trials: dict[str, list[tuple[int, str, dict]]] = {}
        self._reconciled = True   # a restored state is squared with Ray Tune's trials once (reconcile)
        #: what packs and lone trials cost per configuration-step here (a measured pack policy's)
        self.speeds = PackSpeeds()
        #: pack members whose end was told to their cell from a report, before their pack ended
        self._told: set[str] = set()

    @classmethod
    def saved(cls, paths: "ExperimentPaths") -> "SweepSearcher | None":
        """The searcher of the experiment at ``paths`` as Ray Tune last saved it (at the end of a run,
        its final state), or None: what a resumed sweep's closing lines read."""
        state = paths.searcher_state()
        if state is None:
            return None
        searcher = cls.__new__(cls)
        searcher.__dict__.update(state)
        return searcher

    # --- Ray Tune's Searcher interface -----------------------------------------------------------

    def suggest(self, trial_id: str) -> Optional[dict] | str:
        if self.pack is not None:   # everything the cells can hand out now, to pack what shares a model
            while self._propose():
                pass
        elif not self._pending:
            self._propose()
        if not self._pending:
            return Searcher.FINISHED if all(c.done for c in self.cells) else None   # None: waiting for a larger C
        entries = (take_pack(self._pending, self.pack, running=len(self._trials), speeds=self.speeds)
                   if self.pack is not None else [self._pending.popleft()])
        self._trials[trial_id] = entries
        return pack_config([config for _, _, config in entries])

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """A pack's report: each member it reports ended (finished, stopped, diverged) is told to its
        cell now, not when the whole pack ends — what waits on it (the next C of its clip-equivalence
        chain, its cell's next round) need not wait for the pack's longest member."""
        entries = self._trials.get(trial_id)
        if entries is None or len(entries) == 1:
            return
        reported = member_results(result)   # Tune's flat result, parsed once
        for k, (cell, pid, config) in enumerate(entries):
            member_id, last = member_trial_id(trial_id, k), reported.get(str(k), {})
            if last.get("member_status") == "ended" and member_id not in self._told:
                self._told.add(member_id)
                self._result(cell, pid, config, member_id, last, bool(last.get("error")))

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        entries = self._trials.pop(trial_id, None)
        if entries is None:
            return
        configs = [config for _, _, config in entries]
        if self.pack is not None and self.pack.measured and all(map(self.pack.packable, configs)):
            self.speeds.record(configs, result)
        for k, (cell, pid, config) in enumerate(entries):
            if len(entries) == 1:   # an error it reported (a divergence, its input's) ended it too
                member_id, last, failed = trial_id, result, error or bool((result or {}).get("error"))
            else:   # a pack: each member's own result (an ended member's stands even if the pack failed)
                member_id, last = member_trial_id(trial_id, k), member_result(result, k)
                if member_id in self._told:   # told from the report that said it ended
                    self._told.discard(member_id)
                    continue
                failed = bool(last.get("error")) or (error and last.get("member_status") != "ended")
            self._result(cell, pid, config, member_id, last, failed)

    def _result(self, cell: int, pid: str, config: dict, trial_id: str, result: Optional[dict], error: bool) -> None:
        """One trial's (or pack member's) result, told to its cell."""
        seed = int(config["seed"])
        value = None if error or not result else self.score(result)
        completed = not error and bool(result) and result.get("step") == result.get("steps")
        fully = completed and result.get("fully_clipped") == 1
        steps = (result or {}).get("steps")
        share = min(1.0, (result.get("step") or 0) / steps) if steps else float(completed)
        equivalents = self.cells[cell].result(pid, seed, trial_id, value, fully, completed, share)
        if equivalents:
            self.equivalents += equivalents
            if self.on_equivalent is not None:
                self.on_equivalent(list(self.equivalents))

    def score(self, result: dict) -> float | None:
        """A result's score, higher is better: the sweep's trials report it (``metric`` ``score``,
        ``mode`` ``max``); a metric of Ray Tune's choosing is signed by its ``mode`` here, once."""
        return oriented(result.get(self.metric), self.mode)

    def save(self, checkpoint_path: str) -> None:
        write_bytes(LocalFileSystem(), checkpoint_path, pickle.dumps(self.__dict__))
        fault_point("searcher_saved")

    def restore(self, checkpoint_path: str) -> None:
        saved = read_file(LocalFileSystem(), checkpoint_path, pickle.loads, "the searcher's state")
        self.__dict__.update(saved)
        self.__dict__.setdefault("speeds", PackSpeeds())   # a state saved before packs were measured
        self.__dict__.setdefault("_told", set())
        self._reconciled = False

    def reconcile(self, trials: list) -> None:
        """Square this state with Ray Tune's restored trials: a trial handed out here that the
        snapshot does not hold is handed out again, first; one the snapshot holds as ended (it
        ended after this state was saved: Ray Tune will not report it again) is taken as reported.
        A trial of the snapshot unknown here (a newer trial list) needs nothing: the store keeps
        one row per configuration. The store callback calls it at the first step of a resumed sweep,
        before any suggestion; only its first call after :meth:`restore` does anything."""
        if self._reconciled:
            return
        self._reconciled = True
        held = {t.trial_id: t for t in trials}
        for trial_id in reversed([t for t in self._trials if t not in held]):   # but members told already
            entries = self._trials.pop(trial_id)
            told = {k for k in range(len(entries)) if member_trial_id(trial_id, k) in self._told}
            self._told -= {member_trial_id(trial_id, k) for k in told}
            self._pending.extendleft(reversed([e for k, e in enumerate(entries) if k not in told]))
        for trial_id in [t for t in self._trials if held[t].status in (held[t].TERMINATED, held[t].ERROR)]:
            trial = held[trial_id]
            self.on_trial_complete(trial_id, trial.last_result, error=trial.status == trial.ERROR)

    def unrun(self) -> int:
        """How many planned trials have not ended: handed out and not reported back, queued, and at
        least one per cell that has configurations left (0 once the plan is complete)."""
        return (sum(map(len, self._trials.values())) - len(self._told) + len(self._pending)
                + sum(not c.done for c in self.cells))

    # --- results -----------------------------------------------------------------------------------

    def best(self, cell: int) -> tuple[Indices, float] | None:
        """The best finished configuration of a cell (indices, mean metric), or None."""
        return self.cells[cell].best()

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

    def warm_start_point(self, cell: int) -> Indices | None:
        """The best finished neighbouring configuration so far, mapped into this cell's candidates
        (its C and η multiplier, the nearest searched B)."""
        found = [(best[1], j, best[0]) for j in self.neighbours(cell) if (best := self.best(j)) is not None]
        if not found:
            return None
        _, source, indices = max(found, key=lambda f: f[0])
        batch = self.plan.cells[source].values(indices)[1]
        mine = self.plan.cells[cell].searched_batch_sizes
        nearest = min(range(len(mine)), key=lambda k: (abs(math.log(mine[k] / batch)), mine[k]))
        return indices[0], nearest, indices[2]

    def save_bracketing(self) -> None:
        """Keep every cell's bracketing and racing record beside the experiment (the closing lines read it)."""
        if self.paths is not None:
            self.paths.save_bracketing({c.cell.cell.key: c.growth_record() for c in self.cells
                                        if c.bracket is not None or c.race is not None})

    # --- internals ---------------------------------------------------------------------------------

    def _propose(self) -> bool:
        """Queue the trials of the next configuration of the first cell that has one (scanning again
        when a cell finished its search during the scan: a cell waiting for it may go on now);
        whether one was queued."""
        while True:
            finished = False
            for i in range(self._cursor, len(self.cells)):
                was_done = self.cells[i].done
                before = self.cells[i].added_so_far()
                proposed = self.cells[i].propose()
                if before is not None and (self.cells[i].added_so_far() != before or self.cells[i].done != was_done):
                    self.save_bracketing()
                if proposed is None:
                    finished |= not was_done
                    if i == self._cursor:
                        self._cursor += 1
                    continue
                if proposed == WAIT:
                    continue
                pid, configs = proposed
                self._pending.extend((i, pid, config) for config in configs)
                return True
            if not finished:
                return False


def chained(plan: "SweepPlan", cell: int, *, clip_equivalence: bool = True) -> bool:
    """Whether clip-equivalence applies in a cell: a private grid cell with flat clipping and more
    than one C. There, with ĝ normalised by B·C, a trial that clipped every example at every step
    gives the same trajectory for every smaller C (same B, η, seed, options): the update is
    (Σ g_i/‖g_i‖ + σξ)/B whatever C is. The decision reads private gradient norms: it is NOT
    differentially private."""
    c = plan.cells[cell]
    return (clip_equivalence and plan.space.search.algorithm == "grid" and not c.private
            and c.trial.config().get("clip_fn", "flat") == "flat" and c.cell.private and len(c.clip_bounds) > 1)


def cell_strategy(plan: "SweepPlan", cell: int, *, clip_equivalence: bool,
                  warm_start: Callable[[], Indices | None]) -> object:
    """The strategy of one cell (see the module docstring)."""
    c, search = plan.cells[cell], plan.space.search
    if c.private:   # private selection: its K draws, each once with its own seed
        return Ordered(range(len(c.draws)))
    if search.algorithm in MODEL_BASED:   # Optuna's TPE, or its GP sampler over continuous C and η
        sampler = (GP if search.algorithm == "gp" else TPE)(
            (len(c.clip_bounds), len(c.searched_batch_sizes), len(plan.space.learning_rate.multipliers)),
            seed=c.sampler_seed(),
            startup_trials=search.startup_trials or default_startup_trials(c.num_configurations))
        return WarmStart(sampler, warm_start) if search.warm_start else sampler
    if chained(plan, cell, clip_equivalence=clip_equivalence):
        return ClipChains(c)
    return Ordered([c.indices(*values) for values in c.configurations()])
