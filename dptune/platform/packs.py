"""Packed trials in a sweep (``search.pack``): trial configs that differ only in C, η and ε run as one
Ray Tune trial, each still one trial everywhere else.

The searcher (:class:`~.searcher.SweepSearcher`) gathers the trial configs its cells can hand out now
and groups those that may share a model (:func:`pack_key`: everything but C, η, ε, σ and the
figures that follow from them — the same data, model, B, seed, epochs and options, so the same
Poisson batches and initial weights) into a pack of at most :attr:`PackPolicy.max_members`; a
config that cannot be packed (:meth:`PackPolicy.packable`) or has no partner runs as before. A pack's
Ray Tune config is ``{"pack": [member trial configs]}``; its trial trains them as one batched model
(:mod:`.pack_trial`) and reports, each epoch, every member's own result under ``members``.

Everything that reads trials sees the members: a :class:`MemberTrial` is one member seen as a trial
of its own (trial id ``<pack trial id>-m<k>``, its own config, its own last result), so the store
writes one row per member (:class:`~.callbacks.StoreCallback`), the progress lines, the live status
and the trackers get one trial per member (:class:`PerMember`), and the scheduler stops members one
by one (:mod:`.schedulers`, through :class:`PackStops`). A member that diverged is recorded as
errored with its message; if the pack's trial fails, the members still running are recorded with
its error, and those that had ended keep their own status.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator

import ray
from ray import tune

from ..schema.trial import PACK_MEMBER_FIELDS
from .records import stopped_early

if TYPE_CHECKING:
    from ..search_spaces.planner import CellPlan
    from ..search_spaces.search_sections import Search
    from .spec_sections import Resources

#: The key of a pack's Ray Tune config: its members' trial configs.
PACK = "pack"
#: Members of a pack at most (more share one model's memory and one step's time).
MAX_MEMBERS = 32
#: The largest B packed on a CPU: where a pack was measured to pay there (BENCHMARKS.md, session 15:
#: 2.25× at B = 32, 1.2–1.3× at B = 128, 0.8–1.0× at B = 512).
CPU_MAX_BATCH_SIZE = 128
#: Keys of a trial config that may differ between the members of a pack: the member fields and the
#: plan's figures that follow from them (the cell names ε; σ√T; η's multiplier).
MEMBER_KEYS = (*PACK_MEMBER_FIELDS, "cell", "noise_sqrt_steps", "lr_multiplier")
#: The namespace of the Ray actor through which the scheduler tells a running pack which members to
#: stop (named per job: the sweep's driver and its trials share the job id).
STOPS_NAMESPACE = "dptune-pack-stops"


@dataclass(frozen=True)
class PackPolicy:
    """Which trial configs are packed, and how many together: private ones without denoising,
    diagnostics or private selection, at B ≤ ``max_batch_size`` (None: any B, as on a GPU)."""

    max_members: int = MAX_MEMBERS
    max_batch_size: int | None = CPU_MAX_BATCH_SIZE

    @classmethod
    def for_sweep(cls, search: "Search", resources: "Resources") -> "PackPolicy | None":
        """The sweep's policy (None: nothing is packed: the lever is off, or trials span several
        workers): any B on a GPU, B ≤ :data:`CPU_MAX_BATCH_SIZE` on a CPU; at most
        ``search.pack: N`` members (default :data:`MAX_MEMBERS`)."""
        if not search.pack or resources.workers > 1:
            return None
        return cls(max_members=search.pack_members or MAX_MEMBERS,
                   max_batch_size=None if resources.gpu > 0 else CPU_MAX_BATCH_SIZE)

    def refusal(self, config: dict) -> str | None:
        """Why a trial config runs alone, not in a pack (None: it may share one)."""
        if not math.isfinite(float(config.get("epsilon", math.inf))):
            return "non-private: no clipping to pack"
        for option in ("denoise", "diagnostics"):
            if config.get(option):
                return f"{option} is not supported in a pack"
        if config.get("score_noise") is not None:
            return "private selection's noisy score has no packed path"
        if self.max_batch_size is not None and int(config.get("batch_size", 0)) > self.max_batch_size:
            return f"B > {self.max_batch_size} on a CPU, where a pack does not pay"
        return None

    def packable(self, config: dict) -> bool:
        return self.refusal(config) is None

    def cell_line(self, plan: "CellPlan") -> str:
        """What a cell packs, for ``dptune plan``: which B train in packs (of how many at most) and
        why the others run alone."""
        reasons: dict[str, list[int]] = {}
        packed = []
        for b in plan.searched_batch_sizes:
            config = {"epsilon": plan.cell.epsilon, "batch_size": b, **plan.space.trial.fixed}
            why = self.refusal(config)
            if why is None:
                packed.append(b)
            else:
                reasons.setdefault(why, []).append(b)
        parts = ([f"B={', '.join(map(str, packed))}: configurations that differ only in C, η (and ε) "
                  f"train together, ≤ {self.max_members} per pack"] if packed else [])
        parts += [f"B={', '.join(map(str, bs))}: each alone ({why})" for why, bs in reasons.items()]
        return "  packs: " + "; ".join(parts)


def pack_key(config: dict) -> str:
    """What the members of a pack share: the trial config without its :data:`MEMBER_KEYS`."""
    return repr(sorted((k, repr(v)) for k, v in config.items() if k not in MEMBER_KEYS))


def take_pack(pending: deque, policy: PackPolicy) -> list:
    """Remove from ``pending`` (entries ``(cell, proposal id, trial config)``) its first entry and
    every later one that can share its pack, up to ``policy.max_members``; the rest keep their order."""
    first = pending.popleft()
    if not policy.packable(first[2]):
        return [first]
    key, taken, rest = pack_key(first[2]), [first], deque()
    while pending:
        entry = pending.popleft()
        if len(taken) < policy.max_members and policy.packable(entry[2]) and pack_key(entry[2]) == key:
            taken.append(entry)
        else:
            rest.append(entry)
    pending.extend(rest)
    return taken


def pack_config(members: list[dict]) -> dict:
    """The Ray Tune config of a pack of trial configs (one config: that config itself)."""
    return members[0] if len(members) == 1 else {PACK: list(members)}


def member_configs(config: dict) -> list[dict]:
    """The trial configs a Ray Tune config stands for: a pack's members, or itself."""
    return list(config[PACK]) if PACK in config else [config]


