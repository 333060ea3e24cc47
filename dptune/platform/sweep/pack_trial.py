"""A pack's body in its Ray Tune process: its members trained as one batched model (:class:`PackTrainer`),
one Tune report per epoch with every member's own result, checkpointed every epoch.

Each member's result is what its trial would report alone (:func:`dptune.platform.sweep.dp_trial.epoch_report`), plus
``member_status`` (``running``, or ``ended`` once it finished, diverged or was stopped) and its
``error`` when it diverged; the pack's own keys (the sweep's metric: its best member's; the epoch,
step and T) are for Ray Tune's table. After each report the pack retires the members the scheduler
stopped (:class:`dptune.platform.sweep.packs.PackStops`: the scheduler decided on that report before the report
returns). The checkpoint holds the pack's state and the members' histories, where the driver's
store callback reads each member's curve.
"""
from __future__ import annotations

import math

import ray

from ...schema import DEFAULT_METRIC, SCORE
from ...trainables.pack_training import PackTrainer
from . import tune_adapter
from .pack_policy import member_configs
from .packs import pack_stops
from .dp_trial import check_plan, epoch_report
from .trial_config import plan_figures, train_config


def run_pack(config: dict) -> None:
    """Train a pack's members to their last step (or until stopped), reporting after every epoch."""
    configs = member_configs(config)
    trainer = PackTrainer([train_config(c) for c in configs])
    for c, plan in zip(configs, trainer.plans):
        check_plan(plan_figures(c), plan)
    metric = configs[0].get("metric", DEFAULT_METRIC)
    trial_id = ray.tune.get_context().get_trial_id()

    def apply_stops() -> None:
        stops = pack_stops()
        for k in [] if stops is None else ray.get(stops.of.remote(trial_id)):
            if bool(trainer.engine.active[k]):
                trainer.retire(k)

    def report(epoch: list | None = None) -> None:
        tune_adapter.report(pack_report(trainer, metric), state={"pack": trainer.state_dict()})
        apply_stops()

    state = tune_adapter.restore_state()
    if state is not None:
        trainer.load_state_dict(state["pack"])
        apply_stops()   # stopped before the driver failed: the scheduler's saved decision
        if trainer.done:   # restored at its end: its final result again, for its caller
            report()
            return
    trainer.fit(report)


def pack_report(trainer: PackTrainer, metric: str) -> dict:
    """The pack's Tune result: each member's last result under ``members`` (keyed "0", "1", …) and,
    for Ray Tune's table, the best member's ``metric`` and ``score`` (the highest score), the epoch, step and T."""
    members = {}
    for k, history in enumerate(trainer.histories):
        if not history:
            continue
        result = epoch_report(history[-1], trainer.plans[k], trainer.lead.trainable, history, metric)
        ended = trainer.done or not bool(trainer.engine.active[k])
        members[str(k)] = {**result, "member_status": "ended" if ended else "running",
                           **({"error": trainer.errors[k]} if trainer.errors[k] else {})}
    scored = [m for m in members.values() if isinstance(m.get(SCORE), float) and math.isfinite(m[SCORE])]
    best = max(scored, key=lambda m: m[SCORE]) if scored else {metric: math.nan, SCORE: math.nan}
    return {metric: best[metric], SCORE: best[SCORE], "epoch": trainer.epoch, "step": trainer.step, "steps": trainer.lead.plan.steps,
            "pack_members": trainer.members, "members": members}
