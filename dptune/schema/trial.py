"""The trial schema: one training run (a trial), declared once, each field with its role.

Each field of :class:`TrainConfig` declares its default, its help text, its rule (the registry its
values come from, or a check with the words that say what is allowed) and its **role**:

==================  =========================================================================
role                the field is …
==================  =========================================================================
``axis``            a difficulty axis of the sweep (dataset, model, ε, δ, epochs): its cells
``hyperparameter``  searched in every cell (C, B, η): the heatmaps' and the optimum's columns
``option``          a trial option (optimizer, clipping, norm estimator, denoising, …)
``seed``            the training seed; seeds of one configuration are averaged
``planned``         set by the planner, never by hand (σ, the validation split, the noisy score)
==================  =========================================================================

and where it goes: ``spec`` (the spec sections that may set it: ``trial``, or a ``backbone`` /
``dataset`` axis value's options), ``searched`` (a list of values in ``trial`` is a search
dimension), ``column`` (a column of the store's ``trials`` table, and of the analysis), ``cell``
(trials that differ in it are different cells in the analysis). Everyone derives from these:
the spec's ``trial`` section and its checks (:func:`check_option`, handed to the spec parser by the
platform's catalog), the ``dptune train`` flags, the flat Ray config, the store's columns, the
analysis' cell and hyperparameter columns, the trackers' parameters and ``dptune status``. A new
option is one declaration here (``tests/test_trial_schema.py`` adds one and finds it everywhere).
Torch-free and Ray-free: planning and the analysis read it without the trainer. The metrics a trial
reports, with their direction, are declared in :mod:`.metrics`; the plan's own figures in
:data:`PLAN_FIGURES`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Collection

from ..errors import UserError
from .option_registries import (CLIP_FNS, DENOISE_SCOPES, DENOISERS, DIAGNOSTICS, NORM_ENGINES, OPTIMIZERS,
                               PEFT_METHODS, PRECISIONS, RANDOMNESS)


class OptionError(UserError):
    """A training option outside its rule: ``option`` must be ``allowed``; got ``value``.
    ``choices``: the names allowed, when the rule is a registry (``None`` among them if optional)."""

    def __init__(self, option: str, allowed: str, value: object, choices: tuple | None = None) -> None:
        self.option, self.allowed, self.value, self.choices = option, allowed, value, choices
        super().__init__(f"{option} must be {allowed}; got {value!r}")


@dataclass(frozen=True)
class Rule:
    """A check of one value and the words that say what passes it."""

    ok: Callable[[Any], bool]
    allowed: str


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def above(low: float, *, finite: bool = False) -> Rule:
    return Rule(lambda v: _number(v) and v > low and (not finite or math.isfinite(v)), f"a number > {low:g}")


def at_least(low: float) -> Rule:
    return Rule(lambda v: _number(v) and math.isfinite(v) and v >= low, f"a number >= {low:g}")


def whole(low: int) -> Rule:
    return Rule(lambda v: _whole(v) and v >= low, f"a whole number >= {low}")


#: The roles of a field (see the module's docstring).
ROLES = ("axis", "hyperparameter", "option", "seed", "planned")


def option(default: Any, help: str, *, choices: Collection[str] | None = None, rule: Rule | None = None,
           optional: bool = False, many: bool = False, factory: Callable[[], Any] | None = None,
           role: str = "option", spec: tuple[str, ...] = (), searched: bool = False, column: bool = False,
           cell: bool = False) -> Any:
    """A config field: its default, its help text, its rule (the registry or names its values come
    from, or a check; ``optional``: ``None`` is allowed besides; ``many``: a list of such names;
    ``factory`` makes a mutable default), its ``role`` and where it goes:
    the spec sections that set it, whether a list of values is searched, whether the store keeps it
    as a column and whether it splits the analysis' cells (a cell-splitting field is a column)."""
    assert role in ROLES, role
    metadata = {"help": help, "choices": choices, "rule": rule, "optional": optional or default is None,
                "many": many, "role": role, "spec": spec, "searched": searched, "column": column or cell, "cell": cell}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class TrainConfig:
    dataset: str = option("digits", "registered dataset (digits, mnist5k, bbc_news, cifar100, …)",
                          rule=Rule(lambda v: isinstance(v, str) and bool(v), "a dataset name"),
                          role="axis", column=True)
    model: str = option("cnn", "registered model (mlp, cnn, wrn16_4, all-MiniLM-L6-v2, "
                               "vit_tiny_patch16_224.augreg_in21k, timm:<name>, hf:<hub id or dir>, …)",
                        rule=Rule(lambda v: isinstance(v, str) and bool(v), "a model name"), role="axis", column=True)
    epsilon: float = option(8.0, "privacy budget ε; 'inf' trains the non-private baseline",
                            rule=Rule(lambda v: _number(v) and v > 0, "> 0 (or inf for non-private training)"),
                            role="axis", column=True)
    delta: float = option(1e-5, "δ", rule=Rule(lambda v: _number(v) and 0 < v < 1, "in (0, 1)"),
                          role="axis", cell=True)
    clip_bound: float = option(1.0, "clipping bound C", rule=above(0, finite=True), role="hyperparameter", column=True)
    batch_size: int = option(128, "expected (Poisson) batch size B", rule=whole(1), role="hyperparameter", column=True)
    learning_rate: float = option(2.0, "learning rate η (ĝ is normalised by B·C, so η does not move with C)",
                                  rule=above(0, finite=True), role="hyperparameter", column=True)
    epochs: float = option(10.0, "epochs E: the run takes T = ⌈E·N/B⌉ steps", rule=above(0, finite=True),
                           role="axis", column=True)
    optimizer: str = option("sgd", "optimizer of the privatised gradient", choices=OPTIMIZERS,
                            spec=("trial",), cell=True)
    momentum: float = option(0.0, "SGD momentum", rule=at_least(0), spec=("trial",), cell=True)
    weight_decay: float = option(0.0, "weight decay", rule=at_least(0), spec=("trial",), cell=True)
    clip_fn: str = option("flat", "per-sample clipping: flat min(1, C/n_i), or auto_s C/(n_i + γ) (AUTO-S)",
                          choices=CLIP_FNS, spec=("trial",), searched=True, cell=True)
    norm_estimator: str = option("exact", "per-sample norms: exact, or randomized clipping (Hutchinson / Hutch++ "
                                          "with --sketch-k probes; σ is calibrated with its accountant)",
                                 choices=NORM_ENGINES, spec=("trial",), searched=True, cell=True)
    sketch_k: int | None = option(None, "probes k of hutchinson / hutchpp (e.g. 32)", rule=whole(1),
                                  spec=("trial",), cell=True)
    denoise: str | None = option(None, "denoise the privatised gradient of 2-D parameters (rmt: RMT spectral "
                                       "shrinkage; post-processing, no privacy cost)", choices=DENOISERS,
                                 spec=("trial",), searched=True, cell=True)
    denoise_kappa: float = option(1.02, "RMT gate κ: a layer is denoised only if its top singular value exceeds κ "
                                        "times the noise bulk edge s(√m+√n)",
                                  rule=Rule(lambda v: _number(v) and math.isfinite(v) and v >= 1,
                                            "a number >= 1 (the RMT gate sits at κ times the noise bulk edge)"),
                                  spec=("trial",), searched=True, cell=True)
    denoise_norm_correction: bool = option(True, "RMT: rescale the denoised matrix to ‖ĝ‖_F (the paper's norm "
                                                 "correction); false keeps the shrunk matrix (an ablation)",
                                           rule=Rule(lambda v: isinstance(v, bool), "true or false"),
                                           spec=("trial",), searched=True, cell=True)
    denoise_scope: str = option("all", "which 2-D parameters are denoised: all, or lora (LoRA factors only)",
                                choices=DENOISE_SCOPES, spec=("trial",), searched=True, cell=True)
    diagnostics: list = option(
        [], "non-private diagnostics (denoise_cosine: per step and 2-D layer, cosine of ĝ and of its denoised version "
            "to the clipped mean before noise; NOT private; nothing to measure without noise, so a non-private run "
            "(ε = inf) ignores it)", choices=DIAGNOSTICS, many=True, factory=list, spec=("trial",))
    max_physical_batch_size: int | None = option(None, "split logical batches into micro-batches of this size "
                                                       "(memory only; same result)", rule=whole(1), spec=("trial",))
    seed: int = option(0, "seed of the data split and the model; of the batches and the noise too with "
                          "--randomness reproducible", rule=whole(0), role="seed", column=True)
    randomness: str = option("reproducible", "where the batches, the noise and the probes come from: reproducible "
                                             "(derived from --seed: for research, NOT for release, as anyone with "
                                             "the seed can regenerate the noise) or secure (a fresh secret from the "
                                             "OS keys a CSPRNG for every run: the model may be released)",
                             choices=RANDOMNESS, spec=("trial",), column=True)
    device: str = option("auto", "auto, cpu, cuda or cuda:N",
                         rule=Rule(lambda v: isinstance(v, str) and bool(v), "a device name (auto, cpu, cuda, cuda:N)"),
                         spec=("trial",))
    precision: str = option("fp32", "mixed precision of training: fp32, or bf16 / fp16 autocast of the forward and "
                                    "backward only (float32 master weights; per-example norms, clipping, sums and "
                                    "noise stay float32; fp16 backpropagates a static loss scale and never skips a "
                                    "step)", choices=PRECISIONS, spec=("trial",), searched=True, cell=True)
    noise_multiplier: float | None = option(None, "σ precomputed by a planner [calibrated here from ε, δ, q, T]",
                                            rule=at_least(0), role="planned")
    model_options: dict = option(
        {}, "architecture overrides for the model, as a JSON object (e.g. '{\"hidden\": 64}')",
        rule=Rule(lambda v: isinstance(v, dict), "a mapping of architecture overrides"), factory=dict, spec=("trial",))
    peft: str | None = option(None, "pretrained backbones: what is trained (film: norm scale/bias + head; lora: "
                                    "adapters + head; head; full) [the backbone's default: film for ViT, lora for "
                                    "text]", choices=PEFT_METHODS, spec=("trial", "backbone"), cell=True)
    weights: str | None = option(None, "pretrained backbones: a local checkpoint file or directory, or 'random' "
                                       "[hub, or the HF cache when the hub is unreachable]",
                                 rule=Rule(lambda v: isinstance(v, str) and bool(v), "a path or 'random'"),
                                 spec=("backbone",))
    data_dir: str | None = option(None, "local copy of an HF dataset: a save_to_disk directory, Parquet files or an "
                                        "image folder", rule=Rule(lambda v: isinstance(v, str) and bool(v), "a path"),
                                  spec=("dataset",))
    max_length: int | None = option(None, "text: tokens per example [the dataset's default: 128 for classification, "
                                          "256 for generation]", rule=whole(2), spec=("dataset",))
    test_size: float | None = option(None, "fraction of a dataset held out as its test split, where it has none of its "
                                           "own [0.2]; the rest is trained on (N)",
                                     rule=Rule(lambda v: _number(v) and 0 < v < 1, "in (0, 1)"), spec=("dataset",))
    prompt_field: str | None = option(None, "generation data (text_pairs): the field holding each prompt [prompt]",
                                      rule=Rule(lambda v: isinstance(v, str) and bool(v), "a field name"),
                                      spec=("dataset",))
    completion_field: str | None = option(None, "generation data (text_pairs): the field holding each completion "
                                                "[completion]", rule=Rule(lambda v: isinstance(v, str) and bool(v),
                                                                          "a field name"), spec=("dataset",))
    generation_examples: int | None = option(None, "generation tasks: greedy completions of this many test prompts "
                                                   "are scored (ROUGE-L, BLEU) at the end of training [all; 0: none]",
                                             rule=whole(0), spec=("trial",))
    max_new_tokens: int = option(32, "generation tasks: tokens generated per test prompt at most", rule=whole(1),
                                 spec=("trial",))
    validation_fraction: float = option(0.0, "hold out this seeded, stratified fraction of the training data for "
                                             "selection: the sweep then selects on validation accuracy, test accuracy "
                                             "is reported beside it (selection on it is NOT private); σ is calibrated "
                                             "for the examples actually trained on [0: no validation split]",
                                        rule=Rule(lambda v: _number(v) and 0 <= v < 1, "in [0, 1)"), role="planned")
    split_seed: int | None = option(None, "seed of the train/test and validation splits [seed]; private selection "
                                          "fixes it per cell so every trial sees the same split", rule=whole(0),
                                    role="planned")
    score_noise: float | None = option(None, "private selection: evaluate nothing during training, then release the "
                                             "validation accuracy once with Gaussian noise of this std (no test "
                                             "evaluation: only the selected trial is tested, after selection)",
                                       rule=above(0, finite=True), role="planned")

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)

    def validate(self) -> "TrainConfig":
        """Raise :class:`OptionError` (a ValueError) naming the first bad field and what is allowed."""
        for f in dataclasses.fields(self):
            check_option(f.name, getattr(self, f.name))
        from ..privacy.validation import check_estimator

        check_estimator(self.norm_estimator, self.sketch_k)  # the accountant's rule: it exists, k when randomised
        if self.score_noise is not None and not (self.validation_fraction > 0 and self.private):
            raise OptionError("score_noise", "None, or > 0 for a private run with a validation split "
                                             "(validation_fraction > 0)", self.score_noise)
        return self

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """Build from a mapping; unknown keys are errors (typos must not be silently ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise UserError(f"unknown training option(s): {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}



def names(*, role: str | None = None, spec: str | None = None, searched: bool | None = None,
          column: bool | None = None, cell: bool | None = None) -> tuple[str, ...]:
    """The fields with the given role and destinations, in declaration order: e.g.
    ``names(spec="trial")`` the options of a spec's ``trial`` section, ``names(column=True)`` the
    store's columns, ``names(role="hyperparameter")`` (C, B, η)."""
    wanted = {"role": role, "searched": searched, "column": column, "cell": cell}
    return tuple(name for name, f in FIELDS.items()
                 if all(v is None or f.metadata[k] == v for k, v in wanted.items())
                 and (spec is None or spec in f.metadata["spec"]))


