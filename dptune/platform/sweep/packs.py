"""Packed trials in a sweep (``search.pack``): trial configs that differ only in C, η and ε run as one
Ray Tune trial, each still one trial everywhere else.

The searcher (:class:`~dptune.platform.sweep.searcher.SweepSearcher`) groups the trial configs that may share a model into
packs (:mod:`dptune.platform.sweep.pack_policy`). A pack's Ray Tune config is ``{"pack": [member trial configs]}``; its
trial trains them as one batched model (:mod:`dptune.platform.sweep.dp_trial`, every trial's body) and reports, each epoch, every member's
own result under ``members``.

Everything that reads trials sees the members: a :class:`MemberTrial` is one member seen as a trial
of its own (trial id ``<pack trial id>-m<k>``, its own config, its own last result), so the store
writes one row per member (:class:`~dptune.platform.sweep.store_callback.StoreCallback`), the progress lines, the live status
and the trackers get one trial per member (:class:`PerMember`), and the scheduler stops members one
by one (:mod:`dptune.platform.sweep.schedulers`, through :class:`PackStops`). A member that diverged is recorded as
errored with its message; if the pack's trial fails, the members still running are recorded with
its error, and those that had ended keep their own status.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator

import ray
from ray import tune

from .trial_config import PACK
from ..store.records import stopped_early

#: The namespace of the Ray actor through which the scheduler tells a running pack which members to
#: stop (named per job: the sweep's driver and its trials share the job id).
STOPS_NAMESPACE = "dptune-pack-stops"


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

    @property
    def local_path(self) -> str:
        """The member's own folder in its pack's (the trackers' local files: one TensorBoard run each)."""
        return os.path.join(self.pack.local_path, f"member-{self.k}")

    def init_local_path(self) -> None:
        self.pack.init_local_path()
        os.makedirs(self.local_path, exist_ok=True)

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
        tune_keys = {k: v for k, v in result.items() if k != "members"}   # training_iteration, times, …
        for k, member in new_member_results(result):
            one = MemberTrial(trial, k)
            self.callback.on_trial_result(iteration, expand(trials), one, {**tune_keys, **member, "trial_id": one.trial_id},
                                          **info)
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
