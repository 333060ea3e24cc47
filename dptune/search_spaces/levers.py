"""The levers that buy the same answer for less compute, on by default where they are safe.

A spec's ``search`` section may name the levers; one it does not name is decided here, from the
rest of the spec, and every decision carries the one line ``dptune plan`` prints for it:

- **multi-fidelity** (``search.scheduler``): ASHA within each (cell, B), optimizer steps as the
  resource (rungs after :data:`DEFAULT_SCHEDULER`'s ``grace_steps``·rf^k steps). With several
  seeds a configuration is decided on its *lead* seed (the first), against the other
  configurations' lead runs at the same rung — in reproducible mode they share that seed's
  batches and noise, so the comparison is paired — and its other seeds train only once the lead
  passed every rung: a configuration is stopped or kept on all its seeds at once, and every
  finished configuration has all of them (the error bars pair over seeds). Off under private
  selection (each trial releases one noisy score, at its end).
- **proxy runs** (``search.proxy``, :mod:`.proxy`): ``batch_divisor: auto``, which keeps σ/k in the
  measured region. Off by default with several seeds (the error bars compare full-scale runs of
  every configuration; a proxy search trains only its answer at full scale) and under private
  selection (a proxy spends more than the cell's ε).
- **transfer across ε** (``search.transfer``, grid only): radius 1, where cells differ only in ε. Off by
  default with several seeds: the smaller-ε cell would leave unrun the configurations far from the larger
  ε's best, and a between-cell statement ("the optimal B at ε = 1 is larger") would compare sets that
  differ by what was run, not by what was measured (seen on the default sweep: transfer from ε = 8 left
  ε = 1's B = 32 and its best η unrun).

- **packed trials** (``search.pack``, :mod:`dptune.platform.sweep.packs`): configurations that share the
  data, the model, B, the seed, the epochs and the options and differ in C, η or ε train as one
  batched model, each still its own trial in the store, the trackers and ``dptune status``, each
  stopped alone by the scheduler; the same results as apart (up to float rounding). On by default for
  backbones a pack can batch (the catalog's ``packable``); off under private selection (each of its
  trials has its own secret seed: no two share batches) and for optuna (TPE proposes one configuration at a time from the
  results so far). On a CPU only B ≤ 128 is packed (where it was measured to pay: BENCHMARKS.md).

- **bracketing** (``search.bracket``, :mod:`.bracketing`): an optimum on an edge of the C, B or η values
  its cell searched gets the next values beyond it, along its own line, until it lies inside or a
  data-independent rule stops it (at most two extensions per axis and cell by default). On by
  default; off under private selection (its K trials are drawn in advance).

- **racing** (``search.racing``, :mod:`.racing`): the configurations a cell cannot tell from its optimum
  get further seeds, up to ``max_seeds``, nearest the optimum first, within a budget (``max_added``: at
  most 0.25× the cell's compute by default; without it racing took 2.9× the default sweep's wall time,
  BENCHMARKS.md, session 21). On by default with two seeds or more; off under private selection (one
  seed each, drawn in advance) and with proxy runs (they rank at another scale).

Each is turned off by name: ``scheduler: none``, ``proxy: off``, ``transfer: off``, ``pack: off``,
``bracket: off``, ``racing: off``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Collection

from ..privacy.schedule import epoch_end_steps
from .bracketing import DEFAULT_MAX_EXTENSIONS
from .racing import DEFAULT_MAX_SEEDS
from .search_sections import MODEL_BASED, Scheduler, Search
from ..schema import BATCH_SIZE

if TYPE_CHECKING:
    from .search_sections import SearchSpace

#: What a spec that names no scheduler gets: ASHA in optimizer steps (rungs at 20·3^k steps, each
#: taken at the first epoch end past it), within each (cell, B) — the setting measured in
#: BENCHMARKS.md (session 6: the same answers as the full grid on the default sweep).
DEFAULT_SCHEDULER = Scheduler("asha", grace_steps=20, reduction_factor=3.0)
DEFAULT_PROXY_DIVISOR = "auto"
DEFAULT_TRANSFER_RADIUS = 1
#: The spec's names of the levers (keys of ``search``) and how the plan calls them.
LEVERS = {"scheduler": "multi-fidelity", "proxy": "proxy runs", "transfer": "transfer across ε",
          "pack": "packed trials", "bracket": "bracketing", "racing": "racing"}


@dataclass(frozen=True)
class Lever:
    """One lever of a sweep: on or off, and why, in one line (``dptune plan`` prints it)."""

    key: str        # the spec's name: scheduler, proxy, transfer
    on: bool
    why: str

    @property
    def line(self) -> str:
        return f"{LEVERS[self.key]}: {'on' if self.on else 'off'} — {self.why}"


def with_levers(space: "SearchSpace", packable: Collection[str] = ()) -> "SearchSpace":
    """``space`` with the levers its spec did not name decided, and why (:attr:`SearchSpace.levers`);
    ``packable``: the backbones a pack can batch."""
    search, levers = resolve_levers(space, packable)
    return dataclasses.replace(space, search=search, levers=levers)


def resolve_levers(space: "SearchSpace", packable: Collection[str] = ()) -> tuple[Search, tuple[Lever, ...]]:
    """The search with the levers the spec did not name decided, and one :class:`Lever` each."""
    search = space.search
    private = space.selection.private
    seeds = len(space.seeds)
    levers = []

    if "scheduler" in search.named:
        scheduler = search.scheduler
        levers.append(Lever("scheduler", scheduler.name != "none", "named in the spec" + _scheduler_text(scheduler)
                            if scheduler.name != "none" else "named off in the spec"))
    elif private:
        scheduler = search.scheduler
        levers.append(Lever("scheduler", False, "private selection: each trial releases one noisy score, at its end"))
    else:
        scheduler = DEFAULT_SCHEDULER
        levers.append(Lever("scheduler", True, "on by default" + _scheduler_text(scheduler)
                            + "; `search: {scheduler: none}` turns it off"))

    if "proxy" in search.named:
        divisor = search.proxy_divisor
        levers.append(Lever("proxy", divisor != 1, f"named in the spec (batch_divisor {divisor})" if divisor != 1
                            else "named off in the spec"))
    elif private:
        divisor = 1
        levers.append(Lever("proxy", False, "private selection: a proxy run spends more than the cell's ε"))
    elif seeds > 1:
        divisor = 1
        levers.append(Lever("proxy", False, f"{seeds} seeds: the error bars compare full-scale runs of every "
                                            "configuration, and a proxy search trains only its answer at full scale; "
                                            "`search: {proxy: {batch_divisor: auto}}` turns them on"))
    else:
        divisor = DEFAULT_PROXY_DIVISOR
        levers.append(Lever("proxy", True, "on by default (batch_divisor auto: k per B keeps σ/k in the measured "
                                           "region); `search: {proxy: off}` turns it off"))

    chains = len([e for e in space.axes.epsilon if math.isfinite(e)]) > 1
    if "transfer" in search.named:
        radius, scaling = search.transfer_radius, search.transfer_lr_scaling
        levers.append(Lever("transfer", radius is not None,
                            f"named in the spec (radius {radius}, lr_scaling {scaling})" if radius is not None
                            else "named off in the spec"))
    else:
        radius, scaling = None, search.transfer_lr_scaling
        if private:
            why = "private selection draws its trials independently of the data"
        elif search.algorithm != "grid":
            why = f"grid searches only ({search.algorithm}" + (": warm_start is its transfer, and prior across "
                                                               "sweeps)" if search.algorithm in MODEL_BASED else ")")
        elif not chains:
            why = "one private ε: no cells differ only in ε"
        elif seeds > 1:
            why = (f"{seeds} seeds: the error bars and the between-cell statements compare every configuration of "
                   "each cell, and transfer leaves those far from the larger ε's best unrun; "
                   "`search: {transfer: {radius: 1}}` turns it on")
        else:
            radius = DEFAULT_TRANSFER_RADIUS
            why = (f"on by default (radius {radius}): each smaller ε searched within one grid step of the larger ε's "
                   "best, once its results are in; `search: {transfer: off}` turns it off")
        levers.append(Lever("transfer", radius is not None, why))

    pack, why = _pack_lever(space, packable)
    levers.append(Lever("pack", pack, why))

    if "bracket" in search.named:
        bracket = search.bracket_extensions
        levers.append(Lever("bracket", bracket is not None, f"named in the spec (at most {bracket} extensions per axis "
                                                            "and cell)" if bracket is not None else "named off in the spec"))
    elif private:
        bracket = None
        levers.append(Lever("bracket", False, "private selection: its K trials are drawn in advance, and bracketing "
                                              "adds trials from the results"))
    else:
        bracket = DEFAULT_MAX_EXTENSIONS
        levers.append(Lever("bracket", True, f"on by default: an optimum on an edge of the C, B or η values its cell "
                                             f"searched gets the next values beyond it (at most {bracket} extensions "
                                             "per axis and cell); `search: {bracket: off}` turns it off"
                            + _selection_split(space)))

    max_seeds = search.racing_max_seeds
    if "racing" in search.named:
        levers.append(Lever("racing", max_seeds is not None, f"named in the spec: {_racing_text(search)}"
                            if max_seeds is not None else "named off in the spec"))
    elif private:
        levers.append(Lever("racing", False, "private selection: its K trials are drawn in advance, one seed each"))
    elif seeds < 2:
        levers.append(Lever("racing", False, "one seed: nothing to test a contender against the optimum with"))
    elif divisor != 1:
        levers.append(Lever("racing", False, "proxy runs rank configurations at B/k, racing compares full-scale seeds"))
    else:
        max_seeds = DEFAULT_MAX_SEEDS
        levers.append(Lever("racing", True, f"on by default with {seeds} seeds: "
                            f"{_racing_text(dataclasses.replace(search, racing_max_seeds=max_seeds))}; "
                            "`search: {racing: off}` turns it off"))

    resolved = dataclasses.replace(search, scheduler=scheduler, proxy_divisor=divisor, transfer_radius=radius,
                                   transfer_lr_scaling=scaling, pack=pack, bracket_extensions=bracket,
                                   racing_max_seeds=max_seeds)
    return resolved, tuple(levers)


def _racing_text(search: Search) -> str:
    """What racing gives, in one clause."""
    budget = ("" if search.racing_max_added is None else
              f", adding at most {search.racing_max_added:g}× the cell's compute (nearest the optimum first)")
    return (f"the configurations a cell cannot tell from its optimum get further seeds, up to "
            f"{search.racing_max_seeds} each{budget}")


def _selection_split(space: "SearchSpace") -> str:
    """What an adaptive lever selects on: an adaptive search overfits its selection split more than a
    fixed grid, so a cell without a validation split is told so."""
    if space.selection.validation_fraction > 0:
        return "; it selects on the validation split"
    return ("; no validation split: it selects on the test split, which the answer is then reported on too "
            "(`selection: {validation_fraction: 0.2}` holds one out)")


def _pack_lever(space: "SearchSpace", packable: Collection[str]) -> tuple[bool, str]:
    """Whether trials are packed, and why (see the module docstring)."""
    search = space.search
    if "pack" in search.named:
        return search.pack, "named in the spec" if search.pack else "named off in the spec"
    if space.selection.private:
        return False, "private selection: each of its trials trains with its own secret seed, so no two share a pack"
    if search.algorithm in MODEL_BASED:
        sampler = "TPE" if search.algorithm == "optuna" else "the GP sampler"
        return False, f"{search.algorithm}: {sampler} proposes one configuration at a time from the results so far"
    peft = space.trial.fixed.get("peft")
    unpackable = [b.label for b in space.axes.backbone
                  if b.name not in packable or dict(b.options).get("peft", peft) == "full"]
    if unpackable:
        return False, (f"{', '.join(unpackable)} not among the backbones packed by default "
                       f"({', '.join(packable) or 'none'}; a pretrained one with peft other than full); "
                       "`search: {pack: on}` packs any backbone")
    return True, ("on by default: configurations that differ only in C, η or ε train as one batched model, each "
                  "still its own trial (on a CPU at B ≤ 128 only, and only while the sweep measures its packs ≥ 1.2× "
                  "cheaper per configuration-step than its lone trials); `search: {pack: off}` turns it off")


def _scheduler_text(scheduler: Scheduler) -> str:
    if scheduler.name == "none":
        return ""
    unit = "optimizer steps" if scheduler.grace_steps is not None else "epochs"
    grace = scheduler.grace_steps if scheduler.grace_steps is not None else scheduler.grace_epochs
    when = (f"rungs after {grace}·{scheduler.reduction_factor:g}^k {unit}" if scheduler.name == "asha"
            else f"from {grace} {unit} on")
    within = "(cell, B)" if scheduler.within == BATCH_SIZE else "cell"
    return f" ({scheduler.name}, {when}, within each {within})"


def decision_steps(scheduler: Scheduler, epochs: float, steps: int) -> list[tuple[int, int]]:
    """Where ``scheduler`` may stop a run of ``steps`` steps over ``epochs`` epochs: (epoch end before
    the run's last step T, milestones passed by then) at every epoch end where a decision is taken.
    ASHA's milestones are grace·rf^k (steps, or epochs), each decided at the first report past it;
    the median rule decides at every epoch end from its grace on (counted as one milestone). Empty:
    nothing can be stopped at this B (a one-epoch cell, say)."""
    if scheduler.name == "none":
        return []
    ends = epoch_end_steps(epochs, steps)
    # the resource at each epoch end: optimizer steps, or the epoch's number
    resource = ends if scheduler.grace_steps is not None else list(range(1, len(ends) + 1))
    grace = scheduler.grace_steps if scheduler.grace_steps is not None else scheduler.grace_epochs
    out, decided = [], 0
    for t, r in zip(ends, resource):
        if t >= steps:
            break
        if scheduler.name == "median":
            if r >= grace:
                out.append((t, 1))
            continue
        passed = 0
        while grace * scheduler.reduction_factor ** passed <= r:
            passed += 1
        if passed > decided:   # Ray's ASHA records one milestone per report, the highest not yet recorded
            decided += 1
            out.append((t, decided))
    return out


def halving_steps(scheduler: Scheduler, epochs: float, steps: int, runs: float) -> tuple[float, float]:
    """(expected optimizer steps of ``runs`` runs of one group, how many of them train to the end) under
    ASHA if each rung keeps 1/rf of the runs that reach it, and at least one (successive halving's
    budget; ASHA's asynchronous promotions keep somewhat more): a planning estimate, not a bound.
    (runs·``steps``, runs) without a rung before T, or for the median rule."""
    if scheduler.name != "asha":
        return runs * steps, runs
    total, last, alive = 0.0, 0, float(runs)
    for t, _ in decision_steps(scheduler, epochs, steps):
        total += alive * (t - last)
        last, alive = t, max(min(1.0, runs), alive / scheduler.reduction_factor)
    return total + alive * (steps - last), alive
