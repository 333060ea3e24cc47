"""`dptune audit`: an empirical lower bound on a trial's ε from one training run with canaries.

"Privacy auditing with one (1) training run" (Steinke, Nasr & Jagielski, NeurIPS 2023): plant m
canaries, each included with probability ½ (:mod:`.canaries`), train once with the trial's exact
settings (model, engine, norm estimator, clipping, σ, B, q, T, optimizer, workers, randomness),
score the canaries, and turn the guesses into a lower bound on ε at 95% confidence
(:mod:`dptune.privacy.audit_bound`). A correct engine gives a bound below the accountant's ε (one
run's bound is loose: it only shows that the guarantee is not grossly wrong); an engine that adds
too little noise, clips too loosely or reuses its noise gives a bound above it
(:mod:`.broken_engines`), which makes the audit the engine's regression test.

The audit trains on private data and its canaries; its scores and bound are about the run's
mechanism. It releases nothing of the data.

It steps the trial's own trainer (``Trainer.train_step``: the step of every trial, a pack's too) to
T but not through ``fit``, whose per-epoch evaluation it has no use for and would only slow it down.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from ...errors import UserError
from ...privacy import epsilon_spent
from ...privacy.audit_bound import GRADIENT_CANARIES, INPUT_CANARIES, SIGNIFICANCE, AuditBound, audit_bound
from .canaries import TAG_SCALE, CanaryHead, Canaries, gradient_scores, input_scores, plant
from ...schema import TrainConfig
from ..engine.distributed import Workers
from ..engine.packing import load_member
from ..pack_training import PackTrainer
from ..training import Trainer, backbone_options, load_training_data


@dataclass
class AuditResult:
    """One audit: the accountant's ε of the run beside the lower bounds, per canary kind and overall
    (each kind tested at significance / kinds, so the larger bound keeps the confidence)."""

    epsilon: float                    # the accountant's ε for (σ, q, T, δ, estimator)
    delta: float
    lower_bound: float                # the larger of the kinds' bounds
    gradient: AuditBound | None
    inputs: AuditBound | None
    included: int                     # canaries included (of gradient + inputs)
    noise_multiplier: float
    sample_rate: float
    steps: int
    seconds: float
    significance: float = SIGNIFICANCE   # of the overall bound (1 - confidence)
    broken: str | None = None         # the deliberately broken engine audited, if any
    config: dict = dataclasses.field(default_factory=dict)

    @property
    def violated(self) -> bool:
        """The run is not (ε, δ)-DP for the accountant's ε, at the stated confidence."""
        return self.lower_bound > self.epsilon

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["violated"] = self.violated
        return out

    @classmethod
    def from_dict(cls, saved: dict) -> "AuditResult":
        """The result :meth:`to_dict` wrote (extra keys, e.g. ``workers``, ignored)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in saved.items() if k in fields}
        for kind in ("gradient", "inputs"):
            if values.get(kind) is not None:
                values[kind] = AuditBound(**values[kind])
        return cls(**values)


class AuditTrainer(Trainer):
    """The trial's trainer, with the canary head on its model (see :mod:`.canaries`)."""

    def __init__(self, cfg: TrainConfig, data: object, canaries: Canaries, *, workers: Workers | None = None) -> None:
        self.canaries = canaries
        super().__init__(cfg, data, workers=workers)

    def build_model(self, model_options: dict) -> nn.Module:
        backbone = super().build_model(model_options)
        return CanaryHead(backbone, max(self.canaries.gradient, 1), TAG_SCALE * max(self.cfg.clip_bound, 1.0))


def audit_config(cfg: TrainConfig) -> TrainConfig:
    """The trial's config as the audit runs it: training only (no validation split, no score: private
    selection's release is a separate mechanism), no diagnostics (they observe, never change a step)."""
    cfg = cfg.validate()
    if not cfg.private:
        raise UserError("epsilon: a non-private run (ε = inf) has no privacy guarantee to audit")
    return dataclasses.replace(cfg, validation_fraction=0.0, score_noise=None, diagnostics=[])


