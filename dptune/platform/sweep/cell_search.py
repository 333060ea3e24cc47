"""The search of one cell: a small strategy per algorithm, with seeds, clip-equivalence and warm
starts composed around it (in the manner of Ray Tune's ``Repeater(ConcurrencyLimiter(…))``).

A **configuration** is a position in the cell's pruned candidates, ``(C, B, η multiplier)`` indices
(:meth:`~dptune.search_spaces.planner.CellPlan.values` turns them into values). A strategy
proposes configurations (``ask``) and is told each one's result (``tell``):

- :class:`Ordered`: a fixed list, in order: the grid, a random search's seeded sample, or private
  selection's K draws;
- :class:`TPE`: Optuna's TPE sampler over the indices (seeded per cell, ``constant_liar`` so that
  parallel trials spread out); a proposal that repeats a finished configuration is answered from
  its result and one that repeats a running configuration is discarded, without training; after
  ``MAX_REPEATS`` such proposals in a row the cell's search has converged.

Around a strategy:

- :class:`ClipChains` (clip-equivalence, grid cells with flat clipping): each (B, η)'s C run
  largest first; once a configuration clipped every example at every step in every seed, its
  smaller C are recorded as equivalent instead of trained (NOT private: it reads per-sample norms);
- :class:`WarmStart`: the cell's first proposal is a point given when the cell starts (the best
  finished configuration of a neighbouring cell, mapped into this one);
- :class:`Transfer` (``search.transfer``, grid cells): the grid restricted to a neighbourhood of the
  previous ε cell's best, once that cell is done;
- :class:`CellSearch` runs each configuration once per training seed and tells the strategy the
  mean (private draws carry their own seed and run once); under proxy runs (``search.proxy``) it
  hands out the configurations at (B/k, σ/k, T) and, once they are all in, the best one at full
  scale: the cell's answer. After the search, bracketing's rounds (:class:`~.bracket.Bracket`), then
  racing's (:class:`~.race.Race`: further seeds for the configurations the error bars' test cannot
  tell from the optimum), bracketing again if a race moved the optimum onto an edge.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from .bracket import Bracket, Indices
from .race import Race

if TYPE_CHECKING:
    from ...search_spaces.planner import CellPlan

#: What ``ask`` returns when it has nothing to hand out until a running configuration ends.
WAIT = "wait"
#: Repeated proposals in a row after which a cell's TPE search counts as converged.
MAX_REPEATS = 100
INDEX_NAMES = ("clip_index", "batch_index", "lr_index")


@dataclass
class Outcome:
    """A configuration's result over its seeds: the mean metric (None when a seed failed or had no
    result) and, per seed, its Ray trial id and whether it clipped every example at every step."""

    key: object
    mean: Optional[float]
    clipped: dict = field(default_factory=dict)   # seed → (Ray trial id, fully clipped)


class Ordered:
    """A fixed list of configurations, handed out in order."""

    def __init__(self, keys: Sequence[object]) -> None:
        self.queue = deque(keys)

    def restrict(self, allowed: set) -> None:
        """Hand out only the configurations in ``allowed`` (a transfer's neighbourhood)."""
        self.queue = deque(k for k in self.queue if k in allowed)

    def start_with(self, keys: Sequence[object]) -> None:
        """Hand out ``keys`` first (starting points: those of the list; the others are not added)."""
        first = [k for k in keys if k in self.queue]
        self.queue = deque(first + [k for k in self.queue if k not in first])

    def ask(self, search: "CellSearch") -> object | None:
        return self.queue.popleft() if self.queue else None

    def tell(self, outcome: Outcome) -> list:
        return []


class TPE:
    """Optuna's TPE over the cell's indices (see the module docstring)."""

    def __init__(self, sizes: Indices, *, seed: int, startup_trials: int) -> None:
        self.sizes, self.seed, self.startup_trials = sizes, seed, startup_trials
        self.study = None
        self.asked: dict[Indices, list] = {}   # configuration → its Optuna trials awaiting a result
        self.enqueued: list[Indices] = []

    def enqueue(self, indices: Indices) -> None:
        """Propose ``indices`` first (a warm start)."""
        self.enqueued.append(indices)

    def start_with(self, keys: Sequence[Indices]) -> None:
        """Propose ``keys`` first (starting points), before the sampler's own."""
        self.enqueued = list(keys) + self.enqueued

    def sampler(self) -> object:
        """TPE, seeded per cell; ``constant_liar`` so that parallel proposals spread out."""
        import optuna

        return optuna.samplers.TPESampler(seed=self.seed, constant_liar=True, n_startup_trials=self.startup_trials)

    def _start(self) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # one INFO line per study and trial otherwise
        self.study = optuna.create_study(sampler=self.sampler(), direction="maximize")   # the signed score
        for key in self.enqueued:
            self.study.enqueue_trial(self.params(key))

    def params(self, key: tuple) -> dict:
        """A configuration as the study's parameters."""
        return dict(zip(INDEX_NAMES, key))

    def suggest(self, trial: object) -> tuple:
        """The configuration a study's trial proposes: an index per axis."""
        return tuple(trial.suggest_int(name, 0, size - 1) for name, size in zip(INDEX_NAMES, self.sizes))

    def ask(self, search: "CellSearch") -> Indices | None:
        """A new configuration, or None once the sampler only repeats known ones."""
        from optuna.trial import TrialState

        if self.study is None:
            self._start()
        for _ in range(MAX_REPEATS):
            trial = self.study.ask()
            indices = self.suggest(trial)
            if indices not in search.finished and indices not in search.running_keys():
                self.asked.setdefault(indices, []).append(trial)
                return indices
            known = search.finished.get(indices)  # a repeat: answered (or discarded) without training
            if known is None:
                self.study.tell(trial, state=TrialState.FAIL)
            else:
                self.study.tell(trial, known)
        return None

    def tell(self, outcome: Outcome) -> list:
        from optuna.trial import TrialState

        trial = self.asked[outcome.key].pop(0)
        if outcome.mean is None:
            self.study.tell(trial, state=TrialState.FAIL)
        else:
            self.study.tell(trial, outcome.mean)
        return []

    def __setstate__(self, state: dict) -> None:
        """Read a state pickled before the signed score: a study that minimised a lower-is-better
        metric becomes one that maximises its score (its told values negated, its waiting trials
        asked again for the same configurations)."""
        mode = state.pop("mode", "max")
        self.__dict__.update(state)
        if mode == "min" and self.study is not None:
            self._maximise()

    def _maximise(self) -> None:
        import optuna
        from optuna.trial import TrialState, create_trial

        old = self.study
        self.study = optuna.create_study(sampler=old.sampler, direction="maximize")
        for t in old.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            self.study.add_trial(create_trial(params=t.params, distributions=t.distributions, state=t.state,
                                              value=-t.value if t.state == TrialState.COMPLETE else None))
        for key, waiting in self.asked.items():
            for i in range(len(waiting)):
                self.study.enqueue_trial(self.params(key))
                waiting[i] = self.study.ask()
                self.suggest(waiting[i])


class GP(TPE):
    """Optuna's Gaussian-process sampler (Matérn 5/2, log expected improvement), as the tool of "On
    optimal hyperparameters for DP deep transfer learning" (DPBayes/dpdl) searches: C and η on continuous log ranges between their grid's smallest and largest values (a
    position p in [0, n − 1] along the grid: its value lies between the grid's neighbours in log; a
    position past either end is bracketing's), B on the cell's σ-calibrated searched values. Parallel
    proposals spread out by the installed Optuna's own handling of running trials: with trials asked
    and not yet told, the GP sampler takes the q-batch log expected improvement (qLogEI) over them."""

    NAMES = ("clip_position", "batch_index", "lr_position")

    def sampler(self) -> object:
        import optuna

        return optuna.samplers.GPSampler(seed=self.seed, n_startup_trials=self.startup_trials)

    def params(self, key: tuple) -> dict:
        return {name: value for name, value, size in zip(self.NAMES, key, self.sizes) if size > 1}

    def suggest(self, trial: object) -> tuple:
        out = []
        for axis, (name, size) in enumerate(zip(self.NAMES, self.sizes)):
            if size < 2:
                out.append(0)
            elif axis == 1:
                out.append(trial.suggest_int(name, 0, size - 1))
            else:   # a float position, rounded so that a repeat is recognised
                out.append(round(trial.suggest_float(name, 0.0, float(size - 1)), 4))
        return tuple(out)


class ClipChains:
    """Clip-equivalence in a grid cell (see the module docstring): the grid's C of each (B, η)
    handed out largest first, one at a time; asks WAIT while every chain waits for its larger C."""

    first: tuple | list = ()   # starting points, handed out before the chains (:meth:`start_with`)

    def __init__(self, cell: "CellPlan") -> None:
        order = sorted(range(len(cell.clip_bounds)), key=lambda i: cell.clip_bounds[i], reverse=True)
        self.chains = {(bi, mi): [(ci, bi, mi) for ci in order]       # (B, η) → its C not handed out yet
                       for bi in range(len(cell.searched_batch_sizes))
                       for mi in range(len(cell.space.learning_rate.multipliers))}
        self.running: set[tuple[int, int]] = set()

    def restrict(self, allowed: set) -> None:
        """Hand out only the configurations in ``allowed`` (a transfer's neighbourhood); a chain keeps
        its order, largest C first."""
        self.chains = {chain: [k for k in rest if k in allowed] for chain, rest in self.chains.items()}

    def start_with(self, keys: Sequence[Indices]) -> None:
        """Hand out ``keys`` first (starting points), each then leaving its chain; its chain's larger C
        follow in their order, and only its smaller C can be found equivalent to it."""
        self.first = [k for k in keys if k in self.chains.get(tuple(k[1:]), [])]
        for key in self.first:
            self.chains[tuple(key[1:])].remove(key)

    def ask(self, search: "CellSearch") -> object | None:
        for key in list(self.first):   # starting points first, one per chain at a time
            if tuple(key[1:]) not in self.running:
                self.first.remove(key)
                self.running.add(tuple(key[1:]))
                return key
        pending = [chain for chain, rest in self.chains.items() if rest]
        for chain in pending:
            if chain not in self.running:
                self.running.add(chain)
                return self.chains[chain].pop(0)
        return WAIT if pending or self.first else None

    def tell(self, outcome: Outcome) -> list[Indices]:
        """The configurations now known to be equivalent to ``outcome``'s (its smaller C), if it
        clipped every example at every step in every seed."""
        chain = outcome.key[1:]
        self.running.discard(chain)
        if not all(fully for _, fully in outcome.clipped.values()):
            return []
        rest = self.chains[chain]   # largest C first: a starting point's larger C may be left
        self.chains[chain] = [k for k in rest if k[0] > outcome.key[0]]
        return [k for k in rest if k[0] < outcome.key[0]]


class WarmStart:
    """``inner``'s search, proposing ``point()`` (computed when the cell starts) first."""

    def __init__(self, inner: TPE, point: Callable[[], Optional[Indices]]) -> None:
        self.inner, self.point, self.started = inner, point, False

    def start_with(self, keys: Sequence[Indices]) -> None:
        self.inner.start_with(keys)

    def ask(self, search: "CellSearch") -> object | None:
        if not self.started:
            self.started = True
            start = self.point()
            if start is not None:
                self.inner.enqueue(start)
        return self.inner.ask(search)

    def tell(self, outcome: Outcome) -> list:
        return self.inner.tell(outcome)


class Transfer:
    """``inner``'s search (a grid: :class:`Ordered` or :class:`ClipChains`) restricted to the
    configurations within ``radius`` grid steps, in C, B and η, of the best configuration of
    ``source`` — the previous cell of its ε chain, waited for until its search results are all in (a
    proxy search's full-scale answer run need not end: it does not change the best) — mapped into this
    cell: the nearest C and searched B (in log), and the nearest η multiplier, first scaled by
    ε_this/ε_source under ``lr_scaling == "linear"`` (Panda et al., "A new linear scaling rule for
    private adaptive hyperparameter optimization": the optimal η·T is roughly linear in ε). With no
    result in the source, the whole grid."""

    def __init__(self, inner: object, source: "CellSearch", cell: "CellPlan", radius: int,
                 lr_scaling: str = "none") -> None:
        self.inner, self.source, self.cell, self.radius, self.lr_scaling = inner, source, cell, radius, lr_scaling
        self.center: Indices | None = None
        self.started = False

    def ask(self, search: "CellSearch") -> object | None:
        if not self.started:
            if not self.source.results_in:   # every search result of the source in (not its answer run)
                return WAIT
            self.started = True
            best = self.source.best()
            if best is not None:
                self.center = self.mapped(best[0])
                self.inner.restrict(set(self.neighbourhood()))
        return self.inner.ask(search)

    def tell(self, outcome: Outcome) -> list:
        return self.inner.tell(outcome)

    def start_with(self, keys: Sequence[Indices]) -> None:
        self.inner.start_with(keys)

    def mapped(self, indices: Indices) -> Indices:
        """The source's configuration as the nearest configuration of this cell."""
        clip, batch, multiplier = self.source.cell.values(indices)
        if self.lr_scaling == "linear":
            multiplier *= self.cell.cell.epsilon / self.source.cell.cell.epsilon
        mine = (self.cell.clip_bounds, self.cell.searched_batch_sizes, self.cell.space.learning_rate.multipliers)
        return tuple(min(range(len(values)), key=lambda k, v=v, values=values: (abs(math.log(values[k] / v)), values[k]))
                     for values, v in zip(mine, (clip, batch, multiplier)))

    def neighbourhood(self) -> list[Indices]:
        sizes = (len(self.cell.clip_bounds), len(self.cell.searched_batch_sizes),
                 len(self.cell.space.learning_rate.multipliers))
        ranges = [range(max(0, c - self.radius), min(n, c + self.radius + 1)) for c, n in zip(self.center, sizes)]
        return [(ci, bi, mi) for ci in ranges[0] for bi in ranges[1] for mi in ranges[2]]


def _mean(scores: dict) -> Optional[float]:
    """The mean of a configuration's results over its seeds; None when a seed failed or had none."""
    return None if None in scores.values() else sum(scores.values()) / len(scores)


@dataclass
class _Running:
    key: object
    remaining: int                       # seeds handed out and still running
    clipped: dict = field(default_factory=dict)
    scores: dict = field(default_factory=dict)   # seed → its result (None: failed or none)
    complete: bool = True                # every seed trained to its last step
    raced: bool = False                  # racing's further seeds of a finished configuration
    #: the other seeds' trial configs, held back while the lead seed runs (:meth:`CellSearch.propose`)
    deferred: list = field(default_factory=list)


class CellSearch:
    """One cell's search: ``strategy`` proposes configurations, each runs once per seed of ``seeds``
    (private draws: once, with their own seed), and the strategy is told the mean over seeds. With
    ``bracket`` (:class:`~.bracket.Bracket`), once the search's results are all in, the configurations
    beyond an edge its optimum lies on follow, round after round, until it is bracketed."""

    def __init__(self, cell: "CellPlan", strategy: object, seeds: Sequence[int], *,
                 bracket: Bracket | None = None, race: Race | None = None) -> None:
        self.cell, self.strategy, self.seeds = cell, strategy, tuple(seeds)
        self.bracket, self.race = bracket, race
        self.race_queue: deque = deque()   # racing's (configuration, its new seeds) still to hand out
        self.scores: dict[Indices, dict] = {}   # configuration → {seed: result} (an equivalent's: its source's)
        self.complete: set = set()         # configurations that trained to their last step on every seed
        self.extra: deque = deque()     # bracketing's configurations still to hand out
        self.extended: set = set()      # bracketing's configurations (the strategy never proposed them)
        self.fully_clipped: set = set()   # configurations that clipped every example at every step, every seed
        self.finished: dict[Indices, Optional[float]] = {}   # configuration → mean score (None: failed)
        self.running: dict[str, _Running] = {}               # proposal id → its seeds' results so far
        self.handed_out = 0                                  # configurations handed out (or recorded equivalent)
        self.trained = 0.0                                   # full trials' worth of steps trained (a stopped one: its share)
        self.proposals = 0                                   # proposal ids used
        #: proxy runs (search.proxy): the full-scale run of the best configuration, once the proxies
        #: are in: None (not handed out), "running" or "done"
        self.proxied = cell.proxied
        self.final: str | None = None
        #: (proposal id, trial configs) of seeds whose lead passed every rung, to hand out next
        self.ready: deque = deque()

    @property
    def searched(self) -> bool:
        """Every configuration of the search is handed out (or its search converged)."""
        return self.handed_out >= self.cell.num_configurations

    @property
    def bracketed(self) -> bool:
        """Bracketing has nothing more to add (or is off)."""
        return self.bracket is None or (self.bracket.settled and not self.extra)

    @property
    def raced(self) -> bool:
        """Racing has nothing more to add (or is off)."""
        return self.race is None or (self.race.settled and not self.race_queue)

    @property
    def done(self) -> bool:
        waiting = self.ready or any(r.deferred for r in self.running.values())   # seeds behind a running lead
        return (self.searched and not waiting and self.bracketed and self.raced
                and (not self.proxied or self.final == "done"))

    def _search_results_in(self) -> bool:
        return (self.searched and not self.extra and not self.race_queue
                and all(pid.endswith("#final") for pid in self.running))

    @property
    def results_in(self) -> bool:
        """Every search result is in: all configurations handed out (bracketing's and racing's too) and
        none running (a proxy search's full-scale answer run may still run: it is not a search result)."""
        return self._search_results_in() and self.bracketed and self.raced

    def added_so_far(self) -> tuple[int, int] | None:
        """(configurations bracketing added, trials racing added), or None where neither is on."""
        if self.bracket is None and self.race is None:
            return None
        return (self.bracket.added if self.bracket else 0), (self.race.added if self.race else 0)

    def growth_record(self) -> dict:
        """What the experiment keeps of its bracketing and racing (``dptune-bracketing.json``; read by
        :func:`~dptune.platform.store.layout.added_trials`, the closing lines, the report)."""
        record = {**(self.bracket.record() if self.bracket is not None else {}), "seeds": len(self.seeds)}
        return {**record, "racing": self.race.record()} if self.race is not None else record

    def running_keys(self) -> set:
        return {r.key for r in self.running.values()}

    def propose(self) -> tuple[str, list[dict]] | str | None:
        """(proposal id, its trial configs, one per seed), WAIT, or None when the cell is done (all
        handed out, or its search converged)."""
        if self.ready:                   # the other seeds of configurations whose lead passed every rung
            return self.ready.popleft()
        if self.done:
            return None
        if self.searched and any(r.deferred for r in self.running.values()):
            return WAIT                  # a lead seed runs: its configuration's other seeds may follow
        if self.extra:
            return self.hand_out(self.extra.popleft())
        if self.race_queue:
            return self.hand_out(*self.race_queue.popleft())
        if not self.searched:
            key = self.strategy.ask(self)
            if key == WAIT:
                return WAIT
            if key is not None:
                self.handed_out += 1
                return self.hand_out(key)
            self.handed_out = self.cell.num_configurations   # converged, or nothing left: the search is done
        if not self.bracketed:           # the search's results all in: the next extension, if its optimum asks
            if not self._search_results_in():
                return WAIT
            keys = self.bracket.next_round(self)
            if keys:
                self.extended.update(keys)
                self.extra.extend(keys[1:])
                return self.hand_out(keys[0])
        if not self.raced:               # then the contenders' further seeds, round after round
            if not self._search_results_in():
                return WAIT
            self.race_queue.extend(self.race.next_round(self))
            if self.race_queue:
                if self.bracket is not None:   # the round may move the optimum onto an edge: ask again after it
                    self.bracket.settled = False
                return self.hand_out(*self.race_queue.popleft())
        return self.propose_final() if self.proxied else None

    def hand_out(self, key: object, seeds: Sequence[int] | None = None) -> tuple[str, list[dict]]:
        """A new proposal of configuration ``key``: its trial configs, one per seed (the lead alone first
        where multi-fidelity decides on it); with ``seeds``, racing's further seeds of a finished
        configuration, all at once and left alone by the scheduler."""
        pid = f"{self.cell.cell.key}#{self.proposals}"
        self.proposals += 1
        if seeds is not None:
            configs = [{**self.cell.trial_config(*self.cell.values(key), seed), "follower": True} for seed in seeds]
            self.running[pid] = _Running(key, len(configs), raced=True)
            return pid, configs
        configs = self.trial_configs(key)
        lead, rest = (configs[:1], configs[1:]) if self.lead_first(key) else (configs, [])
        self.running[pid] = _Running(key, len(lead), deferred=[{**c, "follower": True} for c in rest])
        return pid, lead

    def lead_first(self, key: object) -> bool:
        """Whether configuration ``key`` runs its lead seed first (:meth:`CellPlan.lead_seed_first`): the
        scheduler decides on it alone, and its other seeds run only if it trained to the end."""
        return not self.cell.private and len(self.seeds) > 1 and self.cell.lead_seed_first(self.cell.values(key)[1])

    def propose_final(self) -> tuple[str, list[dict]] | str | None:
        """A proxy search's answer: once every proxy run is in, the best configuration trained at
        full scale, once per seed (WAIT while proxies run; None when no proxy gave a result, or when the
        best ran at full scale already: a B that ``batch_divisor: auto`` left at k = 1)."""
        if self.final is not None or self.running:
            return WAIT if self.final != "done" else None
        best = self.best()
        if best is None or self.cell.proxy_divisor(self.cell.values(best[0])[1]) == 1:
            self.final = "done"
            return None
        self.final = "running"
        pid = f"{self.cell.cell.key}#final"
        configs = [{**self.cell.trial_config(*self.cell.values(best[0]), seed), "final": True} for seed in self.seeds]
        self.running[pid] = _Running(best[0], len(configs))
        return pid, configs

    def trial_configs(self, key: object) -> list[dict]:
        """A configuration's trials: one per seed (a private draw: its own; under proxy runs, at B/k)."""
        if self.cell.private:
            return [self.cell.draw_config(key)]
        configure = self.cell.proxy_config if self.proxied else self.cell.trial_config
        return [configure(*self.cell.values(key), seed) for seed in self.seeds]

    def result(self, pid: str, seed: int, trial_id: str, value: Optional[float], fully_clipped: bool,
               completed: bool = True, share: float = 1.0) -> list[dict]:
        """One trial's result (``completed``: it trained to its last step; False when stopped early or
        errored; ``share``: the part of its steps it trained); once all seeds of its configuration are in, the strategy is told the mean. A lead
        seed that completed releases its configuration's other seeds; one that did not ends the
        configuration on all its seeds (they never run). Returns the trials recorded as equivalent
        (clip-equivalence), each ``{"source": Ray trial id of the same seed, "config": its trial config}``."""
        running = self.running[pid]
        self.trained += share
        running.scores[seed] = value if value is not None and math.isfinite(value) else None
        running.complete &= completed
        running.clipped[seed] = (trial_id, fully_clipped)
        running.remaining -= 1
        if running.deferred and completed:
            self.ready.append((pid, running.deferred))
            running.remaining, running.deferred = len(running.deferred), []
            return []
        running.deferred = []
        if running.remaining:
            return []
        del self.running[pid]
        if running.raced:              # further seeds: the configuration's mean over all it ran
            scores = self.scores[running.key]
            scores.update(running.scores)
            if not running.complete:
                self.complete.discard(running.key)
            self.finished[running.key] = _mean(scores)
            return []
        mean = _mean(running.scores)
        if pid.endswith("#final"):     # the answer of a proxy search: not a search result
            self.final = "done"
            return []
        # a private draw is its (C, B, η) with its own seed; the others are their indices
        indices = self.cell.indices(*self.cell.draws[running.key][:3]) if self.cell.private else running.key
        self.finished[indices] = mean
        self.scores[indices] = dict(running.scores)
        if running.complete and running.scores.keys() == set(self.seeds):
            self.complete.add(indices)
        if running.clipped and all(fully for _, fully in running.clipped.values()):
            self.fully_clipped.add(indices)
        if running.key in self.extended:   # bracketing's: no strategy proposed it
            return []
        equivalents = []
        for other in self.strategy.tell(Outcome(running.key, mean, running.clipped)):
            self.finished[other] = mean
            self.scores[other] = dict(running.scores)   # its seeds' results are its source's; racing trains its new seeds
            if indices in self.complete:
                self.complete.add(other)
            self.handed_out += 1
            for config in self.trial_configs(other):
                equivalents.append({"source": running.clipped[config["seed"]][0], "config": config})
        return equivalents

    def __setstate__(self, state: dict) -> None:
        """Read a state pickled before the signed score: a lower-is-better metric's results are
        negated into scores."""
        mode = state.pop("mode", "max")
        self.__dict__.update(state)
        if mode == "min":
            for results in (self.finished, *self.scores.values(), *(r.scores for r in self.running.values())):
                results.update({key: None if v is None else -v for key, v in results.items()})

    def best(self) -> tuple[Indices, float] | None:
        """The best finished configuration (indices, mean score), or None; of equal means the one
        with the smallest (C, B, η), as the closing lines' analysis picks it (bracketing must judge
        the edges of the optimum they report)."""
        done = [(-v, self.cell.values(i), i) for i, v in self.finished.items() if v is not None]
        if not done:
            return None
        _, _, indices = min(done)
        return indices, self.finished[indices]
