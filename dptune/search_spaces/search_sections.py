"""The search-space sections of a sweep spec and the :class:`SearchSpace` they define.

::

    axes:            # difficulty axes; one cell per ε × backbone × dataset × epochs (× δ)
      epsilon: [1, 8]
      delta: 1.0e-5
      backbone: [cnn]
      dataset: [digits]
      epochs: [5, 20]
    clip_bound: [0.1, 1, 10]          # or {min: 0.1, max: 10, num: 5}: log-spaced
    batch_size: [16, 32, 64, 128, 256, 512]
    learning_rate: {reference: 2.0, reference_batch_size: 128, multipliers: [0.5, 1, 2]}
    pruning: {min_steps: 20, plateau_tol: 0.05, max_batch_sizes: 3}
    search: {algorithm: optuna, budget: 12, seed: 0}
    seeds: [0]                        # training seeds; every configuration runs once per seed
    trial: {optimizer: sgd, norm_estimator: exact}
    dataset_sizes: {cifar100: 50000}  # training-set sizes for planning without the data

η(B) = reference · √(B / reference_batch_size) · multiplier (DP-Adam's optimum scales with √B:
"On optimal hyperparameters for DP deep transfer learning" (ICLR 2026)). ``dataset_sizes`` lets ``dptune plan`` size a sweep without loading (or downloading)
the data, even for a dataset this build does not register; a strict plan (``dptune sweep``) uses
the size of the data itself and refuses a declared size that differs, or an unregistered dataset.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..privacy.validation import check_estimator
from ..schema import BATCH_SIZE, CLIP_BOUND, FIELDS, LEARNING_RATE, names
from ..schema.metrics import TASK_METRICS
from .batches import MIN_STEPS, PLATEAU_TOL
from .bracketing import DEFAULT_MAX_EXTENSIONS
from .proxy import MIN_PROXY_SIGMA
from .racing import DEFAULT_MAX_ADDED, DEFAULT_MAX_SEEDS
from .spec import (Catalog, Spec, SpecError, choice, integer, mapping, number, one_or_many, register_check,
                   register_section, spec_path)

ALGORITHMS = ("grid", "random", "optuna", "gp")
#: Other names the spec accepts for an algorithm: ``tpe`` is Optuna's TPE (``optuna``).
ALGORITHM_NAMES = {"tpe": "optuna"}
#: The algorithms that propose each configuration from the results so far (Optuna's TPE and GP samplers).
MODEL_BASED = ("optuna", "gp")
#: What an early-stopping scheduler compares a trial with: the cell's trials of the same B, or all of them.
SCHEDULER_GROUPS = (BATCH_SIZE, "cell")
#: Trial options a spec may set (the trial schema's fields with ``spec=("trial",)``).
TRIAL_OPTIONS = names(spec="trial")
#: Trial options that may be given a list of values, e.g. ``trial: {denoise: [null, rmt]}``: each value
#: is a search dimension; every cell is split into one sub-cell per combination (its key ends in
#: ``/denoise=rmt``), each with its own (C, B, η) search, budget and optimum, all counted by the plan.
SEARCHED_OPTIONS = names(searched=True)
#: Dataset options an axis value may set (the trainer's config fields that reach the loader).
DATASET_OPTIONS = names(spec="dataset")
#: Backbone options that are trainer config fields; every other backbone option is a model option
#: (``model_options``: LoRA rank, ``img_size``, attention, architecture overrides).
BACKBONE_FIELDS = names(spec="backbone")
#: Axis options that name a file or folder, read against the folder dptune runs in (``spec_path``);
#: True where a hub id may stand instead of a path.
PATH_OPTIONS = {"data_dir": False, "weights": True, "tokenizer": True}
#: Backbone families whose name may end in a local folder (``hf:<hub id or dir>``).
PATH_FAMILIES = ("hf:",)


@dataclass(frozen=True)
class AxisValue:
    """A backbone or dataset on an axis: its registered name and the options it is built with.

    In a spec it is a name (``cnn``) or a mapping with ``name`` and options
    (``{name: bbc_news, max_length: 32}``). ``label`` (also ``str()``) names the cell, e.g.
    ``bbc_news[max_length=32]``; options are kept sorted, so the label is stable.
    """

    name: str
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        if not self.options:
            return self.name
        return f"{self.name}[{','.join(f'{k}={_show(v)}' for k, v in self.options)}]"

    def option_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.options}

    def __str__(self) -> str:
        return self.label


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return "+".join(map(str, value))
    return "null" if value is None else str(value)


@dataclass(frozen=True)
class Axes:
    epsilon: tuple[float, ...]
    delta: tuple[float, ...]
    backbone: tuple[AxisValue, ...]
    dataset: tuple[AxisValue, ...]
    epochs: tuple[float, ...]
    task: str = "classification"   # the datasets' one task (classification or generation)


@dataclass(frozen=True)
class LearningRate:
    reference: float
    reference_batch_size: int
    multipliers: tuple[float, ...]

    def at(self, batch_size: int, multiplier: float) -> float:
        """η(B) = η_ref · √(B / B_ref) · multiplier."""
        return self.reference * (batch_size / self.reference_batch_size) ** 0.5 * multiplier


@dataclass(frozen=True)
class Pruning:
    min_steps: int = MIN_STEPS
    plateau_tol: float = PLATEAU_TOL
    max_batch_sizes: int | None = None   # search at most this many kept B per cell (spread: batches.spread)


SCHEDULERS = ("none", "asha", "median")
#: How a spec turns a lever off by name (``scheduler: none`` too): ``proxy: off``, ``transfer: off``.
OFF = ("off",)


@dataclass(frozen=True)
class Scheduler:
    """Early stopping within a cell (``search.scheduler``), epochs as the resource, or optimizer
    steps with ``grace_steps`` (a large-B trial's epoch is a few steps: a rung after one epoch of
    B = 512 judges 3 noisy steps; ``grace_steps`` puts the first rung after that many steps).

    ``asha``: asynchronous successive halving: rungs at grace·rf^k (epochs, or steps); a trial reaching a rung
    below the (1 − 1/rf) quantile of the cell's trials recorded there is stopped. ``median``: a
    trial whose best result so far is below the median of the cell's other trials' running means
    at the same epoch is stopped (after ``grace_epochs`` and once ``min_samples`` trials are known).
    """

    name: str = "none"
    grace_epochs: int = 1
    reduction_factor: float = 3.0
    min_samples: int = 3
    #: which trials are compared: ``batch_size`` (default) those of the cell with the same B, which
    #: share their steps per epoch; ``cell`` every trial of the cell. Across B, early epochs mislead:
    #: at B = 512 an epoch is a few steps, so large-B trials look worst at the first rung although
    #: they often end best (measured in BENCHMARKS.md, "Time to an answer").
    within: str = BATCH_SIZE
    #: the first rung in optimizer steps instead of epochs (then steps are the resource)
    grace_steps: int | None = None


@dataclass(frozen=True)
class Search:
    algorithm: str = "grid"
    budget: int | None = None            # configurations per cell (random, optuna)
    seed: int = 0                        # seeds random sampling and the TPE sampler
    startup_trials: int | None = None    # optuna: random proposals before TPE takes over
    warm_start: bool = False             # optuna: first try a finished neighbour cell's optimum
    scheduler: Scheduler = field(default_factory=Scheduler)   # early stopping within a cell
    #: proxy runs (``proxy: {batch_divisor: k}``, :mod:`.proxy`): a private cell's configurations are
    #: ranked at (B/k, σ/k, T) and its chosen one trained once at full scale; 1: no proxies; ``"auto"``:
    #: k per B, the largest that keeps σ/k at or above the measured limit
    proxy_divisor: int | str = 1
    #: transfer across cells (``transfer: {radius: r, lr_scaling: linear}``, grid only): cells that
    #: differ only in ε are searched from the largest ε down, each only within r grid steps of the
    #: previous cell's best (η moved by ε_new/ε_old first with ``lr_scaling: linear``); None: off
    transfer_radius: int | None = None
    transfer_lr_scaling: str = "none"
    #: packed trials (``pack: on | off | N``): configurations that differ only in C, η and ε train as
    #: one batched model (:mod:`dptune.platform.sweep.packs`); N: at most N members per pack (None: the default)
    pack: bool = False
    pack_members: int | None = None
    #: bracketing (``bracket: on | off | {max_extensions: N}``, :mod:`.bracketing`): an optimum on an edge of
    #: the values its cell searched gets the next values beyond it, at most N times per axis; None: off
    bracket_extensions: int | None = None
    #: configurations tried first in every cell (``start: [{clip_bound, batch_size, lr_multiplier}, …]``):
    #: (C, B, η multiplier) values, each moved to the cell's nearest searched B
    start: tuple[tuple[float, int, float], ...] = ()
    #: an earlier experiment (``prior: <folder>``) whose per-cell optima seed this sweep's cells, across ε as
    #: transfer does within one sweep (the platform reads its store)
    prior: str | None = None
    #: racing (``racing: on | off | {max_seeds: N, max_added: f}``, :mod:`.racing`): the configurations a
    #: cell cannot tell from its optimum get further seeds, up to N each; None: off
    racing_max_seeds: int | None = None
    #: racing's budget: at most f × the compute a cell's search spent is added (None: no limit)
    racing_max_added: float | None = DEFAULT_MAX_ADDED
    #: the levers (scheduler, proxy, transfer, pack, bracket, racing) the spec named; the others are
    #: decided by :func:`~.levers.resolve_levers` (on by default where they are safe)
    named: frozenset = frozenset(("scheduler", "proxy", "transfer", "pack", "bracket", "racing"))


@dataclass(frozen=True)
class TrialOptions:
    norm_estimator: str = "exact"
    sketch_k: int | None = None
    fixed: Mapping[str, Any] = field(default_factory=dict)   # every option set in the spec
    searched: tuple[tuple[str, tuple], ...] = ()   # (option, its values) of the SEARCHED_OPTIONS given lists

    def variants(self) -> list[tuple[tuple[str, Any], ...]]:
        """Every combination of the searched options' values, as ((option, value), …); [()] if none.
        Without a denoiser the ``denoise_*`` options change nothing: such combinations are one."""
        keys = [k for k, _ in self.searched]
        out: list[tuple[tuple[str, Any], ...]] = []
        for combo in itertools.product(*(v for _, v in self.searched)):
            options = tuple(zip(keys, combo))
            if dict(options).get("denoise", self.fixed.get("denoise")) is None:
                options = tuple((k, v) for k, v in options if not k.startswith("denoise_"))
            if options not in out:
                out.append(options)
        return out

    def variant(self, options: tuple[tuple[str, Any], ...]) -> "TrialOptions":
        """These options with one combination of the searched values fixed (sketch_k kept for the
        randomised estimators only)."""
        if not options:
            return self
        values = dict(options)
        estimator = values.pop("norm_estimator", self.norm_estimator)
        return TrialOptions(estimator, None if estimator == "exact" else self.sketch_k, {**self.fixed, **values})

    def config(self) -> dict:
        """Training-config fields every trial gets (the accountant's settings always); nested
        mappings are copied, so trials never share one."""
        fixed = {k: dict(v) if isinstance(v, Mapping) else v for k, v in self.fixed.items()}
        return {**fixed, "norm_estimator": self.norm_estimator, "sketch_k": self.sketch_k}


SELECTION_MODES = ("nonprivate", "private")
#: Laws of the number of trials K under private selection (``selection.distribution``; the first is the default).
DISTRIBUTIONS = ("truncated_negative_binomial", "poisson", "geometric")
#: The held-out fraction private selection scores on when the spec gives none.
PRIVATE_VALIDATION_FRACTION = 0.1
#: ``selection`` keys that only apply to ``mode: private``.
PRIVATE_SELECTION_KEYS = ("distribution", "mean_trials", "shape", "score_noise")


@dataclass(frozen=True)
class Selection:
    """How trials are compared (``selection``). ``validation_fraction`` > 0 holds out a seeded,
    stratified part of the training data: the searcher and the scheduler see validation accuracy,
    test accuracy is stored beside it for reporting, and σ is calibrated for the examples trained
    on. Selecting on validation data is NOT differentially private (stored as such).

    ``mode: private`` ("Hyperparameter Tuning with Renyi Differential Privacy", Papernot & Steinke,
    ICLR 2022): the cell's ε and δ are the budget of the released model. K trials, K drawn from
    ``distribution`` (``mean_trials``, ``shape`` η of the truncated negative binomial), each with
    hyperparameters drawn independently of the data; each releases its final validation accuracy
    plus Gaussian noise of std ``score_noise``; the best noisy score's model is released and only it
    is evaluated on the test data. σ per B is solved so the whole selection meets ε."""

    validation_fraction: float = 0.0
    mode: str = "nonprivate"
    distribution: str = DISTRIBUTIONS[0]
    mean_trials: float = 10.0
    shape: float | None = None           # truncated_negative_binomial only (default 1)
    score_noise: float = 0.05            # std of the Gaussian noise on validation accuracy
    named_metric: str | None = None      # ``selection.metric`` as the spec names it (None: the task's default)

    @property
    def private(self) -> bool:
        return self.mode == "private"

    def metric_for(self, task: str) -> str:
        """What trials are compared on: the metric the spec names, else the noisy validation score
        under private selection, else the task's metric on the validation split when there is one
        (NOT private), else on the test split (NOT private either: a diagnostic of the grid); a
        classification's accuracy, a generation's NLL (:data:`~dptune.schema.metrics.TASK_METRICS`)."""
        if self.named_metric is not None:
            return self.named_metric
        if self.private:
            return "selection_score"
        test, validation = TASK_METRICS[task]
        return validation if self.validation_fraction > 0 else test

    def trial_count(self):
        """The law of K (:class:`dptune.privacy.selection.TrialCount`)."""
        from ..privacy.selection import TrialCount

        return TrialCount.of(self.distribution, self.mean_trials, self.shape)


@dataclass(frozen=True)
class SearchSpace:
    """Everything ``plan_sweep`` needs, read from the search-space sections of a spec."""

    axes: Axes
    clip_bounds: tuple[float, ...]
    batch_sizes: tuple[int, ...]
    learning_rate: LearningRate
    pruning: Pruning
    search: Search
    seeds: tuple[int, ...]
    trial: TrialOptions
    dataset_sizes: Mapping[str, int]     # declared sizes, for planning without the data
    selection: Selection = field(default_factory=Selection)
    #: each lever on or off and why (:class:`~.levers.Lever`), once :func:`~.levers.with_levers` decided them
    levers: tuple = ()

    @property
    def metric(self) -> str:
        """The trial metric the search, the schedulers and the store compare (:meth:`Selection.metric_for`)."""
        return self.selection.metric_for(self.axes.task)

    @classmethod
    def from_spec(cls, spec: Spec) -> "SearchSpace":
        """The spec's search space as written (:func:`~.levers.with_levers` decides the levers it did not name)."""
        return cls(spec["axes"], spec[CLIP_BOUND], spec[BATCH_SIZE], spec[LEARNING_RATE], spec["pruning"],
                   spec["search"], spec["seeds"], spec["trial"], spec["dataset_sizes"], spec["selection"])


def _positive(value: Any, path: str) -> float:
    return number(value, path, gt=0)


def _epsilon(value: Any, path: str) -> float:
    """A privacy budget ε > 0, or ``inf`` (``.inf`` in YAML): the cell's non-private baseline."""
    if value in ("inf", ".inf") or (isinstance(value, float) and value == float("inf")):
        return float("inf")
    try:
        return number(value, path, gt=0)
    except SpecError:
        raise SpecError(f"{path}: must be a number > 0, or inf for the non-private baseline; got {value!r}") from None


def _name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(f"{path}: must be a name; got {value!r}")
    return value


def _axis_value(value: Any, path: str) -> AxisValue:
    """A name, or a mapping ``{name: …, option: value, …}`` (option values: scalars or lists of them)."""
    if not isinstance(value, Mapping):
        return AxisValue(_local_name(_name(value, path)))
    if "name" not in value:
        raise SpecError(f"{path}.name: required (a mapping on an axis is a name with options)")
    options = []
    for key, v in value.items():
        if key == "name":
            continue
        if isinstance(v, (list, tuple)):
            v = tuple(v)
        if isinstance(v, Mapping) or (isinstance(v, tuple) and any(isinstance(x, (Mapping, list, tuple)) for x in v)):
            raise SpecError(f"{path}.{key}: must be a value or a list of values; got {v!r}")
        options.append((str(key), spec_path(v, hub_id=PATH_OPTIONS[key]) if key in PATH_OPTIONS else v))
    return AxisValue(_local_name(_name(value["name"], f"{path}.name")), tuple(sorted(options)))


def _local_name(name: str) -> str:
    """A backbone named by a local folder (``hf:./ckpt``) with that folder read as a spec's paths are."""
    family = next((f for f in PATH_FAMILIES if name.startswith(f)), None)
    return name if family is None else family + spec_path(name[len(family):], hub_id=True)


def _choices(names: Any) -> str:
    """The names a collection (or a Registry, families included) allows, for an error message."""
    return ", ".join(names.choices() if hasattr(names, "choices") else sorted(names))


def _trial_value(key: str, value: Any, path: str, catalog: Catalog) -> Any:
    """One value of a trial option, checked by the trainer's own rule for it (the catalog's
    ``check_trial_option``; not checked when the catalog has none)."""
    if catalog.check_trial_option is None:
        return value
    try:
        return catalog.check_trial_option(key, value)
    except ValueError as exc:
        if getattr(exc, "choices", None) is not None:
            choice(value, path, exc.choices)   # "must be one of null, rmt", as YAML spells None
        allowed = getattr(exc, "allowed", None)
        raise SpecError(f"{path}: must be {allowed}; got {value!r}" if allowed else f"{path}: {exc}") from None


def _check_options(check: Any, kind: str, value: AxisValue, path: str) -> None:
    """Run the catalog's option check of a backbone or dataset (a bare name has nothing to check);
    its ValueError names the option."""
    if check is None or not value.options:
        return
    try:
        check(value.name, value.option_dict())
    except ValueError as exc:
        raise SpecError(f"{path}: {exc}") from None


@register_section("axes", required=True, summary="the difficulty axes epsilon, delta, backbone, dataset, epochs")
def parse_axes(value: Any, catalog: Catalog) -> Axes:
    raw = mapping(value, "axes", ("epsilon", "delta", "backbone", "dataset", "epochs"))
    for key in ("epsilon", "backbone", "dataset", "epochs"):
        if key not in raw:
            raise SpecError(f"axes.{key}: required (a value or a non-empty list)")
    backbones = one_or_many(raw["backbone"], "axes.backbone", _axis_value)
    many = isinstance(raw["backbone"], (list, tuple))
    for i, b in enumerate(backbones):
        path = f"axes.backbone[{i}]" if many else "axes.backbone"
        if b.name not in catalog.backbones:
            raise SpecError(f"axes.backbone: unknown backbone {b.name!r}; registered: {_choices(catalog.backbones)}")
        _check_options(catalog.check_backbone, "backbone", b, path)
    datasets = one_or_many(raw["dataset"], "axes.dataset", _axis_value)
    tasks = {d.name: catalog.task_of(d.name) if catalog.task_of is not None and d.name in catalog.datasets
             else "classification" for d in datasets}
    if len(set(tasks.values())) > 1:
        raise SpecError("axes.dataset: one task per sweep (the metric it selects on has one direction); got "
                        + ", ".join(f"{name} ({task})" for name, task in tasks.items()))
    return Axes(
        epsilon=one_or_many(raw["epsilon"], "axes.epsilon", _epsilon),
        delta=one_or_many(raw.get("delta", FIELDS["delta"].default), "axes.delta", lambda v, p: number(v, p, gt=0, lt=1)),
        backbone=backbones,
        dataset=datasets,
        epochs=one_or_many(raw["epochs"], "axes.epochs", _positive),
        task=next(iter(tasks.values())),
    )


@register_section(CLIP_BOUND, required=True, summary="the clipping-bound grid C")
def parse_clip_bound(value: Any, catalog: Catalog) -> tuple[float, ...]:
    if isinstance(value, Mapping):
        raw = mapping(value, CLIP_BOUND, ("min", "max", "num"))
        missing = [k for k in ("min", "max", "num") if k not in raw]
        if missing:
            raise SpecError(f"clip_bound.{missing[0]}: required for a log-spaced grid (min, max, num)")
        lo, hi = _positive(raw["min"], "clip_bound.min"), _positive(raw["max"], "clip_bound.max")
        num = integer(raw["num"], "clip_bound.num", ge=1)
        if num > 1 and not hi > lo:
            raise SpecError(f"clip_bound.max: must be > clip_bound.min ({lo:g}); got {hi:g}")
        return tuple(float(c) for c in np.geomspace(lo, hi, num))
    return tuple(sorted(one_or_many(value, CLIP_BOUND, _positive)))


@register_section(BATCH_SIZE, required=True, summary="the batch-size candidates B")
def parse_batch_size(value: Any, catalog: Catalog) -> tuple[int, ...]:
    return tuple(sorted(one_or_many(value, BATCH_SIZE, lambda v, p: integer(v, p, ge=1))))


@register_section(LEARNING_RATE, required=True,
                  summary="reference, reference_batch_size and multipliers of η(B) = η_ref·√(B/B_ref)·m")
def parse_learning_rate(value: Any, catalog: Catalog) -> LearningRate:
    raw = mapping(value, LEARNING_RATE, ("reference", "reference_batch_size", "multipliers"))
    for key in ("reference", "reference_batch_size"):
        if key not in raw:
            raise SpecError(f"learning_rate.{key}: required")
    return LearningRate(_positive(raw["reference"], "learning_rate.reference"),
                        integer(raw["reference_batch_size"], "learning_rate.reference_batch_size", ge=1),
                        tuple(sorted(one_or_many(raw.get("multipliers", 1.0), "learning_rate.multipliers",
                                                 _positive))))


@register_section("pruning", default={}, summary="min_steps, plateau_tol, max_batch_sizes")
def parse_pruning(value: Any, catalog: Catalog) -> Pruning:
    raw = mapping(value, "pruning", ("min_steps", "plateau_tol", "max_batch_sizes"))
    checks = {"min_steps": lambda v, p: integer(v, p, ge=1), "plateau_tol": lambda v, p: number(v, p, ge=0),
              "max_batch_sizes": lambda v, p: None if v is None else integer(v, p, ge=1)}
    return Pruning(**{k: checks[k](v, f"pruning.{k}") for k, v in raw.items()})


def parse_scheduler(value: Any) -> Scheduler:
    """``none`` (default), a name, or ``{name: asha, grace_epochs: 1, reduction_factor: 3}`` /
    ``{name: median, grace_epochs: 1, min_samples: 3}``, each with ``within: batch_size | cell``."""
    if value is None or value is False or value in OFF:
        value = {"name": "none"}
    elif isinstance(value, str):
        value = {"name": value}
    raw = mapping(value, "search.scheduler", ("name", "grace_epochs", "grace_steps", "reduction_factor", "min_samples",
                                              "within"))
    name = choice(raw.get("name", "none"), "search.scheduler.name", SCHEDULERS)
    own = {"none": (), "asha": ("grace_epochs", "grace_steps", "reduction_factor"),
           "median": ("grace_epochs", "grace_steps", "min_samples")}[name]
    if "grace_epochs" in raw and "grace_steps" in raw:
        raise SpecError("search.scheduler.grace_steps: give grace_epochs or grace_steps, not both (steps make "
                        "optimizer steps the resource)")
    for key in ("grace_epochs", "grace_steps", "reduction_factor", "min_samples"):
        if key in raw and key not in own:
            raise SpecError(f"search.scheduler.{key}: does not apply to scheduler {name}"
                            + (f" (it takes: {', '.join(own)})" if own else ""))
    checks = {"grace_epochs": lambda v, p: integer(v, p, ge=1), "grace_steps": lambda v, p: integer(v, p, ge=1),
              "reduction_factor": lambda v, p: number(v, p, gt=1),
              "min_samples": lambda v, p: integer(v, p, ge=1),
              "within": lambda v, p: choice(v, p, SCHEDULER_GROUPS)}
    return Scheduler(name, **{k: checks[k](v, f"search.scheduler.{k}") for k, v in raw.items() if k != "name"})


@register_section("search", default={}, summary="algorithm (grid, random, optuna or tpe, gp), budget, seed, scheduler, "
                                                 "proxy, transfer, pack, bracket, racing, start, prior")
def parse_search(value: Any, catalog: Catalog) -> Search:
    raw = mapping(value, "search", ("algorithm", "budget", "seed", "startup_trials", "warm_start", "scheduler", "proxy",
                                    "transfer", "pack", "bracket", "racing", "start", "prior"))
    algorithm = raw.get("algorithm", "grid")
    algorithm = choice(ALGORITHM_NAMES.get(algorithm, algorithm) if isinstance(algorithm, str) else algorithm,
                       "search.algorithm", (*ALGORITHMS, *ALGORITHM_NAMES))
    budget = raw.get("budget")
    if algorithm == "grid":
        for key in ("budget", "startup_trials", "warm_start"):
            if raw.get(key) is not None:
                raise SpecError(f"search.{key}: only applies to algorithm random or optuna (or gp) "
                                f"(a grid runs every configuration); remove it or change search.algorithm")
    elif budget is None and algorithm in MODEL_BASED:   # random: check_search_budget (not under private selection)
        raise SpecError(f"search.budget: required for algorithm {algorithm} (configurations per cell)")
    if algorithm == "random":
        for key in ("startup_trials", "warm_start"):
            if raw.get(key) is not None:
                raise SpecError(f"search.{key}: only applies to algorithm optuna or gp")
    startup = raw.get("startup_trials")
    warm = raw.get("warm_start", False)
    if not isinstance(warm, bool):
        raise SpecError(f"search.warm_start: must be true or false; got {warm!r}")
    radius, scaling = parse_transfer(raw.get("transfer"))
    if radius is not None and algorithm != "grid":
        raise SpecError(f"search.transfer: only applies to algorithm grid (optuna and gp have warm_start); got "
                        f"{algorithm}")
    return Search(algorithm, None if budget is None else integer(budget, "search.budget", ge=1),
                  integer(raw.get("seed", 0), "search.seed", ge=0),
                  None if startup is None else integer(startup, "search.startup_trials", ge=1), warm,
                  parse_scheduler(raw.get("scheduler")), parse_proxy(raw.get("proxy")), radius, scaling,
                  *parse_pack(raw.get("pack")), parse_bracket(raw.get("bracket")), parse_start(raw.get("start")),
                  parse_prior(raw.get("prior")), *parse_racing(raw.get("racing")),
                  frozenset(k for k in ("scheduler", "proxy", "transfer", "pack", "bracket", "racing") if k in raw))


#: The keys of a starting point (``search.start``), in the order of a configuration.
START_KEYS = (CLIP_BOUND, BATCH_SIZE, "lr_multiplier")


def parse_start(value: Any) -> tuple[tuple[float, int, float], ...]:
    """``search.start: [{clip_bound: C, batch_size: B, lr_multiplier: m}, …]``: configurations every cell
    tries first (B moved to the cell's nearest searched B; m the η multiplier of the learning-rate rule)."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise SpecError(f"search.start: must be a list of configurations {{clip_bound, batch_size, lr_multiplier}}; "
                        f"got {value!r}")
    out = []
    for i, point in enumerate(value):
        raw = mapping(point, f"search.start[{i}]", START_KEYS)
        missing = [k for k in START_KEYS if k not in raw]
        if missing:
            raise SpecError(f"search.start[{i}].{missing[0]}: required (a starting point is C, B and η's multiplier)")
        out.append((_positive(raw[CLIP_BOUND], f"search.start[{i}].clip_bound"),
                    integer(raw[BATCH_SIZE], f"search.start[{i}].batch_size", ge=1),
                    _positive(raw["lr_multiplier"], f"search.start[{i}].lr_multiplier")))
    return tuple(out)


def parse_prior(value: Any) -> str | None:
    """``search.prior: <experiment folder>``: an earlier sweep whose optima seed this one's cells (a
    path read as a spec's paths are; the platform checks that it holds a results store)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise SpecError(f"search.prior: must be an experiment folder (an earlier sweep's <storage>/<experiment>); "
                        f"got {value!r}")
    return spec_path(value)


