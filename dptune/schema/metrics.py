"""The metrics a trial reports, each with its direction and its loss: declared once.

A run's metrics are named for what they measure: ``test_accuracy`` and ``test_loss`` (with
``per_class_accuracy``) every epoch; with a validation split ``validation_accuracy`` and
``validation_loss`` (what a search selects on; NOT private); under private selection nothing until
the end, then ``selection_score`` (the noisy validation accuracy). A sweep selects on one of them;
the search, the schedulers and the store read its direction here, and the store keeps the metric's
name and direction beside its value.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """A trial metric: ``mode`` ``max`` (higher is better) or ``min``; ``loss`` the metric reported
    beside it (``None``: none)."""

    name: str
    mode: str
    loss: str | None
    description: str


METRICS = {m.name: m for m in (
    Metric("test_accuracy", "max", "test_loss", "accuracy on the test split"),
    Metric("validation_accuracy", "max", "validation_loss", "accuracy on the validation split (NOT private)"),
    Metric("selection_score", "max", None, "private selection's noisy validation accuracy"),
)}

#: Each metric's loss (``None``: none is reported beside it).
LOSS_OF = {name: m.loss for name, m in METRICS.items()}