def run_audit(cfg: TrainConfig, *, gradient: int = GRADIENT_CANARIES, inputs: int = INPUT_CANARIES, seed: int = 0,
              significance: float = SIGNIFICANCE, broken: str | None = None,
              adjust: Callable[[Trainer], None] | None = None, workers: Workers | None = None,
              progress: Callable[[int], None] | None = None, pack_with: Sequence[TrainConfig] = ()) -> AuditResult:
    """Audit ``cfg`` with ``gradient`` and ``inputs`` canaries included from ``seed``; ``broken``
    names a :mod:`.broken_engines` change, ``adjust`` changes the built trainer otherwise (e.g. the
    engine's two-pass mode); ``workers`` runs it data-parallel (every worker calls this).
    ``pack_with``: the other members of its pack: ``cfg`` is then audited as member 0 of that pack,
    trained by the packed engine. ``progress`` is called with the step count after every step."""
    from .broken_engines import BROKEN

    start = time.perf_counter()
    cfg = audit_config(cfg)
    breaking = BROKEN.get(broken) if broken is not None else None
    data, canaries = plant(load_training_data(cfg, backbone_options(cfg)), gradient=gradient, inputs=inputs,
                           seed=seed)
    if pack_with:
        trainer = PackTrainer([cfg, *map(audit_config, pack_with)], data,
                              lead=lambda c, d: AuditTrainer(c, d, canaries, workers=workers))
        optimizer, member = trainer.optimizer.optimizer, (0,)   # member 0's slice of each packed weight
    else:
        trainer = AuditTrainer(cfg, data, canaries, workers=workers)
        optimizer, member = trainer.optimizer, ()
    if breaking is not None:
        breaking(trainer.engine)
    if adjust is not None:
        adjust(trainer)
    head: CanaryHead = trainer.model
    tag_gradients = []
    optimizer.register_step_pre_hook(
        lambda *_: tag_gradients.append(head.tags.weight.grad[member][:, 0].detach().double().cpu().clone()))
    optimizer.register_step_post_hook(lambda *_: head.reset())
    while not trainer.done:
        trainer.train_step()
        if progress is not None:
            progress(trainer.step)
    kinds = [k for k, count in (("gradient", canaries.gradient), ("inputs", canaries.inputs)) if count]
    level = significance / len(kinds)
    bounds: dict[str, AuditBound] = {}
    included = canaries.included
    if canaries.gradient:
        scores = gradient_scores(torch.stack(tag_gradients)[:, : canaries.gradient], cfg.batch_size)
        bounds["gradient"] = audit_bound(scores, included[: canaries.gradient], cfg.delta, level)
    if pack_with:   # member 0's weights, on the unpacked model its metrics are computed on
        load_member(trainer.model, trainer.lead.model, 0)
        trainer = trainer.lead
    if canaries.inputs:
        scores = input_scores(trainer.model, data, canaries, trainer.device)
        bounds["inputs"] = audit_bound(scores, included[canaries.gradient:], cfg.delta, level)
    plan = trainer.plan
    epsilon = epsilon_spent(plan.noise_multiplier, cfg.delta, plan.sample_rate, plan.steps,
                            norm_estimator=cfg.norm_estimator, sketch_k=cfg.sketch_k)
    return AuditResult(epsilon=float(epsilon), delta=cfg.delta,
                       lower_bound=max(b.epsilon for b in bounds.values()), gradient=bounds.get("gradient"),
                       inputs=bounds.get("inputs"), included=int(included.sum()),
                       noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate, steps=plan.steps,
                       seconds=time.perf_counter() - start, significance=significance, broken=broken,
                       config=cfg.to_dict())


def describe(result: AuditResult) -> str:
    """The audit's outcome in a few lines (``dptune audit``)."""
    lines = [f"accountant: ε = {result.epsilon:.3f} at δ = {result.delta:g} "
             f"(σ = {result.noise_multiplier:.4f}, q = {result.sample_rate:.4g}, T = {result.steps})"]
    for name, bound in (("gradient canaries (white-box)", result.gradient), ("input canaries (black-box)", result.inputs)):
        if bound is not None:
            lines.append(f"{name}: m = {bound.canaries}, {bound.correct} of {bound.guesses} guesses right "
                         f"(k+ = {bound.positive}, k- = {bound.negative}): ε ≥ {bound.epsilon:.3f}")
    verdict = ("VIOLATED: the run is not DP at the accountant's ε" if result.violated else
               "consistent with the accountant (a lower bound below ε shows no violation; it does not prove DP)")
    lines.append(f"empirical lower bound: ε ≥ {result.lower_bound:.3f} at {1 - result.significance:.0%} confidence — {verdict}")
    if result.broken:
        lines.append(f"(deliberately broken engine: {result.broken})")
    return "\n".join(lines)