TRANSFER_LR_SCALINGS = ("none", "linear")


def parse_transfer(value: Any) -> tuple[int | None, str]:
    """``search.transfer: {radius: r, lr_scaling: none|linear}`` (``true``: radius 1; ``off``/``false``: none):
    (r or None, scaling)."""
    if value is None or value is False or value in OFF:
        return None, "none"
    raw = mapping({} if value is True else value, "search.transfer", ("radius", "lr_scaling"))
    return (integer(raw.get("radius", 1), "search.transfer.radius", ge=0),
            choice(raw.get("lr_scaling", "none"), "search.transfer.lr_scaling", TRANSFER_LR_SCALINGS))


def parse_proxy(value: Any) -> int | str:
    """``search.proxy: {batch_divisor: k | auto}``: the divisor k of the proxy runs (1 when absent), or
    ``"auto"``: per B the largest power of two that keeps σ/k at or above the limit; ``off``/``false``: 1."""
    if value is None or value is False or value in OFF:
        return 1
    raw = mapping(value, "search.proxy", ("batch_divisor",))
    if "batch_divisor" not in raw:
        raise SpecError("search.proxy.batch_divisor: required (trials run at B/k and σ/k; k = 1 runs no proxies; "
                        f"auto: k per B, the largest that keeps σ/k ≥ {MIN_PROXY_SIGMA:g})")
    value = raw["batch_divisor"]
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        raise SpecError(f"search.proxy.batch_divisor: must be a whole number >= 1 or auto; got {value!r}")
    return integer(value, "search.proxy.batch_divisor", ge=1)


