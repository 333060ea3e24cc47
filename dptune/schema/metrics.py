"""The metrics a trial reports, each with its direction and its loss: declared once.

A run's metrics are named for what they measure. A classification reports ``test_accuracy`` and
``test_loss`` (with ``per_class_accuracy``) every epoch; with a validation split
``validation_accuracy`` and ``validation_loss`` (what a search selects on; NOT private); under
private selection nothing until the end, then ``selection_score`` (the noisy validation accuracy).
A generation task (prompt → completion) reports ``test_nll`` (per completion token) and
``test_perplexity`` every epoch (``validation_*`` likewise), and at the end ``test_rougeL`` and
``test_bleu`` of greedy completions. A sweep selects on one of them (:data:`TASK_METRICS`: those a
task reports every epoch, so the schedulers can compare trials as they run); the search, the
schedulers, the store and the analysis read its direction here, and the store keeps the metric's
name and direction beside its value.
"""
from __future__ import annotations

from dataclasses import dataclass

from .figures import shown


@dataclass(frozen=True)
class Metric:
    """A trial metric: ``mode`` ``max`` (higher is better) or ``min``; ``loss`` the metric reported
    beside it (``None``: none); ``label`` how lines and figures name it, ``short`` how a trial's
    one-line outcome does; ``accuracy`` whether it is an accuracy (the store's ``accuracy`` column
    holds it then, and nothing else)."""

    name: str
    mode: str
    loss: str | None
    description: str
    label: str
    short: str
    accuracy: bool = False

    @property
    def titled(self) -> str:
        """The label, saying the direction where lower is better and that it is not private where it
        is not (a validation split's: :mod:`.figures`)."""
        return shown(self.label, self.name) + (" (lower is better)" if self.mode == "min" else "")


METRICS = {m.name: m for m in (
    Metric("test_accuracy", "max", "test_loss", "accuracy on the test split", "accuracy", "acc", accuracy=True),
    Metric("validation_accuracy", "max", "validation_loss", "accuracy on the validation split (NOT private)",
           "validation accuracy", "val acc", accuracy=True),
    Metric("selection_score", "max", None, "private selection's noisy validation accuracy", "noisy score", "score",
           accuracy=True),
    Metric("test_nll", "min", "test_nll", "NLL per completion token on the test split", "test NLL", "nll"),
    Metric("validation_nll", "min", "validation_nll", "NLL per completion token on the validation split (NOT "
                                                      "private)", "validation NLL", "val nll"),
)}

#: Each metric's loss (``None``: none is reported beside it).
LOSS_OF = {name: m.loss for name, m in METRICS.items()}
#: The losses a trial reports: one that is not finite means the run diverged.
LOSSES = tuple(sorted({m.loss for m in METRICS.values() if m.loss is not None}))

#: What each task reports every epoch that a sweep may select on: (on the test split, on a
#: validation split). The first is the task's default.
TASK_METRICS = {"classification": ("test_accuracy", "validation_accuracy"),
                "generation": ("test_nll", "validation_nll")}
#: The metric a sweep selects on when its spec names none (a classification's test accuracy).
DEFAULT_METRIC = TASK_METRICS["classification"][0]
#: A trial's signed score: its selected metric as is where higher is better, negated where lower
#: is better. Every ranking — the searcher, the schedulers, Optuna, racing, proxies, transfer,
#: bracketing, ``dptune status``, the analysis — maximises it, so a metric's direction is read once, here.
SCORE = "score"


def signed(metric: str, value: float | None) -> float | None:
    """The score of ``value`` of ``metric`` (:data:`SCORE`): ``value`` where higher is better,
    ``-value`` where lower is; None stays None."""
    return oriented(value, METRICS[metric].mode)


def oriented(value: float | None, mode: str) -> float | None:
    """``value`` of a metric of direction ``mode`` as a score: itself for ``max``, negated for ``min``."""
    if value is None:
        return None
    return float(value) if mode == "max" else -float(value)


#: Tasks (the ``task`` of a dataset; datasets not named in a registry's task table are classifications).
TASKS = tuple(TASK_METRICS)

#: Scores a trial reports beside the metrics above, kept as columns of the store's trials: a
#: generation task's perplexities every epoch, and at its end greedy generation's ROUGE-L and BLEU.
SCORES = ("test_perplexity", "validation_perplexity", "test_rougeL", "test_bleu")