def member_results(result: dict | None) -> dict[str, dict]:
    """Each member's result in a pack's result, by member index ("0", "1", …): nested as the pack
    reported it (a trial's ``last_result``), or flattened as Ray Tune hands results to its schedulers
    and searchers (``members/0/epoch``)."""
    result = result or {}
    if "members" in result:
        return {k: dict(v) for k, v in result["members"].items()}
    out: dict[str, dict] = {}
    for key, value in result.items():
        if key.startswith("members/"):
            _, k, name = key.split("/", 2)
            out.setdefault(k, {})[name] = value
    return out


def member_result(result: dict | None, k: int) -> dict:
    """Member ``k``'s last result in a pack's result (empty when it has none)."""
    return member_results(result).get(str(k), {})


def member_trial_id(trial_id: str, k: int) -> str:
    return f"{trial_id}-m{k}"


class MemberTrial:
    """Member ``k`` of a pack trial, seen as a trial of its own: its trial id, config and last
    result (``result``: one the pack trial does not hold yet — Ray Tune hands callbacks a result
    before it updates the trial); anything else (checkpoint, status, paths) is the pack trial's."""

    def __init__(self, pack: "tune.experiment.Trial", k: int, result: dict | None = None) -> None:
        self.pack, self.k, self.result = pack, k, result
        self.trial_id = member_trial_id(pack.trial_id, k)

    @property
    def config(self) -> dict:
        return self.pack.config[PACK][self.k]

    @property
    def last_result(self) -> dict:
        return self.result if self.result is not None else member_result(self.pack.last_result, self.k)

    def __getattr__(self, name: str) -> object:
        if name == "pack":
            raise AttributeError(name)
        return getattr(self.pack, name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MemberTrial) and other.trial_id == self.trial_id

    def __hash__(self) -> int:
        return hash(self.trial_id)

    def __str__(self) -> str:
        return self.trial_id

    def __getstate__(self) -> dict:   # pickled by a scheduler's state: the ids are what it keys on
        return {"trial_id": self.trial_id, "k": self.k}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, pack=None, result=None)


def is_pack(trial: "tune.experiment.Trial") -> bool:
    return isinstance(trial.config, dict) and PACK in trial.config


def members(trial: "tune.experiment.Trial") -> list:
    """A pack trial's members (:class:`MemberTrial`), or ``[trial]``."""
    if not is_pack(trial):
        return [trial]
    return [MemberTrial(trial, k) for k in range(len(trial.config[PACK]))]


def expand(trials: Iterable) -> list:
    """Every trial of ``trials`` with each pack replaced by its members."""
    return [m for t in trials for m in members(t)]


def ending(member: object, pack_error: str | None = None) -> tuple[str, str | None]:
    """How an ended trial (or pack member) is recorded: (status, error). A member's own error (it
    diverged) first; a member still running when its pack failed gets the pack's error."""
    last = member.last_result or {}
    if last.get("error"):
        return "error", str(last["error"])
    if pack_error is not None and (not isinstance(member, MemberTrial) or last.get("member_status") != "ended"):
        return "error", pack_error
    return ("stopped" if stopped_early(last) else "finished"), None


