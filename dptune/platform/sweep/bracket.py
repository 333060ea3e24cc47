"""One cell's bracketing while the sweep runs (the rules: :mod:`dptune.search_spaces.bracketing`).

Once every configuration a cell's search handed out has its result, :meth:`Bracket.next_round`
reads the cell's seed-mean optimum (under proxy runs: the proxies' ranking, which is where C and η
were searched); for each of its C, B, η on an edge of what the cell tried, it adds the configurations
of the next value beyond it along the optimum's line, unless a rule stops that axis. The cell then
runs them (each once per seed, with multi-fidelity and packs as usual) and asks again, until no
axis is on an edge ("bracketed") or every edge is stopped by a rule. A C or B neighbour left behind by
a move along η (:func:`~dptune.search_spaces.bracketing.stale`) gets its line too, counted as an
extension of its axis (so the plan's bound on what bracketing adds holds). Its state is part of the
searcher's, so a resumed sweep continues the extension it was in.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import UserError
from ...search_spaces.bracketing import AXES, RULES, STALE_NOTE, edges, line, stale

#: A configuration's position in its cell: (C, B, η multiplier) indices.
Indices = tuple[int, int, int]


@dataclass
class Bracket:
    """A cell's bracketing: how often each axis was extended, what stopped it, what it added."""

    max_extensions: int
    extensions: list[int] = field(default_factory=lambda: [0, 0, 0])
    #: axis name → the rule that stopped its last extension (empty once bracketed)
    stopped: dict[str, str] = field(default_factory=dict)
    added: int = 0                   # configurations added (each runs once per seed)
    settled: bool = False            # no more rounds: bracketed, or every edge stopped by a rule
    #: the cell's optimum when it settled: (C, B, η multiplier) values
    optimum: tuple | None = None

    @property
    def outcome(self) -> str:
        """"bracketed", or the rules that stopped it per axis (what the closing lines say)."""
        if not self.settled:
            return "running"
        if not self.stopped:
            return "bracketed"
        return "stopped: " + "; ".join(f"{axis}: {why}" for axis, why in self.stopped.items())

    def record(self) -> dict:
        """What the experiment keeps of it (``dptune-bracketing.json``)."""
        return {"outcome": self.outcome, "settled": self.settled, "added": self.added,
                "extensions": dict(zip(AXES, self.extensions)), "stopped": dict(self.stopped),
                "optimum": None if self.optimum is None else list(self.optimum)}

    def next_round(self, search: object) -> list[Indices]:
        """The configurations of the next extension, or [] once the cell is bracketed or stopped
        (``search``: the cell's :class:`~.cell_search.CellSearch`, its results all in)."""
        best = search.best()
        if best is None:   # nothing finished: nothing to bracket
            self.settled = True
            return []
        optimum = best[0]
        self.optimum = search.cell.values(optimum)
        self.stopped = {}
        keys: list = []
        behind = stale(search.finished, optimum)
        for axis, side in edges(search.finished, optimum) + behind:
            why = self.refusal(search, optimum, axis, side)
            if why is not None:
                self.stopped[AXES[axis]] = why + (STALE_NOTE if (axis, side) in behind else "")
                continue
            new = [k for k in line(optimum, axis, side) if self._valid(search, k)]
            new = [k for k in new if k not in search.finished and k not in search.running_keys() and k not in keys]
            if new:
                self.extensions[axis] += 1
                keys += new
        if not keys:
            self.settled = True
        self.added += len(keys)
        return keys

    def refusal(self, search: object, optimum: Indices, axis: int, side: int) -> str | None:
        """The rule that stops extending ``axis`` beyond ``optimum`` on ``side``, or None."""
        if self.extensions[axis] >= self.max_extensions:
            return RULES["max_extensions"].format(n=self.max_extensions)
        cell = search.cell
        if axis == 0 and side < 0 and optimum in search.fully_clipped:
            return RULES["clip_equivalent"]
        if axis != 1:
            return None
        here = cell.values(optimum)[1]
        there = cell.values((optimum[0], optimum[1] + side, optimum[2]))[1]
        if there == here:   # the next B would pass the bound: none left between
            return RULES["min_batch"] if side < 0 else RULES["max_batch"].format(n=cell.dataset_size // 2)
        reason = cell.row(there)["reason"]
        if reason == "min_steps":
            return RULES["min_steps"].format(n=cell.space.pruning.min_steps)
        if reason is not None:
            return RULES["plateau"]
        return None

    @staticmethod
    def _valid(search: object, key: Indices) -> bool:
        """A configuration with a value on every axis (an axis of one value has none beyond it)."""
        try:
            search.cell.values(key)
        except UserError:
            return False
        return True

