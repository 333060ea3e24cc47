"""From a validated spec to a sweep plan: cells, pruned batch sizes, and trial configs.

Each **cell** is one point of ε × backbone × dataset × epochs (× δ). Its batch-size candidates
get σ from the accountant (all cells calibrated together, deduplicated, in parallel), are pruned
by the minimum-step and σ√T plateau rules, and at most ``max_batch_sizes`` kept B, spread across
the plateau (:func:`~.batches.spread`), are searched with the C grid and η(B) = η_ref·√(B/B_ref)·m.

A **trial config** is one flat mapping, the one Ray Tune hands to the trainable: the fields of
the trainer's ``TrainConfig`` (the cell's axes, C, B, η, the seed and the precomputed
``noise_multiplier``, so a trial never recalibrates), plus the plan's figures
(:data:`PLAN_FIELDS`: the cell id, q and T, which the trainer checks against its own, σ√T, the η
multiplier, the axis labels and, under private selection, the selection's figures).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import secrets
import zlib
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pandas as pd

from ..errors import UserError, NotFound
from ..privacy import calibrate_noise
from ..schema import BATCH_SIZE, CLIP_BOUND, LEARNING_RATE, METRICS, PLAN_FIGURES
from .batches import COLUMNS, Row, batch_rows, candidate_rows, rows_frame, spread
from .bracketing import extended, extended_batch_size
from .racing import looks
from .levers import decision_steps, halving_steps, with_levers
from .noise_table import NoiseRequest, calibrate_many
from .proxy import MIN_PROXY_SIGMA, ProxyRun, auto_divisor, proxy_run
from .search_sections import BACKBONE_FIELDS, MODEL_BASED, AxisValue, SearchSpace, TrialOptions
from .spec import Catalog, Spec

#: Keys of a trial config that are the plan's figures, not training options (declared with the
#: trial schema: :data:`dptune.schema.PLAN_FIGURES`, each with what it holds).
PLAN_FIELDS = tuple(PLAN_FIGURES)


@dataclass(frozen=True)
class Cell:
    """One point of the difficulty axes."""

    epsilon: float
    delta: float
    backbone: AxisValue
    dataset: AxisValue
    epochs: float
    options: tuple[tuple[str, Any], ...] = ()   # values of the searched trial options (a sub-cell)

    @property
    def private(self) -> bool:
        """A DP cell; ε = inf is the non-private baseline (σ = 0, no clipping)."""
        return math.isfinite(self.epsilon)

    @property
    def key(self) -> str:
        """A stable, readable id, e.g. ``digits/cnn/E=5/delta=1e-05/eps=1`` (backbone and dataset
        options in brackets: ``bbc_news[max_length=32]/hf:all-MiniLM-L6-v2[peft=lora]/…``; searched
        trial options at the end: ``…/eps=1/denoise=rmt``)."""
        return (f"{self.dataset}/{self.backbone}/E={self.epochs:g}/delta={self.delta:g}/eps={self.epsilon:g}"
                + "".join(f"/{k}={'null' if v is None else v}" for k, v in self.options))


@dataclass(frozen=True)
class CellPlan:
    """The pruned batch sizes of one cell and the configurations searched there.

    ``rows`` (and the same as a frame, ``batches``) are the cell's ``batch_plan`` rows plus
    ``searched``: the kept B that trials use, at most ``pruning.max_batch_sizes`` of them spread
    across the plateau (the smallest, the largest, evenly spaced between).
    """

    cell: Cell
    dataset_size: int
    registered: bool          # False: the dataset is not registered (planning only)
    declared: bool            # True: N was declared in the spec, not read from the data
    rows: tuple[Row, ...]
    space: SearchSpace
    #: private selection: B → the per-trial and total privacy of its σ (``SelectionPrivacy``)
    privacy: Mapping[int, Any] = field(default_factory=dict)
    validation_size: int = 0   # examples the trainer holds out for validation
    #: private selection: the K draws (C, B, η multiplier, seed), drawn when the sweep starts
    drawn: tuple | None = None

    @property
    def private(self) -> bool:
        """Private selection: K random draws, the best noisy validation score released."""
        return self.space.selection.private

    @property
    def draws(self) -> tuple[tuple[float, int, float, int], ...]:
        """Private selection: the K drawn trials (C, B, η multiplier, training seed), drawn when the
        sweep starts (:func:`secret_draws`); refused before (``dptune plan`` shows the law of K)."""
        if not self.private:
            raise ValueError("draws are for selection.mode private")
        if self.drawn is None:
            raise UserError(f"cell {self.cell.key}: K and its draws are drawn secretly when the sweep starts")
        return self.drawn

    def secret_draws(self) -> tuple[tuple[float, int, float, int], ...]:
        """K from the spec's law and K trials drawn uniformly, with replacement, from the pruned
        (C, B, η) space, each with its own training seed: all from the operating system's CSPRNG
        (``secrets``), independent of the data and of the spec. Neither K nor the draws can be
        regenerated from anything public: "Hyperparameter Tuning with Renyi Differential Privacy"
        assumes both random and unknown."""
        grid = self.grid
        uniform = (secrets.randbits(53) + 0.5) / 2 ** 53   # in (0, 1)
        k = self.space.selection.trial_count().sample(uniform) if grid else 0
        return tuple((*grid[secrets.randbelow(len(grid))], secrets.randbits(31)) for _ in range(k))

    def draw_config(self, draw: int) -> dict:
        """The trial config of private draw ``draw`` (0-based): its own training seed, the data split
        of the spec's seed (every trial sees the same train/validation/test split), the score noise,
        and the selection's figures."""
        c, b, m, seed = self.draws[draw]
        privacy = self.privacy[b]
        return {**self.trial_config(c, b, m, seed), "split_seed": int(self.space.seeds[0]), "randomness": "secure",
                "score_noise": self.space.selection.score_noise, "selection_k": len(self.draws),
                "selection_draw": int(draw), "trial_epsilon": privacy.trial_epsilon,
                "total_epsilon": privacy.total_epsilon}

    @property
    def trial(self) -> TrialOptions:
        """The trial options of this cell: the spec's, with the sub-cell's searched values."""
        return self.space.trial.variant(self.cell.options)

    @cached_property
    def batches(self) -> pd.DataFrame:
        return rows_frame(list(self.rows), [*COLUMNS, "searched"])

    @cached_property
    def searched_batch_sizes(self) -> tuple[int, ...]:
        return tuple(row[BATCH_SIZE] for row in self.rows if row["searched"])

    @cached_property
    def clip_bounds(self) -> tuple[float, ...]:
        """The C grid searched in this cell: the spec's, or under ``clip_fn: auto_s`` its largest C
        only. AUTO-S scales g_i by C/(n_i + γ) and ĝ is normalised by B·C, so the update
        (Σ g_i/(n_i + γ) + σξ)/B is the same for every C: one C stands for all (data-independent,
        so no privacy cost)."""
        if self.trial.config().get("clip_fn") == "auto_s" or not self.cell.private:  # non-private: no clipping
            return (max(self.space.clip_bounds),)
        return self.space.clip_bounds

    @cached_property
    def grid(self) -> tuple[tuple[float, int, float], ...]:
        """Every (C, B, η multiplier) of the pruned space, in a fixed order."""
        return tuple(itertools.product(self.clip_bounds, self.searched_batch_sizes,
                                       self.space.learning_rate.multipliers))

    @property
    def num_configurations(self) -> int:
        """Configurations this cell runs: the whole grid, or the per-cell budget (at most the grid);
        under private selection its K draws (before they are drawn: the law's mean, rounded)."""
        if self.private:
            return len(self.drawn) if self.drawn is not None else round(self.space.selection.mean_trials)
        size = len(self.grid)
        budget = self.space.search.budget
        return size if budget is None else min(budget, size)

    @property
    def num_trials(self) -> int:
        """Trials of this cell (for Optuna an upper bound: a converged search stops early); with proxy
        runs, the full-scale answer run once per seed too."""
        if self.private:
            return self.num_configurations
        final = 1 if self.proxied and self.grid else 0
        return (self.num_configurations + final) * len(self.space.seeds)

    def values(self, indices: tuple[int, int, int]) -> tuple[float, int, float]:
        """(C, B, η multiplier) at ``indices`` into this cell's candidates (its C grid, searched B and
        η multipliers), and beyond them in each grid's own spacing (positions below 0 or past the end:
        values bracketing added, :mod:`.bracketing`): the one conversion of a configuration's position
        to its values. Refused for a position beyond a grid of one value (it has no spacing)."""
        ci, bi, mi = indices
        values = (extended(self.clip_bounds, ci),
                  extended_batch_size(self.searched_batch_sizes, bi, self.dataset_size),
                  extended(self.space.learning_rate.multipliers, mi))
        if None in values:
            raise UserError(f"cell {self.cell.key}: no value at {indices} beyond a grid of one value")
        return values

    def indices(self, clip_bound: float, batch_size: int, lr_multiplier: float) -> tuple[int, int, int]:
        """The positions of (C, B, η multiplier) in this cell's candidates (:meth:`values` reversed)."""
        return (self.clip_bounds.index(clip_bound), self.searched_batch_sizes.index(batch_size),
                self.space.learning_rate.multipliers.index(lr_multiplier))

    def row(self, batch_size: int) -> Row:
        """The plan's row of ``batch_size``: a candidate's, or for a B that bracketing added, its own
        (:meth:`added_row`)."""
        found = next((row for row in self.rows if row[BATCH_SIZE] == batch_size), None)
        return found if found is not None else self.added_row(batch_size)

    def added_row(self, batch_size: int) -> Row:
        """The row of a B beyond the searched ones (bracketing): its q and T, σ calibrated now (cached on
        disk like the plan's), and the planner's rules applied against the cell's kept candidates
        (``reason``: ``min_steps`` or ``off_plateau`` when they would have dropped it)."""
        added = self.__dict__.setdefault("_added_rows", {})   # a frozen plan's cache, pickled with it
        if batch_size not in added:
            kept = [r for r in self.rows if r["kept"]]
            known = {(r["sample_rate"], r["steps"]): float(r["noise_multiplier"]) for r in kept}
            options, c = self.trial, self.cell

            def sigma(q: float, steps: int) -> float:
                if not c.private:
                    return 0.0
                return known.get((q, steps)) or calibrate_noise(c.epsilon, c.delta, q, steps,
                                                                norm_estimator=options.norm_estimator,
                                                                sketch_k=options.sketch_k)

            pruning = self.space.pruning
            rows = batch_rows(self.dataset_size, c.epochs, sorted({*(int(r[BATCH_SIZE]) for r in kept), batch_size}),
                              sigma, min_steps=pruning.min_steps, plateau_tol=pruning.plateau_tol)
            added[batch_size] = {**next(r for r in rows if r[BATCH_SIZE] == batch_size), "searched": True}
        return added[batch_size]

    def learning_rate(self, batch_size: int, multiplier: float) -> float:
        return self.space.learning_rate.at(batch_size, multiplier)

    def trial_config(self, clip_bound: float, batch_size: int, lr_multiplier: float, seed: int) -> dict:
        """The flat trial config of one trial (only searched B are allowed): training options and
        the plan's figures (:data:`PLAN_FIELDS`), σ once."""
        row = self.row(batch_size)   # a searched B, or one bracketing added
        c = self.cell
        sigma = float(row["noise_multiplier"])
        train = {"dataset": c.dataset.name, "model": c.backbone.name, "epsilon": c.epsilon, "delta": c.delta,
                 "epochs": c.epochs, CLIP_BOUND: float(clip_bound), BATCH_SIZE: int(batch_size),
                 LEARNING_RATE: self.learning_rate(batch_size, lr_multiplier), "seed": int(seed),
                 "noise_multiplier": sigma, **self.trial.config(), **axis_fields(c.backbone, c.dataset)}
        if self.space.selection.validation_fraction:
            train["validation_fraction"] = self.space.selection.validation_fraction
        if "model_options" in train:
            model_options = {**self.trial.config().get("model_options", {}), **train["model_options"]}
            train["model_options"] = model_options
        plan = {"cell": c.key, "metric": self.space.metric,
                "sample_rate": float(row["sample_rate"]), "steps": int(row["steps"]),
                "noise_sqrt_steps": float(row["noise_sqrt_steps"]), "lr_multiplier": float(lr_multiplier),
                "backbone_label": c.backbone.label, "dataset_label": c.dataset.label}
        if self.space.search.racing_max_seeds is not None:
            plan["looks"] = looks(self.space.seeds, self.space.search.racing_max_seeds,
                                  budget=self.space.search.racing_max_added is not None)
        return {**train, **plan}

    def proxy_divisor(self, batch_size: int) -> int:
        """k of the proxy runs standing for B = ``batch_size``: the spec's, or under ``batch_divisor:
        auto`` the largest that keeps σ/k at or above the limit (:func:`~.proxy.auto_divisor`); 1 (none)
        in a non-private cell, whose runs have no DP noise for the proxy to keep."""
        k = self.space.search.proxy_divisor
        if not self.cell.private:
            return 1
        if k == "auto":
            return auto_divisor(batch_size, float(self.row(batch_size)["noise_multiplier"]))
        return k

    @cached_property
    def proxied(self) -> bool:
        """This cell's search runs proxies (at least one searched B at B/k, k > 1)."""
        return any(self.proxy_divisor(b) > 1 for b in self.searched_batch_sizes)

    def proxy(self, batch_size: int) -> ProxyRun:
        """The proxy run standing for the full-scale runs at ``batch_size``."""
        row = self.row(batch_size)
        return proxy_run(batch_size, float(row["noise_multiplier"]), int(row["steps"]), self.dataset_size,
                         self.proxy_divisor(batch_size))

    def proxy_config(self, clip_bound: float, batch_size: int, lr_multiplier: float, seed: int) -> dict:
        """The trial config of a proxy run of (C, B, η): (B/k, σ/k, T), the same C and η; labelled
        with k and the B it stands for (its ε is its own, far above the cell's: it only ranks). A B
        whose k is 1 (``auto`` found none) runs at full scale: an ordinary trial of the cell."""
        full = self.trial_config(clip_bound, batch_size, lr_multiplier, seed)
        k = self.proxy_divisor(batch_size)
        if k == 1:
            return full
        run = self.proxy(batch_size)
        return {**full, BATCH_SIZE: run.batch_size, "epochs": run.epochs, "noise_multiplier": run.noise_multiplier,
                "sample_rate": run.sample_rate, "steps": run.steps,
                "noise_sqrt_steps": run.noise_multiplier * math.sqrt(run.steps),
                "proxy_divisor": k, "full_batch_size": int(batch_size)}

    def proxy_problems(self) -> list[str]:
        """Why this cell's proxy runs would not rank as full-scale runs do: a σ/k below
        :data:`~.proxy.MIN_PROXY_SIGMA`, or a B smaller than k (``auto`` never chooses either)."""
        k = self.space.search.proxy_divisor
        if k == "auto" or not self.proxied:
            return []
        problems = []
        for b in self.searched_batch_sizes:
            if b < k:
                problems.append(f"cell {self.cell.key}: search.proxy.batch_divisor {k} exceeds B = {b}")
                continue
            run = self.proxy(b)
            if run.noise_multiplier < MIN_PROXY_SIGMA:
                problems.append(f"cell {self.cell.key}: at B = {b} the proxy's σ' = {run.noise_multiplier:.3g} "
                                f"(at B' = {run.batch_size}) is below "
                                f"{MIN_PROXY_SIGMA:g}, where proxy runs stop ranking as full-scale ones do "
                                "(BENCHMARKS.md, Proxy runs): use a smaller search.proxy.batch_divisor")
        return problems

    def sampler_seed(self) -> int:
        """Per-cell seed of random sampling and TPE: the spec's seed and the cell id."""
        return (self.space.search.seed * 1_000_003 + zlib.crc32(self.cell.key.encode())) % 2**32

    def configurations(self) -> list[tuple[float, int, float]]:
        """The configurations a grid or random search runs, in order (random: a seeded sample)."""
        if self.private:
            return [d[:3] for d in self.draws]
        grid = self.grid
        algorithm = self.space.search.algorithm
        if algorithm == "grid":
            return list(grid)
        if algorithm == "random":
            rng = np.random.default_rng(self.sampler_seed())
            return [grid[i] for i in rng.choice(len(grid), size=self.num_configurations, replace=False)]
        raise ValueError(f"{algorithm} proposes configurations while the sweep runs; use the platform's "
                         "SweepSearcher (dptune.platform.sweep.searcher)")

    def trials(self) -> list[dict]:
        """Trial configs of a grid or random search: every configuration once per seed (private
        selection: the K draws)."""
        if self.private:
            return [self.draw_config(k) for k in range(len(self.draws))]
        return [self.trial_config(c, b, m, seed) for c, b, m in self.configurations() for seed in self.space.seeds]

    def expected_cost(self) -> tuple[float, float]:
        """(optimizer steps, examples processed) of this cell's trials; for Optuna, the budget times
        the grid average. Examples = T·B, the expected number of per-sample gradients."""
        algorithm = self.space.search.algorithm
        undrawn = self.private and self.drawn is None   # K not drawn yet: its mean over the grid
        configs = self.grid if algorithm in MODEL_BASED or undrawn else self.configurations()
        if not configs:
            return 0.0, 0.0
        steps_of = {row[BATCH_SIZE]: row["steps"] for row in self.rows}
        steps = np.array([steps_of[b] for _, b, _ in configs], dtype=float)
        batches = np.array([b for _, b, _ in configs], dtype=float)
        if self.proxied:   # proxies at B/k; the final full-scale run counted by final_cost
            batches = np.array([self.proxy(int(b)).batch_size for b in batches], dtype=float)
        examples = steps * batches
        scale = len(self.space.seeds) * (self.num_configurations / len(configs))
        return float(steps.sum() * scale), float(examples.sum() * scale)

    def run_shape(self, batch_size: int) -> tuple[int, float, int]:
        """(B, epochs, T) of the search's runs standing for ``batch_size``: its proxy's under proxy runs."""
        if self.proxied and self.proxy_divisor(batch_size) > 1:
            run = self.proxy(batch_size)
            return run.batch_size, run.epochs, run.steps
        return batch_size, self.cell.epochs, int(self.row(batch_size)["steps"])

    def decisions(self, batch_size: int) -> list[tuple[int, int]]:
        """Where the spec's scheduler may stop this cell's runs at ``batch_size`` (:func:`~.levers.decision_steps`)."""
        _, epochs, steps = self.run_shape(batch_size)
        return decision_steps(self.space.search.scheduler, epochs, steps)

    def lead_seed_first(self, batch_size: int) -> bool:
        """Whether a configuration at ``batch_size`` runs its lead seed first and its other seeds only once
        the lead passed every rung (several seeds, a scheduler that can act before the runs' end): the
        configuration is stopped or kept on all its seeds at once (:mod:`.levers`)."""
        return len(self.space.seeds) > 1 and not self.private and bool(self.decisions(batch_size))

    def halving_cost(self) -> tuple[float, float]:
        """(optimizer steps, examples) of this cell's search if each ASHA rung keeps 1/rf of the runs
        that reach it (:func:`~.levers.halving_steps`: an estimate); :meth:`expected_cost` without a scheduler."""
        if self.space.search.scheduler.name != "asha" or self.private:
            return self.expected_cost()
        configs = self.grid if self.space.search.algorithm in MODEL_BASED else self.configurations()
        if not configs:
            return 0.0, 0.0
        seeds = len(self.space.seeds)
        scale = self.num_configurations / len(configs)
        steps = examples = 0.0
        for b in self.searched_batch_sizes:   # each B is one group of the scheduler (within: batch_size)
            runs = scale * sum(1 for _, bc, _ in configs if bc == b)
            batch, epochs, full = self.run_shape(b)
            lead, alive = halving_steps(self.space.search.scheduler, epochs, full, runs)
            total = lead + (seeds - 1) * alive * full if self.lead_seed_first(b) else lead * seeds
            steps, examples = steps + total, examples + total * batch
        return steps, examples

    def final_cost(self) -> tuple[float, float]:
        """(optimizer steps, examples) of a proxy search's full-scale answer run, once per seed: at
        most those of the searched B with the most examples (which one is chosen is not known yet)."""
        if not self.proxied:
            return 0.0, 0.0
        seeds = len(self.space.seeds)
        row = max((self.row(b) for b in self.searched_batch_sizes), key=lambda r: r["steps"] * r[BATCH_SIZE])
        return float(row["steps"] * seeds), float(row["steps"] * row[BATCH_SIZE] * seeds)


