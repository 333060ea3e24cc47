"""Every figure a trial emits, with whether it is private, declared once: name, class and reason.

A figure is a key of a trial's epoch metrics or of its Tune report (what the store, the trackers,
``dptune status`` and the report show). Each is in one of three classes, with respect to the
training examples that the run's (ε, δ) protects:

``public``       depends on no example: the privacy plan (σ, q, T from ε, δ, B, E and the training
                 set's size N), the schedule, the model's size. N — and so q and T — is public by
                 convention, as in Opacus and jax_privacy (docs/architecture.md, "Privacy of what a trial reports").
``private``      no training example enters it but through the DP training (the released model's
                 weights): the model evaluated on the test split (held out of the training set; its
                 own examples are not protected by ε), post-processing of the noised gradient, and
                 private selection's score (released with its own accounted noise).
``non-private``  computed from training examples, or the validation split held out of them, without
                 noise: NOT differentially private. Labelled so wherever it is shown.

:func:`figure` refuses a name that is not declared: ``tests/test_figures.py`` runs every kind of
trial and fails on a figure it emits that is not declared here, so a new figure is declared (with
its reason) before it can be released unlabelled.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError

#: The classes, in the order the store's ``figures`` view lists them.
PRIVACY = ("public", "private", "non-private")
#: What a non-private figure is labelled with, wherever it is shown.
NON_PRIVATE_LABEL = "NOT differentially private"


@dataclass(frozen=True)
class Figure:
    """A figure a trial emits: ``name`` (or a prefix ending in ``*``), its class and why."""

    name: str
    privacy: str
    reason: str

    def matches(self, key: str) -> bool:
        return key.startswith(self.name[:-1]) if self.name.endswith("*") else key == self.name


_PLAN = "the privacy plan: from ε, δ, B, E and N (public by convention), no example"
_TEST = "the DP-trained model on the test split, which is held out of the training set"
_VALIDATION = "the model on the validation split, held out of the training examples: selection on it is not noised"
_NORMS = "per-example gradient norms of training examples, not noised"

FIGURES: tuple[Figure, ...] = (
    Figure("epoch", "public", "the schedule"),
    Figure("step", "public", "the schedule: steps taken"),
    Figure("steps", "public", "T of " + _PLAN),
    Figure("noise_multiplier", "public", "σ of " + _PLAN),
    Figure("sample_rate", "public", "q = B/N of " + _PLAN),
    Figure("noise_sqrt_steps", "public", "σ√T of " + _PLAN),
    Figure("epsilon_spent", "public", "the accountant's ε after the steps taken: " + _PLAN),
    Figure("trainable_params", "public", "the model's size"),
    Figure("pack_members", "public", "how many configurations trained together: the plan's"),
    Figure("validation_nonprivate", "public", "says that the validation_* figures are non-private"),
    Figure("test_accuracy", "private", _TEST),
    Figure("test_loss", "private", _TEST),
    Figure("per_class_accuracy", "private", _TEST),
    Figure("test_nll", "private", _TEST),
    Figure("test_perplexity", "private", _TEST),
    Figure("test_rougeL", "private", "greedy completions of the test prompts by " + _TEST),
    Figure("test_bleu", "private", "greedy completions of the test prompts by " + _TEST),
    Figure("generated_examples", "private", "how many test prompts were completed and scored: the test split's"),
    Figure("generation_time_s", "private", "wall time of the greedy completions of the test prompts by the "
                                           "DP-trained model"),
    Figure("truncated_test_examples", "private", "test examples longer than max_length: counted on the test "
                                                 "split, no training example enters"),
    Figure("selection_score", "private", "private selection's validation accuracy, released with Gaussian noise "
                                         "the planner accounts for"),
    Figure("denoise_gate_rate", "private", "RMT denoising's statistics of the noised gradient (post-processing)"),
    Figure("denoise_mean_rank", "private", "RMT denoising's statistics of the noised gradient (post-processing)"),
    Figure("denoise_mean_shrinkage", "private", "RMT denoising's statistics of the noised gradient (post-processing)"),
    Figure("member_status", "private", "whether a pack's member ended: the scheduler decides on its test metric"),
    Figure("member_steps", "private", "the steps a pack's members trained, summed: each ends where the scheduler "
                                      "stops it on its test metric (or its test loss diverged)"),
    Figure("error", "private", "a failed trial's message: its configuration, or the test loss it diverged at"),
    Figure("recurring", "private", "whether a failed trial's error is of its input or environment (it recurs in "
                                   "every trial and stops the sweep)"),
    Figure("score", "non-private", "the selected metric with its sign (higher is better): as private as that "
                                   "metric, and a validation split's is not; labelled for the worst case"),
    Figure("validation_accuracy", "non-private", _VALIDATION),
    Figure("validation_loss", "non-private", _VALIDATION),
    Figure("validation_nll", "non-private", _VALIDATION),
    Figure("validation_perplexity", "non-private", _VALIDATION),
    Figure("clipped_fraction", "non-private", "the share of training examples whose gradient was clipped: " + _NORMS),
    Figure("nonfinite_examples", "non-private", "training examples whose gradient norm was not finite: " + _NORMS),
    Figure("fully_clipped", "non-private", "whether every training example was clipped at every step (the clip-"
                                          "equivalence decision): " + _NORMS),
    Figure("nonprivate_*", "non-private", "per-class gradient-norm statistics and diagnostics of the clipped "
                                          "gradient before noise: " + _NORMS),
    Figure("truncated_train_examples", "non-private", "training examples longer than max_length: a count over "
                                                      "training examples, not noised"),
    Figure("train_time_s", "non-private", "wall time, which grows with the realised batches' sizes (one more "
                                          "example in a batch is what ε hides: hence the normalisation by the "
                                          "expected B) and, for text, with the training examples' lengths; not noised"),
)


class UndeclaredFigure(UserError):
    """A trial emitted a figure that :data:`FIGURES` does not declare."""


def figure(name: str) -> Figure:
    """The declaration of ``name`` (a key of a trial's metrics); refused if there is none."""
    for declared in FIGURES:
        if declared.matches(name):
            return declared
    raise UndeclaredFigure(f"figure {name!r} is not declared in dptune/schema/figures.py: declare whether it is "
                           f"public, private or non-private, and why")


def shown(label: str, name: str) -> str:
    """``label`` as a table, line or figure shows figure ``name``: marked when it is non-private."""
    return f"{label} (NOT private)" if figure(name).privacy == "non-private" else label


def non_private(names: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The declared non-private figures (as declared, prefixes with ``*``), or those among ``names``."""
    if names:
        return [n for n in names if figure(n).privacy == "non-private"]
    return [f.name for f in FIGURES if f.privacy == "non-private"]