def _on_off_or_limit(value: Any, name: str, key: str, default: int, least: int) -> int | None:
    """``search.<name>: on | off | {<key>: N}`` (``true``/``false`` too): N (``on``: ``default``; N ≥
    ``least``), or None: off."""
    if value is True or value == "on":
        return default
    if value is None or value is False or value in OFF:
        return None
    raw = mapping(value, f"search.{name}", (key,))
    return integer(raw.get(key, default), f"search.{name}.{key}", ge=least)


def parse_bracket(value: Any) -> int | None:
    """``search.bracket: on | off | {max_extensions: N}``: at most how many extensions per axis and
    cell (``on``: :data:`~.bracketing.DEFAULT_MAX_EXTENSIONS`), or None: off."""
    return _on_off_or_limit(value, "bracket", "max_extensions", DEFAULT_MAX_EXTENSIONS, 1)


def parse_racing(value: Any) -> tuple[int | None, float | None]:
    """``search.racing: on | off | {max_seeds: N, max_added: f | off}``: at most how many seeds a
    contender gets (None: racing off) and at most how much compute racing adds as a multiple of the
    cell's before it (full trials' worth of steps; None: no limit); :data:`~.racing.DEFAULT_MAX_SEEDS` and
    :data:`~.racing.DEFAULT_MAX_ADDED` where not given."""
    if not isinstance(value, Mapping):
        return _on_off_or_limit(value, "racing", "max_seeds", DEFAULT_MAX_SEEDS, 2), DEFAULT_MAX_ADDED
    raw = mapping(value, "search.racing", ("max_seeds", "max_added"))
    added = raw.get("max_added", DEFAULT_MAX_ADDED)
    return (integer(raw.get("max_seeds", DEFAULT_MAX_SEEDS), "search.racing.max_seeds", ge=2),
            None if added is False or added in OFF else number(added, "search.racing.max_added", gt=0))