@dataclass(frozen=True)
class SweepPlan:
    """Every cell of a sweep, with its pruned space; nothing has run."""

    space: SearchSpace
    cells: tuple[CellPlan, ...]
    source: str | None = None

    def __iter__(self) -> Iterator[CellPlan]:
        return iter(self.cells)

    @property
    def num_trials(self) -> int:
        return sum(c.num_trials for c in self.cells)

    @property
    def metric(self) -> str:
        """The trial metric the search and the scheduler compare (``SearchSpace.metric``)."""
        return self.space.metric

    @property
    def mode(self) -> str:
        """``max`` or ``min``: the direction of :attr:`metric` (declared in ``dptune.schema.METRICS``)."""
        return METRICS[self.metric].mode

    @property
    def expected_cost(self) -> tuple[float, float]:
        """(optimizer steps, examples processed) over all trials."""
        costs = [c.expected_cost() for c in self.cells] + [c.final_cost() for c in self.cells]
        return sum(s for s, _ in costs), sum(e for _, e in costs)

    @property
    def halving_cost(self) -> tuple[float, float]:
        """(optimizer steps, examples) over all trials if each ASHA rung keeps 1/rf (an estimate)."""
        costs = [c.halving_cost() for c in self.cells] + [c.final_cost() for c in self.cells]
        return sum(s for s, _ in costs), sum(e for _, e in costs)

    @property
    def notes(self) -> list[str]:
        """What the planner changed about the spec's space, one line each."""
        collapsed = [c for c in self.cells if len(c.clip_bounds) < len(self.space.clip_bounds)]
        auto_s = [c for c in collapsed if c.cell.private]
        notes = []
        if auto_s:
            notes.append(f"clip_fn auto_s: the update (Σ g_i/(n_i+γ) + σξ)/B does not depend on C, so the C grid "
                         f"is collapsed to C = {auto_s[0].clip_bounds[0]:g} (every C would give the same trial; "
                         "data-independent, no privacy cost)")
        if len(collapsed) > len(auto_s):
            notes.append("ε = inf: the non-private baseline clips nothing, so its cells run one C")
        return notes

    @property
    def empty_cells(self) -> list[CellPlan]:
        """Cells where pruning left no batch size (they would run nothing)."""
        return [c for c in self.cells if not c.searched_batch_sizes]

    @property
    def planning_only_datasets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.cell.dataset.name for c in self.cells if not c.registered))

    @property
    def declared_sizes(self) -> dict[str, int]:
        """Datasets whose N came from the spec, not from the data."""
        return {c.cell.dataset.name: c.dataset_size for c in self.cells if c.declared}

    @property
    def sweep_problems(self) -> list[str]:
        """Why a sweep of this plan would be refused, one line each: it would train on an
        unregistered dataset, use a declared dataset size instead of the data's, or leave a cell
        without trials (``dptune plan`` prints them; :meth:`check_runnable` raises them)."""
        problems = []
        if self.planning_only_datasets:
            problems.append(f"dataset(s) {', '.join(self.planning_only_datasets)} are not registered "
                            "(their sizes were declared for planning only)")
        elif self.declared_sizes:
            problems.append(f"dataset size(s) of {', '.join(self.declared_sizes)} were declared, not read from "
                            "the data (a sweep reads N from the data and refuses a mismatch)")
        for c in self.empty_cells:
            problems.append(f"cell {c.cell.key} keeps no batch size (lower pruning.min_steps, add smaller "
                            "batch sizes or more epochs)")
        for c in self.cells:
            problems += c.proxy_problems()
        return problems

    def check_runnable(self) -> None:
        """Raise UserError with :attr:`sweep_problems`, if there are any."""
        problems = self.sweep_problems
        if problems:
            raise UserError("; ".join(problems))

    def transfer_sources(self) -> dict[int, int]:
        """{cell: the cell it transfers from} under ``search.transfer``: cells that differ only in ε (same
        dataset, backbone, epochs, δ, options; private, not private selection) in a chain from the largest
        ε down, each from the one before it. Empty when transfer is off."""
        if self.space.search.transfer_radius is None:
            return {}
        chains: dict[tuple, list[int]] = {}
        for i, c in enumerate(self.cells):
            cell = c.cell
            if cell.private and not c.private:
                chains.setdefault((cell.dataset, cell.backbone, cell.epochs, cell.delta, cell.options), []).append(i)
        sources = {}
        for members in chains.values():
            ordered = sorted(members, key=lambda i: self.cells[i].cell.epsilon, reverse=True)
            sources.update(zip(ordered[1:], ordered[:-1]))
        return sources

    def trials(self) -> list[dict]:
        """All trial configs of a grid or random sweep, cell by cell."""
        return [t for c in self.cells for t in c.trials()]


