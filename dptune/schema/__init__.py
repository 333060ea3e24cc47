"""The trial schema: what one trial is (its fields, their roles and rules) and what it reports.

Torch-free and Ray-free, below the trainer, the planner, the platform and the analysis, which all
derive their lists from it (:mod:`.trial`, :mod:`.metrics`, :mod:`.figures`: whether each figure a trial
reports is private, :mod:`.option_registries`).
"""
from .figures import FIGURES, NON_PRIVATE_LABEL, Figure, figure, non_private, shown
from .metrics import DEFAULT_METRIC, LOSS_OF, METRICS, SCORE, Metric, signed
from .trial import BATCH_SIZE, CLIP_BOUND, FIELDS, HYPERPARAMETERS, LEARNING_RATE, PLAN_FIGURES, ROLES, OptionError, Rule, TrainConfig, check_option, names, option

__all__ = ["FIGURES", "NON_PRIVATE_LABEL", "Figure", "figure", "non_private", "shown", "DEFAULT_METRIC", "LOSS_OF", "METRICS", "SCORE", "Metric", "signed", "BATCH_SIZE", "CLIP_BOUND", "FIELDS", "HYPERPARAMETERS", "LEARNING_RATE", "PLAN_FIGURES", "ROLES", "OptionError", "Rule", "TrainConfig",
           "check_option", "names", "option"]
