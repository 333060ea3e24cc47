"""The trainer's config: :class:`TrainConfig` and its rules, declared in the trial schema.

Kept importable here (``from dptune.trainables.config import TrainConfig``); the declaration, with
each field's role, lives in :mod:`dptune.schema.trial`.
"""
from ..schema import FIELDS, LOSS_OF, OptionError, Rule, TrainConfig, check_option

__all__ = ["FIELDS", "LOSS_OF", "OptionError", "Rule", "TrainConfig", "check_option"]