def new_member_results(result: dict) -> Iterator[tuple[int, dict]]:
    """(k, result) of each member that trained in the epoch a pack's ``result`` reports."""
    for key, member in member_results(result).items():
        if member.get("epoch") == result.get("epoch"):
            yield int(key), member


def history_of(state: dict | None, trial: object) -> list[dict]:
    """A trial's per-epoch history in its checkpoint's state (a pack member's: its own)."""
    if not state:
        return []
    if isinstance(trial, MemberTrial):
        return list(state["pack"]["histories"][trial.k])
    return list(state["history"])


@ray.remote(num_cpus=0)
class PackStops:
    """Which members of which pack trial the scheduler stopped (a pack reads it after each report)."""

    def __init__(self) -> None:
        self.stopped: dict[str, set[int]] = {}

    def stop(self, trial_id: str, k: int) -> None:
        self.stopped.setdefault(trial_id, set()).add(k)

    def of(self, trial_id: str) -> list[int]:
        return sorted(self.stopped.get(trial_id, ()))


def pack_stops(create: bool = False) -> "ray.actor.ActorHandle | None":
    """The sweep's :class:`PackStops` actor (made on first use with ``create``, by the driver), or None."""
    name = f"job-{ray.get_runtime_context().get_job_id()}"
    if create:
        return PackStops.options(name=name, namespace=STOPS_NAMESPACE, get_if_exists=True).remote()
    try:
        return ray.get_actor(name, namespace=STOPS_NAMESPACE)
    except ValueError:
        return None


class PerMember(tune.Callback):
    """Ray Tune ``callback`` with each pack trial replaced by its members (:class:`MemberTrial`):
    one start, one result per epoch each member trained, one end (complete, or error with its
    status from :func:`ending`) per member — as soon as the pack reports the member ended (it
    finished, diverged or was stopped), not when the whole pack ends."""

    def __init__(self, callback: tune.Callback) -> None:
        self.callback = callback
        self._passed_on: set[str] = set()   # member trial ids whose end was passed on

    def setup(self, **info) -> None:
        self.callback.setup(**info)

    def on_step_begin(self, iteration: int, trials: list, **info) -> None:
        self.callback.on_step_begin(iteration, expand(trials), **info)

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        self.callback.on_step_end(iteration, expand(trials), **info)

    def on_trial_start(self, iteration: int, trials: list, trial, **info) -> None:
        for member in members(trial):
            self.callback.on_trial_start(iteration, expand(trials), member, **info)

    def on_trial_restore(self, iteration: int, trials: list, trial, **info) -> None:
        for member in members(trial):
            self.callback.on_trial_restore(iteration, expand(trials), member, **info)

    def on_trial_save(self, iteration: int, trials: list, trial, **info) -> None:
        for member in members(trial):
            self.callback.on_trial_save(iteration, expand(trials), member, **info)

    def on_checkpoint(self, iteration: int, trials: list, trial, checkpoint, **info) -> None:
        for member in members(trial):
            self.callback.on_checkpoint(iteration, expand(trials), member, checkpoint, **info)

    def on_trial_recover(self, iteration: int, trials: list, trial, **info) -> None:
        for member in members(trial):
            self.callback.on_trial_recover(iteration, expand(trials), member, **info)

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info) -> None:
        if not is_pack(trial):
            self.callback.on_trial_result(iteration, trials, trial, result, **info)
            return
        for k, member in new_member_results(result):
            self.callback.on_trial_result(iteration, expand(trials), MemberTrial(trial, k), member, **info)
        for key, member in member_results(result).items():
            if member.get("member_status") == "ended":
                ended = MemberTrial(trial, int(key), member)
                self._end(iteration, trials, ended, ending(ended), **info)

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        self._ended(iteration, trials, trial, None, **info)

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        self._ended(iteration, trials, trial, "failed", **info)

    def _ended(self, iteration: int, trials: list, trial, pack_error: str | None, **info) -> None:
        if not is_pack(trial):
            hook = self.callback.on_trial_complete if pack_error is None else self.callback.on_trial_error
            hook(iteration, trials, trial, **info)
            return
        for member in members(trial):
            self._end(iteration, trials, member, ending(member, pack_error), **info)

    def _end(self, iteration: int, trials: list, member: MemberTrial, how: tuple[str, str | None], **info) -> None:
        """Pass on a member's end once (``how``: its status and error, from :func:`ending`)."""
        if member.trial_id in self._passed_on:
            return
        self._passed_on.add(member.trial_id)
        hook = self.callback.on_trial_error if how[0] == "error" else self.callback.on_trial_complete
        hook(iteration, expand(trials), member, **info)

    def on_experiment_end(self, trials: list, **info) -> None:
        self.callback.on_experiment_end(expand(trials), **info)

    def get_state(self) -> dict | None:
        return self.callback.get_state()

    def set_state(self, state: dict) -> None:
        self.callback.set_state(state)