def parse_pack(value: Any) -> tuple[bool, int | None]:
    """``search.pack: on | off | N`` (``true``/``false`` too): whether configurations train in packs,
    and at most how many in one (N ≥ 2; None: the platform's default)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value >= 2:
            return True, value
    elif value is True or value == "on":
        return True, None
    elif value is None or value is False or value in OFF:
        return False, None
    raise SpecError(f"search.pack: must be on, off or the most members of one pack (a whole number >= 2); "
                    f"got {value!r}")


@register_section("seeds", default=[0], summary="training seeds")
def parse_seeds(value: Any, catalog: Catalog) -> tuple[int, ...]:
    return one_or_many(value, "seeds", lambda v, p: integer(v, p, ge=0))


@register_section("trial", default={}, summary="trial options: " + ", ".join(TRIAL_OPTIONS))
def parse_trial(value: Any, catalog: Catalog) -> TrialOptions:
    """Every option is checked by the trainer's own rule for it (:func:`_trial_value`); a list of
    values for one of the ``SEARCHED_OPTIONS`` is a search dimension."""
    raw = dict(mapping(value, "trial", TRIAL_OPTIONS))
    searched = []
    for key in SEARCHED_OPTIONS:
        if isinstance(raw.get(key), (list, tuple)):
            values = one_or_many(list(raw.pop(key)), f"trial.{key}",
                                 lambda v, p, key=key: _trial_value(key, v, p, catalog))
            searched.append((key, values))
    for key in raw:
        raw[key] = _trial_value(key, raw[key], f"trial.{key}", catalog)
    if "diagnostics" in raw:
        raw["diagnostics"] = list(raw["diagnostics"])
    if "model_options" in raw:
        raw["model_options"] = dict(raw["model_options"])
    estimator = raw.pop("norm_estimator", "exact")
    k = raw.pop("sketch_k", None)
    estimators = dict(searched).get("norm_estimator", (estimator,))
    try:
        for e in estimators:   # in a searched list, sketch_k is for the randomised estimators
            check_estimator(e, None if e == "exact" and len(estimators) > 1 else k)
    except ValueError as exc:
        raise SpecError(f"trial: {exc}") from None
    # with a searched estimator, sketch_k stays for its randomised values (TrialOptions.variant)
    return TrialOptions(estimators[0], k, raw, tuple(searched))


@register_section("selection", default={}, summary="validation_fraction (held-out part of the training data the "
                                                    "search selects on), metric (what trials are compared on: "
                                                    "test_accuracy, validation_accuracy, test_nll, validation_nll; "
                                                    "the task's by default) and mode: nonprivate, or private (K "
                                                    "random trials, noisy scores, ε of the released model)")
def parse_selection(value: Any, catalog: Catalog) -> Selection:
    raw = mapping(value, "selection", ("validation_fraction", "mode", "metric", *PRIVATE_SELECTION_KEYS))
    mode = choice(raw.get("mode", "nonprivate"), "selection.mode", SELECTION_MODES)
    if mode == "nonprivate":
        for key in PRIVATE_SELECTION_KEYS:
            if key in raw:
                raise SpecError(f"selection.{key}: only applies to selection.mode private")
        given = {"validation_fraction": number(raw["validation_fraction"], "selection.validation_fraction",
                                               ge=0, lt=0.5)} if "validation_fraction" in raw else {}
        if raw.get("metric") is not None:
            given["named_metric"] = choice(raw["metric"], "selection.metric",
                                           tuple(m for ms in TASK_METRICS.values() for m in ms))
        return Selection(**given)
    if "metric" in raw:
        raise SpecError("selection.metric: selection.mode private selects on its noisy validation accuracy; remove it")
    given = {"mode": mode, "validation_fraction": number(raw.get("validation_fraction", PRIVATE_VALIDATION_FRACTION),
                                                         "selection.validation_fraction", gt=0, lt=0.5)}
    if "distribution" in raw:
        given["distribution"] = choice(raw["distribution"], "selection.distribution", DISTRIBUTIONS)
    distribution = given.get("distribution", DISTRIBUTIONS[0])
    if raw.get("shape") is not None:
        if distribution != "truncated_negative_binomial":
            raise SpecError(f"selection.shape: only applies to distribution truncated_negative_binomial "
                            f"({distribution} fixes it)")
        given["shape"] = number(raw["shape"], "selection.shape", ge=0)
    if "mean_trials" in raw:   # K ≥ 1 always; the negative binomial and geometric laws need a mean above 1
        given["mean_trials"] = (number(raw["mean_trials"], "selection.mean_trials", ge=1) if distribution == "poisson"
                                else number(raw["mean_trials"], "selection.mean_trials", gt=1))
    if "score_noise" in raw:
        given["score_noise"] = number(raw["score_noise"], "selection.score_noise", gt=0, lt=1)
    return Selection(**given)


@register_section("dataset_sizes", default={}, summary="training-set sizes N for planning without the data")
def parse_dataset_sizes(value: Any, catalog: Catalog) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"dataset_sizes: must be a mapping of dataset name to training-set size; got {value!r}")
    return {_name(name, "dataset_sizes"): integer(size, f"dataset_sizes.{name}", ge=1) for name, size in value.items()}


@register_check
def check_datasets(spec: Spec, catalog: Catalog) -> None:
    """Every dataset on the axes is registered or has a declared size; every declared one is used."""
    declared = spec["dataset_sizes"]
    datasets = spec["axes"].dataset
    for i, value in enumerate(datasets):
        name = value.name
        if name not in catalog.datasets and name not in declared:
            raise SpecError(f"axes.dataset: unknown dataset {name!r}; "
                            f"registered: {_choices(catalog.datasets)} "
                            "(to plan for another dataset, declare its size under dataset_sizes)")
        path = f"axes.dataset[{i}]" if len(datasets) > 1 else "axes.dataset"
        unknown = [k for k, _ in value.options if k not in DATASET_OPTIONS]
        if unknown:
            raise SpecError(f"{path}.{unknown[0]}: unknown dataset option; allowed: {', '.join(DATASET_OPTIONS)}")
        if "max_length" in value.option_dict():
            integer(value.option_dict()["max_length"], f"{path}.max_length", ge=2)
        if name in catalog.datasets:
            _check_options(catalog.check_dataset, "dataset", value, path)
    names = [d.name for d in datasets]
    for name in declared:
        if name not in names:
            raise SpecError(f"dataset_sizes.{name}: not on axes.dataset ({', '.join(names)})")


@register_check
def check_scheduler(spec: Spec, catalog: Catalog) -> None:
    """An early-stopping scheduler must be able to act in every cell: its first rung (grace_epochs)
    must come before the last epoch of the shortest cell."""
    scheduler = spec["search"].scheduler
    shortest = min(spec["axes"].epochs)
    if scheduler.name != "none" and scheduler.grace_steps is None and scheduler.grace_epochs >= shortest:
        raise SpecError(f"search.scheduler.grace_epochs: must be < the smallest axes.epochs ({shortest:g}) for "
                        f"{scheduler.name} to stop anything; got {scheduler.grace_epochs}")


@register_check
def check_bracket(spec: Spec, catalog: Catalog) -> None:
    """Bracketing adds trials where the results say the optimum may lie: private selection's guarantee
    assumes K trials drawn in advance, independently of the data."""
    if spec["search"].bracket_extensions is not None and getattr(spec["selection"], "private", False):
        raise SpecError("search.bracket: bracketing adds trials from the results so far, and selection.mode private "
                        "runs K trials drawn in advance (its guarantee's assumption); remove search.bracket")


@register_check
def check_racing(spec: Spec, catalog: Catalog) -> None:
    """Racing adds seeds where the results say two configurations are close: it needs seeds to race
    on, a fixed trial count rules it out (private selection), and proxy runs rank at another scale."""
    search, seeds = spec["search"], len(spec["seeds"])
    if search.racing_max_seeds is None:
        return
    if getattr(spec["selection"], "private", False):
        raise SpecError("search.racing: racing adds seeds from the results so far, and selection.mode private "
                        "runs K trials drawn in advance, one seed each (its guarantee's assumption); remove search.racing")
    if seeds < 2:
        raise SpecError(f"search.racing: needs at least two seeds to test a contender against the optimum; seeds has "
                        f"{seeds} (give e.g. `seeds: [0, 1, 2]`, or remove search.racing)")
    if search.racing_max_seeds <= seeds:
        raise SpecError(f"search.racing.max_seeds: must exceed the {seeds} seeds of the spec (the seeds a contender "
                        f"may reach); got {search.racing_max_seeds}")
    if search.proxy_divisor != 1 and "proxy" in search.named:
        raise SpecError("search.racing: proxy runs rank configurations at B/k, and racing compares full-scale seeds; "
                        "remove one of search.proxy and search.racing")


@register_check
def check_proxy(spec: Spec, catalog: Catalog) -> None:
    """Proxy runs spend far more than the cell's ε (σ/k): private selection, which releases a
    trial of the search itself, cannot use them."""
    if spec["search"].proxy_divisor != 1 and getattr(spec["selection"], "private", False):
        raise SpecError("search.proxy: proxy runs are not private at the cell's ε, and selection.mode private "
                        "releases a searched trial; remove search.proxy or use selection.mode nonprivate")


@register_check
def check_searched_options(spec: Spec, catalog: Catalog) -> None:
    """A searched norm estimator changes σ per sub-cell; private selection accounts exact clipping
    only, so it cannot search one."""
    searched = dict(spec["trial"].searched)
    if getattr(spec["selection"], "private", False) and "norm_estimator" in searched:
        raise SpecError("trial.norm_estimator: selection.mode private accounts exact clipping only; give one value")


@register_check
def check_search_budget(spec: Spec, catalog: Catalog) -> None:
    """Random search needs a budget (except under private selection, which draws K); Optuna's random
    start-up must leave room for TPE within the budget."""
    search = spec["search"]
    if search.algorithm == "random" and search.budget is None and not spec["selection"].private:
        raise SpecError("search.budget: required for algorithm random (configurations per cell)")
    if search.startup_trials is not None and search.startup_trials > search.budget:
        raise SpecError(f"search.startup_trials: must be <= search.budget ({search.budget}); "
                        f"got {search.startup_trials}")


@register_check
def check_selection_metric(spec: Spec, catalog: Catalog) -> None:
    """The metric a sweep selects on must be one its task reports every epoch, on a split it has
    (a validation metric needs ``validation_fraction``); private selection scores accuracy, so it
    selects among classifiers only."""
    selection, task = spec["selection"], spec["axes"].task
    if selection.private and task != "classification":
        raise SpecError(f"selection.mode: private selection releases a noisy validation accuracy; the datasets are a "
                        f"{task} task (use selection.mode nonprivate)")
    metric = selection.named_metric
    if metric is None:
        return
    if metric not in TASK_METRICS[task]:
        raise SpecError(f"selection.metric: a {task} task reports {', '.join(TASK_METRICS[task])}; got {metric!r}")
    if metric.startswith("validation_") and not selection.validation_fraction > 0:
        raise SpecError(f"selection.metric: {metric} needs a validation split (selection.validation_fraction > 0)")


@register_check
def check_pairings(spec: Spec, catalog: Catalog) -> None:
    """Every backbone must be able to learn every dataset's task (a generation task needs a causal
    LM), before anything runs."""
    if catalog.check_pairing is None:
        return
    for backbone in spec["axes"].backbone:
        for dataset in spec["axes"].dataset:
            if dataset.name in catalog.datasets:
                try:
                    catalog.check_pairing(backbone.name, dict(backbone.options), dataset.name)
                except ValueError as exc:
                    raise SpecError(f"axes: {exc}") from None


@register_check
def check_private_selection(spec: Spec, catalog: Catalog) -> None:
    """Under ``selection.mode: private`` the trials must be K independent random draws that each
    release one noisy score at their end (Papernot & Steinke's guarantee assumes exactly that)."""
    if not spec["selection"].private:
        return
    search = spec["search"]
    if search.algorithm != "random":
        why = ("a grid runs a fixed list of every configuration" if search.algorithm == "grid"
               else f"{'TPE' if search.algorithm == 'optuna' else 'a GP'} chooses each configuration from earlier "
               "trials' scores on private data")
        raise SpecError(f"search.algorithm: selection.mode private needs algorithm random: {why}, so it is not K "
                        f"random draws independent of the data (the guarantee's assumption); got {search.algorithm}")
    for key, named in (("start", search.start), ("prior", search.prior)):
        if named:
            raise SpecError(f"search.{key}: selection.mode private draws its K trials independently of anything "
                            "but the spec (the guarantee's assumption); starting points or an earlier sweep's optima "
                            f"would choose them: remove search.{key}")
    if search.budget is not None:
        raise SpecError("search.budget: not used under selection.mode private: the number of trials K is drawn from "
                        "selection.distribution (a fixed count voids the guarantee); remove it")
    if search.scheduler.name != "none":
        raise SpecError(f"search.scheduler: {search.scheduler.name} stops trials on validation scores read during "
                        "training; under selection.mode private each trial releases one noisy score at its end: "
                        "use none")
    if any(e == float("inf") for e in spec["axes"].epsilon):
        raise SpecError("axes.epsilon: inf (a non-private baseline) has nothing to select privately under "
                        "selection.mode private; remove it")
    if len(spec["seeds"]) != 1:
        raise SpecError("seeds: give one seed under selection.mode private (it fixes the data split; each drawn "
                        f"trial gets its own training seed); got {len(spec['seeds'])}")
    if spec["trial"].norm_estimator != "exact":
        raise SpecError(f"trial.norm_estimator: selection.mode private accounts exact clipping only; got "
                        f"{spec['trial'].norm_estimator}")
    if spec["trial"].fixed.get("randomness", "secure") != "secure":
        raise SpecError("trial.randomness: selection.mode private always runs secure (its release is a model: its "
                        "noise, batches, scores and K must be secret); remove it or set secure")
