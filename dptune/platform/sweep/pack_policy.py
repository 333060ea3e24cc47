"""Which trial configs of a sweep train together in one pack (``search.pack``), and how the searcher
groups them: no Ray, no torch (``dptune plan`` prints each cell's packs from here).

Trial configs that may share a model (:func:`pack_key`: everything but C, η, ε, σ and the figures
that follow from them — the same data, model, B, seed, epochs and options, so the same Poisson batches
and initial weights) are grouped into a pack of at most :attr:`PackPolicy.max_members`; a config that
cannot be packed (:meth:`PackPolicy.refusal`) or has no partner runs as before. A group is split over
the trial slots free when it is handed out (:func:`take_pack`): with 12 configurations ready and two
cores free, two packs of 6 rather than one pack of 12 on one core while the other idles. On a CPU,
where a pack pays only while a step is bound by per-layer overhead rather than arithmetic (small inputs,
small B), the sweep measures its own trials (:class:`PackSpeeds`): a group keeps packing only while its
packs cost :data:`MIN_SPEEDUP` times less per configuration-step than its lone trials. A pack's Ray Tune config
is ``{"pack": [member trial configs]}``; :mod:`dptune.platform.sweep.packs` makes its members trials everywhere else.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...schema.trial import PACK_MEMBER_FIELDS
from ...schema import BATCH_SIZE
from .trial_config import PACK

if TYPE_CHECKING:
    from ...search_spaces.planner import CellPlan
    from ...search_spaces.search_sections import Search
    from .spec_sections import Resources

#: Members of a pack at most (more share one model's memory and one step's time).
MAX_MEMBERS = 32
#: The largest B packed on a CPU: where a pack was measured to pay there (BENCHMARKS.md, session 15:
#: 2.25× at B = 32, 1.2–1.3× at B = 128, 0.8–1.0× at B = 512).
CPU_MAX_BATCH_SIZE = 128
#: How much cheaper per configuration-step a CPU's packs must measure than its lone trials to go on
#: packing: a pack holds its members in one slot, giving up the parallelism of running them apart (on
#: 2 cores, a pack of 2 whose members end apart keeps its slot until the last ends). Measured here:
#: 8×8 digits 1.3–4.2× (packs go on), 28×28 MNIST 0.9–1.17× (they stop).
MIN_SPEEDUP = 1.2
#: Keys of a trial config that may differ between the members of a pack: the member fields and the
#: plan's figures that follow from them (the cell names ε; σ√T; η's multiplier).
MEMBER_KEYS = (*PACK_MEMBER_FIELDS, "cell", "noise_sqrt_steps", "lr_multiplier")


@dataclass(frozen=True)
class PackPolicy:
    """Which trial configs are packed, and how many together: those at B ≤ ``max_batch_size`` (None:
    any B, as on a GPU)."""

    max_members: int = MAX_MEMBERS
    max_batch_size: int | None = CPU_MAX_BATCH_SIZE
    #: trials the cluster runs at once (a CPU, or a GPU share, each): a group ready is split over
    #: those free rather than leave one idle
    slots: int = 1
    #: a group packs only while its packs measure cheaper per configuration-step than its lone trials
    #: (:class:`PackSpeeds`; on a CPU)
    measured: bool = False

    @classmethod
    def for_sweep(cls, search: "Search", resources: "Resources", slots: int = 1) -> "PackPolicy | None":
        """The sweep's policy (None: nothing is packed: the lever is off): any B on a GPU,
        B ≤ :data:`CPU_MAX_BATCH_SIZE` on a CPU; at most ``search.pack: N`` members (default
        :data:`MAX_MEMBERS`), over ``slots`` trial slots. A pack on several workers (``resources.workers``)
        splits its batch over them as a single trial does. On a CPU the lever on by default is measured
        (:class:`PackSpeeds`); a spec that names ``pack: on`` (or N) packs whatever the timings."""
        if not search.pack:
            return None
        cpu = resources.gpu == 0
        return cls(max_members=search.pack_members or MAX_MEMBERS, max_batch_size=CPU_MAX_BATCH_SIZE if cpu else None,
                   slots=max(1, slots), measured=cpu and "pack" not in search.named)

    def refusal(self, config: dict) -> str | None:
        """Why a trial config runs alone, not in a pack (None: it may share one)."""
        if self.max_batch_size is not None and int(config.get(BATCH_SIZE, 0)) > self.max_batch_size:
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
            config = {"epsilon": plan.cell.epsilon, BATCH_SIZE: b, **plan.space.trial.fixed}
            why = self.refusal(config)
            if why is None:
                packed.append(b)
            else:
                reasons.setdefault(why, []).append(b)
        differ = "C, η (and ε)" if math.isfinite(plan.cell.epsilon) else "η (non-private baselines)"
        parts = ([f"B={', '.join(map(str, packed))}: configurations that differ only in {differ} "
                  f"train together, ≤ {self.max_members} per pack"
                  + (f" while their packs measure ≥ {MIN_SPEEDUP:g}× cheaper per configuration-step than their "
                     "lone trials"
                     if self.measured else "")] if packed else [])
        parts += [f"B={', '.join(map(str, bs))}: each alone ({why})" for why, bs in reasons.items()]
        return "  packs: " + "; ".join(parts)


def pack_key(config: dict) -> str:
    """What the members of a pack share: the trial config without its :data:`MEMBER_KEYS`, but for a
    non-private one its ε = inf (a pack's members are all private or all non-private baselines)."""
    shared = {k: v for k, v in config.items() if k not in MEMBER_KEYS}
    if not math.isfinite(float(config.get("epsilon", math.inf))):
        shared["epsilon"] = math.inf
    return repr(sorted((k, repr(v)) for k, v in shared.items()))


class PackSpeeds:
    """Seconds per configuration-step a sweep measured, per :func:`pack_key`: of its lone trials
    (training seconds over steps) and of its packs (over the steps of every member still training:
    ``member_steps``). A key's packs pay (:meth:`pays`) until both are measured and the lone trials'
    cost per configuration-step is under :data:`MIN_SPEEDUP` times the packs'; the first configuration of a key runs
    alone (:meth:`probe`), so that there is a lone trial to compare with. The figures are the
    trials' own ``train_time_s``, taken as they ran, side by side on the same machine."""

    def __init__(self) -> None:
        #: key → {"alone" | "packed": [seconds, configuration-steps]}
        self.seconds: dict[str, dict[str, list[float]]] = {}
        #: keys whose first configuration was handed out alone to be measured
        self.probed: set[str] = set()

    def record(self, configs: list[dict], result: dict | None) -> None:
        """A trial's last result: one config's (a lone trial) or a pack's members'."""
        result = result or {}
        kind, steps = ("alone", result.get("step")) if len(configs) == 1 else ("packed", result.get("member_steps"))
        seconds = result.get("train_time_s")
        if not steps or seconds is None or not math.isfinite(float(seconds)):
            return
        total = self.seconds.setdefault(pack_key(configs[0]), {}).setdefault(kind, [0.0, 0])
        total[0] += float(seconds)
        total[1] += int(steps)

    def per_step(self, key: str) -> dict[str, float]:
        """The seconds per configuration-step measured for ``key``: ``alone`` and ``packed``, where known."""
        return {kind: s / n for kind, (s, n) in self.seconds.get(key, {}).items()}

    def pays(self, key: str) -> bool:
        measured = self.per_step(key)
        return len(measured) < 2 or measured["alone"] >= MIN_SPEEDUP * measured["packed"]

    def probe(self, key: str) -> bool:
        """Whether the next configuration of ``key`` runs alone to be measured (once per key, unless a
        lone trial of it was measured already)."""
        if key in self.probed or "alone" in self.seconds.get(key, {}):
            return False
        self.probed.add(key)
        return True


def take_pack(pending: deque, policy: PackPolicy, running: int = 0, speeds: PackSpeeds | None = None) -> list:
    """Remove from ``pending`` (entries ``(cell, proposal id, trial config)``) its first entry and
    later ones that can share its pack: of the g that can, ⌈g / free⌉ (at most ``policy.max_members``),
    where free is the slots not taken by the ``running`` trials (at least one), so that the rest can fill
    the other free slots; everything not taken keeps its order. A measured policy with ``speeds`` hands
    the first entry out alone where packs do not pay (:meth:`PackSpeeds.pays`) and to measure a
    lone trial of its group first (:meth:`PackSpeeds.probe`)."""
    first = pending.popleft()
    if not policy.packable(first[2]):
        return [first]
    key = pack_key(first[2])
    if policy.measured and speeds is not None and (not speeds.pays(key) or speeds.probe(key)):
        return [first]
    group = [i for i, entry in enumerate(pending) if policy.packable(entry[2]) and pack_key(entry[2]) == key]
    free = max(1, policy.slots - running)
    size = min(policy.max_members, math.ceil((len(group) + 1) / free))
    chosen = set(group[:size - 1])
    taken = [first] + [entry for i, entry in enumerate(pending) if i in chosen]
    rest = [entry for i, entry in enumerate(pending) if i not in chosen]
    pending.clear()
    pending.extend(rest)
    return taken


def pack_config(members: list[dict]) -> dict:
    """The Ray Tune config of a pack of trial configs (one config: that config itself)."""
    return members[0] if len(members) == 1 else {PACK: list(members)}


