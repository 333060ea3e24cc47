"""The body of every trial in its process: one DP training run, or a pack of them, checkpointed every epoch.

A trial's Ray Tune config is flat (:mod:`dptune.platform.sweep.trial_config`): the training config's fields and the
plan's figures as top-level keys, read as they are; a pack's is ``{"pack": [member configs]}``
(:mod:`dptune.platform.sweep.packs`). Either is one run (:class:`Trainer`: one member;
:class:`PackTrainer`: K) trained by the one training loop, :func:`dptune.trainables.epoch_loop.fit`, here
and on every Ray Train worker of a multi-worker trial (:mod:`dptune.platform.sweep.multi_worker`); this module
only builds the run and turns each epoch into a report. The run resumes from its latest checkpoint
(weights, optimizer, sampler/noise/torch RNG states, step, histories), so a restored trial ends
exactly as an uninterrupted one would. Reports carry scalar metrics only (a pack's: each member's
under ``members``); the per-epoch history (curves, per-class gradient-norm statistics) travels in the
checkpoint, where the driver-side store callback reads it.

After each report a pack retires the members the scheduler stopped
(:class:`dptune.platform.sweep.packs.PackStops`: in a Tune trial the scheduler decided on that report before
the report returns; on Ray Train workers rank 0 waits until the trial's Tune function has relayed it,
reads them, and every worker retires the same).
"""
from __future__ import annotations

import math
from typing import Callable

import ray

from ...errors import UserError
from ...timeline import mark
from ...schema import DEFAULT_METRIC, LOSS_OF, SCORE, signed
from ...trainables.engine.distributed import Workers
from ...trainables.epoch_loop import divergence, fit
from ...trainables.pack_training import PackTrainer
from ...trainables.training import PrivacyPlan, Trainer
from . import tune_adapter
from .packs import pack_stops
from .trial_config import PACK, member_configs, plan_figures, train_config

#: Sends one epoch's report with the run's checkpoint (None: another worker's, which rank 0 writes).
Send = Callable[[dict, "dict | None"], None]
#: The members of a pack the scheduler stopped, read after a report (True) or when restored (False).
Stops = Callable[[bool], "list[int]"]


def run_trial(config: dict, on_workers: Callable[[dict], None] | None = None) -> None:
    """Train a trial's run, reporting to Ray Tune after every epoch (the body of
    :func:`dptune.platform.sweep.trial_function.dp_trainable`). ``on_workers`` (set by the launcher for a
    multi-worker trial, :mod:`dptune.platform.sweep.multi_worker`) runs it on its Ray Train workers instead of in
    this process."""
    if on_workers is not None:
        on_workers(config)
        return
    trial_id = ray.tune.get_context().get_trial_id()
    train_trial(config, tune_adapter.report, state=tune_adapter.restore_state(),
                stops=lambda _: stopped_members(trial_id))


def train_trial(config: dict, send: Send, *, state: dict | None = None, workers: Workers | None = None,
                stops: Stops | None = None) -> Trainer | PackTrainer:
    """Build the run of a trial's ``config`` (:func:`planned_run`) on ``workers``, restore it from
    ``state`` (a checkpoint's), train it to its end and ``send`` every epoch's report
    (:func:`trial_report`) with the run's checkpoint (rank 0's only). A pack retires the members ``stops``
    names (rank 0 reads them, every worker retires them) after each report and when restored."""
    workers = workers or Workers()
    run = planned_run(config, workers)
    mark("trainer_built")
    metric = (member_configs(config)[0] if PACK in config else config).get("metric", DEFAULT_METRIC)

    def apply_stops(reported: bool) -> None:
        if not isinstance(run, PackTrainer) or stops is None:
            return
        for k in workers.shared(lambda: stops(reported)):
            if run.is_active(k):
                run.retire(k)

    def report(epoch: list) -> None:
        send(trial_report(run, metric), run.checkpoint() if workers.rank == 0 else None)
        apply_stops(True)

    if state is not None:
        run.restore(state)
        apply_stops(False)   # stopped before the driver failed: the scheduler's saved decision
    fit(run, report, restored=state is not None)
    mark("trial_end", train_time_s=run.train_time_s)
    return run


def stopped_members(trial_id: str) -> list[int]:
    """The members of pack trial ``trial_id`` the scheduler stopped (none when no sweep's stops are kept)."""
    stops = pack_stops()
    return [] if stops is None else ray.get(stops.of.remote(trial_id))


def planned_run(config: dict, workers: Workers | None = None) -> Trainer | PackTrainer:
    """The run of a trial's flat config (a :class:`Trainer`) or of a pack's (a :class:`PackTrainer` of its
    members), each member refused if its precomputed σ was planned for another q or T (:func:`check_plan`)."""
    if PACK in config:
        configs = member_configs(config)
        run = PackTrainer([train_config(c) for c in configs], workers=workers)
        plans = run.plans
    else:
        configs, run = [config], Trainer(train_config(config), workers=workers)
        plans = [run.plan]
    for c, plan in zip(configs, plans):
        check_plan(plan_figures(c), plan)
    return run


def trial_report(run: Trainer | PackTrainer, metric: str) -> dict:
    """The Tune result of a run's last epoch: a single trial's :func:`epoch_report`, a pack's :func:`pack_report`."""
    if isinstance(run, PackTrainer):
        return pack_report(run, metric)
    return epoch_report(run.histories[0][-1], run.plan, run.trainable, run.histories[0], metric)


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


def pack_report(trainer: PackTrainer, metric: str) -> dict:
    """The pack's Tune result: each member's last result under ``members`` (keyed "0", "1", …), what its
    trial would report alone (:func:`epoch_report`) plus ``member_status`` (``running``, or ``ended`` once
    it finished, diverged or was stopped) and its ``error`` when it diverged; for Ray Tune's table, the
    best member's ``metric`` and ``score`` (the highest score), the epoch, step and T; the pack's training seconds
    and configuration-steps (``member_steps``: what the searcher's measured pack policy compares with lone trials)."""
    members = {}
    for k, history in enumerate(trainer.histories):
        if not history:
            continue
        result = epoch_report(history[-1], trainer.plans[k], trainer.lead.trainable, history, metric)
        ended = trainer.done or not trainer.is_active(k)
        members[str(k)] = {**result, "member_status": "ended" if ended else "running",
                           **({"error": trainer.errors[k]} if trainer.errors[k] else {})}
    scored = [m for m in members.values() if isinstance(m.get(SCORE), float) and math.isfinite(m[SCORE])]
    best = max(scored, key=lambda m: m[SCORE]) if scored else {metric: math.nan, SCORE: math.nan}
    return {metric: best[metric], SCORE: best[SCORE], "epoch": trainer.epoch, "step": trainer.step, "steps": trainer.lead.plan.steps,
            "pack_members": trainer.members, "train_time_s": trainer.train_time_s, "member_steps": trainer.member_steps,
            "members": members}