#: What every cell searches: (C, B, η), the heatmaps', the optimum's and the error bars' columns.
HYPERPARAMETERS = names(role="hyperparameter")
#: Their names, for code that reads them from a config or a table.
CLIP_BOUND, BATCH_SIZE, LEARNING_RATE = HYPERPARAMETERS

#: What may differ between the members of a pack (packed trials): C, η, ε and its σ; every other
#: field is shared (B among them: the members see the same Poisson batches).
PACK_MEMBER_FIELDS = (CLIP_BOUND, LEARNING_RATE, "epsilon", "noise_multiplier")

#: The plan's figures: keys of a trial's flat config that the planner adds beside the training
#: options (they are not :class:`TrainConfig` fields, and the trainer checks q and T against its own).
PLAN_FIGURES = {
    "cell": "the cell's key (axes, δ and searched options), e.g. digits/cnn/E=8/delta=1e-05/eps=1",
    "metric": "the metric the sweep selects on (metrics.METRICS): trials report it signed as their score",
    "sample_rate": "q = B/N of the plan", "steps": "T of the plan", "noise_sqrt_steps": "σ√T",
    "lr_multiplier": "η's multiplier of the learning-rate rule",
    "backbone_label": "the backbone with its options, as the cell names it",
    "dataset_label": "the dataset with its options, as the cell names it",
    "selection_k": "private selection: K drawn in the cell", "selection_draw": "this trial's draw (0-based)",
    "trial_epsilon": "private selection: ε of one trial (training and noisy score)",
    "total_epsilon": "private selection: ε of the repeat-and-select total",
    "proxy_divisor": "a proxy run (search.proxy): the divisor k of B and σ",
    "full_batch_size": "a proxy run: the full-scale B it stands for",
    "final": "the full-scale run of the configuration a proxy search chose (the cell's answer)",
    "follower": "a seed run because its configuration's lead seed passed every rung: the scheduler leaves it alone",
    "looks": "racing (search.racing): the times its cell may test a configuration against its optimum (the error "
             "bars' correction multiplies by it)",
}