def axis_fields(backbone: AxisValue, dataset: AxisValue) -> dict:
    """Training-config fields set by the axis values' options: ``peft``/``weights`` and the dataset
    options as fields, every other backbone option under ``model_options``."""
    options = backbone.option_dict()
    fields = {k: options.pop(k) for k in BACKBONE_FIELDS if k in options}
    if options:
        fields["model_options"] = options
    return {**fields, **dataset.option_dict()}


def _dataset_size(catalog: Catalog, dataset: AxisValue) -> int:
    options = dataset.option_dict()
    return int(catalog.dataset_size(dataset.name, **options) if options else catalog.dataset_size(dataset.name))


def _cells(space: SearchSpace) -> list[Cell]:
    """ε varies fastest, so the cells of one (dataset, backbone, epochs) are neighbours in ε; each
    combination of searched trial options (outermost) is a sub-cell of its own."""
    a = space.axes
    return [Cell(eps, delta, backbone, dataset, float(epochs), options)
            for options in space.trial.variants()
            for dataset, backbone, epochs, delta, eps in itertools.product(a.dataset, a.backbone, a.epochs,
                                                                         a.delta, a.epsilon)]


@dataclass(frozen=True)
class PlanLimits:
    """The largest plan dptune makes, checked before any σ is calibrated: a spec above one (a typo's
    10,000-value grid) is refused with the limit's name, instead of calibrating for hours."""

    max_cells: int = 2_000
    max_calibrations: int = 20_000     # cells × batch-size candidates: each a σ to calibrate (or read cached)
    max_trials: int = 1_000_000        # cells × the (C, B, η) grid × seeds, before pruning B


