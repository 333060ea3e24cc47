"""The trial schema: what one trial is (its fields, their roles and rules) and what it reports.

Torch-free and Ray-free, below the trainer, the planner, the platform and the analysis, which all
derive their lists from it (:mod:`.trial`, :mod:`.metrics`, :mod:`.option_registries`).
"""
from .metrics import LOSS_OF, METRICS, Metric
from .trial import FIELDS, HYPERPARAMETERS, PLAN_FIGURES, ROLES, OptionError, Rule, TrainConfig, check_option, names, option

__all__ = ["LOSS_OF", "METRICS", "Metric", "FIELDS", "HYPERPARAMETERS", "PLAN_FIGURES", "ROLES", "OptionError", "Rule", "TrainConfig",
           "check_option", "names", "option"]