def check_option(name: str, value: Any) -> Any:
    """``value`` if it passes the rule ``TrainConfig`` declares for field ``name``; else raise
    :class:`OptionError` saying what is allowed. An unknown field is refused too. This is the one
    place a training option's rule is applied: the config, the spec's ``trial`` section and the
    engine's own settings all come here."""
    f = FIELDS.get(name)
    if f is None:
        raise OptionError(name, "an option of this build's trainer (one of: " + ", ".join(FIELDS) + ")", value)
    meta = f.metadata
    if value is None and meta.get("optional"):
        return value
    choices = meta.get("choices")
    if choices is not None:
        allowed = ("None or " if meta.get("optional") else "") + f"one of {', '.join(choices)}"
        if meta.get("many"):
            if not (isinstance(value, (list, tuple)) and all(isinstance(v, str) and v in choices for v in value)):
                raise OptionError(name, f"a list of names from: {', '.join(choices)}", value)
        elif not (isinstance(value, str) and value in choices):
            raise OptionError(name, allowed, value, ((None,) if meta.get("optional") else ()) + tuple(choices))
        return value
    rule = meta.get("rule")
    if rule is not None and not rule.ok(value):
        raise OptionError(name, ("None or " if meta.get("optional") else "") + rule.allowed, value)
    return value