LIMITS = PlanLimits()


def check_size(space: SearchSpace, limits: PlanLimits = LIMITS) -> None:
    """Refuse a plan above ``limits`` (one line naming the limit; split the spec into several sweeps),
    from the spec's counts alone: before any cell is built or σ calibrated."""
    a = space.axes
    cells = math.prod(len(v) for v in (a.dataset, a.backbone, a.epochs, a.delta, a.epsilon)) * \
        math.prod(len(values) for _, values in space.trial.searched)
    grid = len(space.clip_bounds) * len(space.batch_sizes) * len(space.learning_rate.multipliers) * len(space.seeds)
    for name, value, limit in (("max_cells", cells, limits.max_cells),
                               ("max_calibrations", cells * len(space.batch_sizes), limits.max_calibrations),
                               ("max_trials", cells * grid, limits.max_trials)):
        if value > limit:
            raise UserError(f"the plan is too large: {value:,} exceeds the limit {name} = {limit:,}; split the spec into "
                            "several sweeps (fewer axis values, C, B, η or seeds each)")


def plan_sweep(spec: Spec, catalog: Catalog, *, workers: int | None = None, progress: bool = False,
               strict: bool = True, executor: Executor | None = None, draw: bool = False) -> SweepPlan:
    """Calibrate σ for every cell's batch-size candidates and prune them. ``draw`` (a sweep that
    starts): private selection's cells draw their K trials, secretly (:meth:`CellPlan.secret_draws`).

    ``workers`` processes calibrate what the accountant's cache lacks (default: all CPUs), or
    ``executor`` does (e.g. Ray tasks across a cluster).
    ``strict`` (for sweeps), before any calibration, refuses unregistered datasets and checks every
    declared size against the data (q = B/N and T must be the trainer's); after it, refuses cells
    left without a batch size. ``dptune plan`` passes False: declared sizes are used as given.
    """
    space = with_levers(SearchSpace.from_spec(spec), catalog.packable)
    check_size(space)
    unregistered = [d.name for d in space.axes.dataset if d.name not in catalog.datasets]
    if strict and unregistered:
        raise UserError(f"dataset(s) {', '.join(unregistered)} are not registered; sizes declared under "
                         "dataset_sizes are for planning only")
    sizes = {}
    for d in space.axes.dataset:
        declared = space.dataset_sizes.get(d.name)
        if declared is not None and not strict:
            sizes[d] = declared
            continue
        try:
            sizes[d] = _dataset_size(catalog, d)
        except FileNotFoundError as exc:
            hint = "" if strict else "; to plan without the data, declare its size under dataset_sizes"
            raise NotFound(f"{exc}{hint}") from None
        if declared is not None and declared != sizes[d]:
            raise UserError(f"dataset_sizes.{d.name}: declared {declared:,} training examples but the data has "
                             f"{sizes[d]:,}; σ must be calibrated for the trainer's q = B/N")
    fraction = space.selection.validation_fraction
    validation = {d: math.ceil(fraction * n) for d, n in sizes.items()}
    if fraction:   # the trainer holds ⌈f·N⌉ out for validation: σ is for the N it trains on
        sizes = {d: n - validation[d] for d, n in sizes.items()}
    trial = space.trial
    cells = _cells(space)
    candidates = {c: candidate_rows(sizes[c.dataset], c.epochs, space.batch_sizes) for c in cells}

    def request(c: Cell, q: float, steps: int) -> NoiseRequest:
        options = trial.variant(c.options)   # a searched norm estimator has its own σ
        return NoiseRequest(c.epsilon, c.delta, q, steps, options.norm_estimator, options.sketch_k, c.epochs)

    requests = [request(c, row["sample_rate"], row["steps"]) for c, rows in candidates.items()
                for row in rows if row["reason"] is None and c.private]
    if space.selection.private:
        sigmas, privacy = _selection_noise(cells, candidates, space, validation, request)
    else:
        sigmas, privacy = calibrate_many(requests, workers=workers, progress=progress, executor=executor,
                                         curves=draw), {}
    pruning = space.pruning
    plans = []
    for c in cells:
        rows = batch_rows(sizes[c.dataset], c.epochs, space.batch_sizes,
                          lambda q, t, c=c: sigmas[request(c, q, t)] if c.private else 0.0,
                          min_steps=pruning.min_steps, plateau_tol=pruning.plateau_tol)
        chosen = spread([row[BATCH_SIZE] for row in rows if row["kept"]], pruning.max_batch_sizes)
        for row in rows:
            row["searched"] = row[BATCH_SIZE] in chosen
        plans.append(CellPlan(c, sizes[c.dataset], c.dataset.name in catalog.datasets,
                              not strict and c.dataset.name in space.dataset_sizes, tuple(rows), space,
                              privacy.get(c, {}), validation[c.dataset]))
    if draw:
        plans = [dataclasses.replace(c, drawn=c.secret_draws()) if c.private else c for c in plans]
    plan = SweepPlan(space, tuple(plans), spec.source)
    if strict:
        plan.check_runnable()
    return plan


