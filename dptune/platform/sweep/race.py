"""One cell's racing while the sweep runs (the rules: :mod:`dptune.search_spaces.racing`).

Once a cell's search and bracketing have all their results, :meth:`Race.next_round` tests every
configuration that trained to its end on all its seeds against the cell's optimum, with the error
bars' own test corrected for the K settings and the L looks
(:func:`~dptune.search_spaces.comparisons.against_best`); the contenders (those it cannot tell from the optimum, the optimum among them)
get the next round's seeds they lack, the others nothing — nearest the optimum first, while the
cell's budget (``max_added`` × the compute it spent before racing, in full trials' worth of steps:
a trial multi-fidelity stopped counts its share) can carry every admitted contender to the last
round's seeds (each raced trial trains to the end). The cell runs them (all seeds at once,
left alone by the scheduler) and asks again, until one contender is left or the last round's seeds
are in. Its state is part of the searcher's, so a resumed sweep continues the round it was in.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...search_spaces.comparisons import ALPHA, against_best
from ...search_spaces.racing import seed_rounds
from .bracket import Indices


@dataclass
class Race:
    """A cell's racing: its seed rounds, the round it reached, the contenders of each round."""

    rounds: list[tuple[int, ...]]
    paired: bool = True                  # runs paired by seed (reproducible); Welch's test under secure randomness
    max_added: float | None = None       # at most this × the cell's compute before racing is added (None: no limit)
    allowance: int | None = None         # that many full trials, fixed when the first round is asked for
    admitted: list[int] = field(default_factory=list)   # contenders given seeds per round run (within the budget)
    left_out: int = 0                    # contenders of the last round run that the budget left on fewer seeds
    round: int = 0                       # the seed round the contenders have reached
    added: int = 0                       # trials added (one per contender and new seed)
    contenders: list[int] = field(default_factory=list)   # contenders per round run
    settled: bool = False

    @classmethod
    def of(cls, seeds: tuple[int, ...], max_seeds: int, paired: bool = True,
           max_added: float | None = None) -> "Race":
        return cls(seed_rounds(seeds, max_seeds, budget=max_added is not None), paired, max_added)

    @property
    def looks(self) -> int:
        """L: the tests a configuration may face (one per seed round)."""
        return len(self.rounds)

    def record(self) -> dict:
        """What the experiment keeps of it (beside bracketing's, ``dptune-bracketing.json``)."""
        return {"looks": self.looks, "seeds": len(self.rounds[self.round]), "added": self.added,
                "contenders": list(self.contenders), "admitted": list(self.admitted),
                "settled": self.settled, "left_out": self.left_out,
                "allowance": self.allowance}

    def next_round(self, search: object) -> list[tuple[Indices, tuple[int, ...]]]:
        """(configuration, the seeds it lacks) for each contender of the next round, or [] once the
        cell is decided or its last round is in (``search``: the cell's
        :class:`~.cell_search.CellSearch`, its results all in)."""
        contenders = self.contending(search)
        if self.allowance is None and self.max_added is not None:
            self.allowance = int(self.max_added * search.trained)
        target = self.rounds[min(self.round + 1, len(self.rounds) - 1)]
        needs, reserved = [], self.added
        for key in contenders:   # nearest the optimum first, each if the budget carries it to the last round
            to_end = sum(s not in search.scores[key] for s in self.rounds[-1])
            if self.allowance is not None and reserved + to_end > self.allowance:
                continue
            reserved += to_end
            needs.append((key, tuple(s for s in target if s not in search.scores[key])))
        self.left_out = len(contenders) - len(needs)
        needs = [(key, seeds) for key, seeds in needs if seeds]
        if len(contenders) < 2 or not needs:
            self.settled = True
            return []
        self.round = min(self.round + 1, len(self.rounds) - 1)
        self.contenders.append(len(contenders))
        self.admitted.append(len(needs))
        self.added += sum(len(seeds) for _, seeds in needs)
        return needs

    def contending(self, search: object) -> list[Indices]:
        """The configurations the test cannot tell from the cell's optimum (the optimum first, then by
        mean, best first), among those with a full result on every seed they ran."""
        ordered = sorted(search.scores.items(), key=lambda kv: search.cell.values(kv[0]))   # ties as the analysis
        scores = {key: values for key, values in ordered if key in search.complete and None not in values.values()}
        if not scores:
            return []
        seeds = sorted({s for values in scores.values() for s in values})
        table = np.array([[values.get(s, np.nan) for s in seeds] for values in scores.values()], dtype=float)
        best, p = against_best(table, self.looks, self.paired)
        order = sorted(range(len(table)), key=lambda i: (i != best, -np.nanmean(table[i])))
        keys = list(scores)
        return [keys[i] for i in order if i == best or p[i] >= ALPHA]
