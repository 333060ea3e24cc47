"""A DP trial's body in its Ray Tune process: one DP training run per trial, checkpointed every epoch.

A trial's Ray Tune config is flat (:mod:`dptune.platform.sweep.trial_config`): the training config's fields and the
plan's figures as top-level keys, read as they are. The trainable resumes from its latest
checkpoint (weights, optimizer, sampler/noise/torch RNG states, step, history), so a restored
trial ends exactly as an uninterrupted one would. The loop is :meth:`Trainer.fit`; this module
only turns each epoch into a Tune report. Reports carry scalar metrics only; the per-epoch
history (curves, per-class gradient-norm statistics) travels in the checkpoint, where the
driver-side store callback reads it.
"""
from __future__ import annotations

import math
from typing import Callable

from ...errors import UserError
from ...timeline import mark
from ...schema import DEFAULT_METRIC, LOSS_OF, SCORE, signed
from ...trainables.training import PrivacyPlan, Trainer, divergence
from . import tune_adapter
from .trial_config import plan_figures, train_config


def run_trial(config: dict, on_workers: Callable[[dict], None] | None = None) -> None:
    """Train the configured model with DP for the planned steps, reporting after every epoch (the
    body of :func:`dptune.platform.sweep.trial_function.dp_trainable`). ``on_workers`` (set by the launcher for a
    multi-worker trial, :mod:`dptune.platform.sweep.multi_worker`) runs the trial on its Ray Train workers instead of in
    this process."""
    if on_workers is not None:
        on_workers(config)
        return
    trainer = planned_trainer(config)
    mark("trainer_built")
    metric = config.get("metric", DEFAULT_METRIC)
    trainer.fit(lambda metrics, history: tune_adapter.report(
                    epoch_report(metrics, trainer.plan, trainer.trainable, history, metric),
                    state=run_state(trainer, history)),
                state=tune_adapter.restore_state())
    mark("trial_end", train_time_s=trainer.train_time_s)


def planned_trainer(config: dict, **options: object) -> Trainer:
    """The Trainer of a trial's flat config, refused if its precomputed σ was planned for another
    q or T (:func:`check_plan`). ``options`` go to the Trainer (e.g. its workers)."""
    trainer = Trainer(train_config(config), **options)
    check_plan(plan_figures(config), trainer.plan)
    return trainer


def run_state(trainer: Trainer, history: list[dict]) -> dict:
    """What a trial's checkpoint holds: the trainer's state and the history so far."""
    return {"trainer": trainer.state_dict(), "history": history}


def check_plan(planned: dict, plan: PrivacyPlan) -> None:
    """Refuse a trial whose precomputed σ was planned for another q or T than the trainer's
    ``plan`` (e.g. a wrong dataset size): training with it would silently break the stated ε."""
    meta = planned
    if "steps" in meta and int(meta["steps"]) != plan.steps or \
            "sample_rate" in meta and not math.isclose(float(meta["sample_rate"]), plan.sample_rate, rel_tol=1e-9):
        raise UserError(f"the trial was planned for q={meta.get('sample_rate')}, T={meta.get('steps')} but trains "
                         f"with q={plan.sample_rate}, T={plan.steps}: its noise multiplier does not give the stated ε")


def epoch_report(metrics: dict, plan: PrivacyPlan, trainable: int, history: list[dict] | None = None,
                 metric: str = DEFAULT_METRIC) -> dict:
    """Flat scalar metrics for Ray Tune, the sweep's ``metric``, its signed ``score`` (what the
    searcher and the scheduler compare: higher is better) and its loss first (the progress table
    shows them), plus the run's privacy plan and
    ``fully_clipped`` (1 when every example of every step so far was clipped: the searcher's
    clip-equivalence reads it; computed from private norms, NOT private), and ``error`` when the run
    diverged in this epoch (its last report: the trial ends with it, recorded, not retried). ``plan``: the
    trainer's privacy plan; ``trainable``: its number of trainable parameters."""
    head = {k: metrics[k] for k in (metric, LOSS_OF[metric], "epsilon_spent", "epoch") if k in metrics}
    value = head.get(metric, math.nan)   # private selection scores only at the end (Ray Tune wants the metric)
    head = {metric: value, SCORE: signed(metric, value), **head}
    rest = {k: v for k, v in metrics.items()
            if k not in head and isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {**head, **rest, "noise_multiplier": plan.noise_multiplier,
            "sample_rate": plan.sample_rate, "steps": plan.steps,
            "noise_sqrt_steps": plan.noise_sqrt_steps, "trainable_params": trainable,
            "fully_clipped": int(bool(history) and all(h.get("clipped_fraction") == 1.0 for h in history)),
            **({"error": f"TrialDiverged: {why}"} if (why := divergence(metrics)) is not None else {})}