def _selection_noise(cells: list[Cell], candidates: dict, space: SearchSpace, validation: dict,
                     request: Callable[[Cell, float, int], NoiseRequest]) -> tuple[dict, dict]:
    """Private selection: for every cell and candidate B, the training σ whose repeat-and-select total
    (with the noisy score release, sensitivity 1/n_val) meets the cell's (ε, δ), from dp-accounting's
    RDP accountant; and each σ's per-trial and total ε. Returns ({NoiseRequest: σ}, {cell: {B: …}})."""
    from ..privacy.selection import calibrate_selection_noise, score_noise_multiplier, selection_privacy

    selection = space.selection
    count = selection.trial_count()
    sigmas: dict = {}
    privacy: dict = {}
    for c in cells:
        score = score_noise_multiplier(selection.score_noise, validation[c.dataset])
        for row in candidates[c]:
            if row["reason"] is not None:
                continue
            q, steps = row["sample_rate"], row["steps"]
            try:
                sigma = calibrate_selection_noise(c.epsilon, c.delta, q, steps, score_multiplier=score, count=count)
            except ValueError as exc:
                raise UserError(f"selection.score_noise: cell {c.key}: {exc}") from None
            sigmas[request(c, q, steps)] = sigma
            privacy.setdefault(c, {})[row[BATCH_SIZE]] = selection_privacy(
                sigma, q, steps, score_multiplier=score, count=count, delta=c.delta)
    return sigmas, privacy
