"""Packed trials: K configurations that differ only in C, η and ε (σ), trained as one batched model.

Configurations of a sweep that share the data, the model, B, the seed and the number of epochs see
the same Poisson batches (reproducible mode draws them from the seed) and start from the same
weights. :class:`PackTrainer` trains them together: one sampler, one forward and one backward of
the packed model per step (:mod:`.engine.packed_layers`), each member with its own weights,
optimizer state, clip bound, σ and η (:class:`.engine.dp_engine.DPEngine` with ``members``,
:class:`.engine.optimizers.PackedOptimizer`). Each member's trajectory is the
one its configuration has trained alone (``Trainer``) — the same batches, initial weights and noise
— up to floating-point rounding; its epoch metrics are computed by the same code, on an unpacked
copy of its weights. One exception: dropout masks (a model trained with dropout) are drawn for all
K·b rows from one generator, so they are not the masks the member would have drawn alone (they
are drawn alike, and nothing of the privacy accounting depends on them).

Each member's denoised step, diagnostics and private selection's noisy score are those of its
configuration alone (:meth:`.engine.dp_engine.DPEngine.member_steps`); non-private baselines (ε = inf)
pack among themselves, each member's step its mean gradient over the realised batch
(:class:`.engine.distributed.Baseline`).

It is trained by the one training loop (:func:`.epoch_loop.fit`): a member whose loss stops being
finite is recorded as diverged, with its message, and retired (it gets no more steps); so is one the
caller stops (``retire``); the others go on. A retired member leaves the packed model (its rows cost
nothing more: a pack whose members a scheduler stops shrinks as a sweep of separate trials does); its
last weights are kept aside, so a checkpoint still holds all K members in the member dimension. With ``workers`` (a multi-worker trial) every worker holds
the pack, steps its shard of the batch, and the members' clipped sums are all-reduced before the
noise, drawn once (identically on every worker), as a single trial's are (:mod:`.engine.distributed`).
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
from tqdm.auto import tqdm

from ..errors import UserError
from ..schema import TrainConfig
from ..schema.trial import PACK_MEMBER_FIELDS
from .data.splits import DatasetSplits, take
from .engine.batching import to_device
from .engine.distributed import Baseline, Workers
from .engine.book_keeping import free_memory
from .engine.dp_engine import DPEngine
from .engine.optimizers import PackedOptimizer, make_optimizer
from .engine.pack_memory import MEMORY_SHARE, estimate
from .engine.precision import Precision
from .engine.packing import keep_members, load_member, pack_models, packing_problems
from .epoch_loop import EpochReport, fit as fit_run
from .training import Trainer, check_workers, engine_parts, epoch_epsilons, part_metrics, plan_privacy


#: Training examples the memory estimate runs a forward of (:func:`.engine.pack_memory.estimate`).
MEMORY_SAMPLE = 8


class PackTrainer:
    """State and loop of a pack of configurations (see the module docstring)."""

    def __init__(self, cfgs: list[TrainConfig], data: DatasetSplits | None = None,
                 memory_budget: float | None = None,
                 lead: Callable[[TrainConfig, DatasetSplits | None], Trainer] | None = None, *,
                 workers: Workers | None = None) -> None:
        """``memory_budget``: the bytes the pack may plan to use (None: :data:`MEMORY_SHARE` of the
        device's free memory once the lead is built); passes are split so the pack stays within it.
        ``lead`` builds the first member's trainer (the audit's adds its canary head; by default a
        :class:`Trainer` on ``workers``, a multi-worker trial's)."""
        if not cfgs:
            raise UserError("a pack needs at least one configuration")
        self.cfgs = [cfg.validate() for cfg in cfgs]
        if len({cfg.private for cfg in self.cfgs}) > 1:
            raise UserError("the members of a pack are all private or all non-private (epsilon: inf), not both")
        differing = sorted({k for cfg in self.cfgs[1:] for k, v in cfg.to_dict().items()
                            if k not in PACK_MEMBER_FIELDS and v != self.cfgs[0].to_dict()[k]})
        if differing:
            raise UserError(f"the members of a pack may differ only in {', '.join(PACK_MEMBER_FIELDS)}; "
                            f"these differ too: {', '.join(differing)}")
        # the first member's trainer: the data, the streams, the initial weights every member starts
        # from, the sampler, the task; its model then serves as the unpacked copy each member is evaluated on
        self.lead = (lead or functools.partial(Trainer, workers=workers))(self.cfgs[0], data)
        problems = packing_problems(self.lead.model)
        if problems:
            raise UserError(f"model {self.cfgs[0].model!r} cannot be packed: {'; '.join(problems)}; "
                            "set search.pack: off")
        self.members = len(self.cfgs)
        lead = self.lead.cfg
        #: rows of one packed pass: the members' examples together, within the memory budget
        self.rows_per_pass = self._rows_per_pass(memory_budget)
        self.plans = [self.lead.plan] + [plan_privacy(cfg, self.lead.n_train) for cfg in self.cfgs[1:]]   # σ once each
        self.model = pack_models([self.lead.model] * self.members)
        # the lead's own step and epoch loop trains the pack: its model stays the unpacked copy evaluated
        self.engine: DPEngine | Baseline
        if lead.private:
            self.engine = self.lead.engine = DPEngine(
                self.model, self.lead.task.loss, members=self.members, clip_bound=[c.clip_bound for c in self.cfgs],
                noise_multiplier=[p.noise_multiplier for p in self.plans], expected_batch_size=lead.batch_size,
                norm_estimator=lead.norm_estimator, sketch_k=lead.sketch_k, clip_fn=lead.clip_fn,
                max_physical_batch_size=self.rows_per_pass, generator=self.lead.streams["noise"],
                shared_noise=lead.randomness != "secure", probes=self.lead.streams["probes"],
                precision=lead.precision, all_reduce=self.lead.workers.sum if self.lead.workers.size > 1 else None,
                **engine_parts(lead))
        else:
            self.engine = self.lead.baseline = Baseline(self.model, self.lead.task.loss, workers=self.lead.workers,
                                                        members=self.members, precision=Precision(lead.precision),
                                                        max_rows=self.rows_per_pass)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = PackedOptimizer(
            make_optimizer(lead.optimizer, params, lr=1.0, momentum=lead.momentum, weight_decay=lead.weight_decay),
            [c.learning_rate for c in self.cfgs], self.engine.active)
        self.lead.optimizer = self.optimizer
        self.epsilons = [epoch_epsilons(cfg, plan) if cfg.private else None for cfg, plan in zip(self.cfgs, self.plans)]
        self.histories: list[list[dict]] = [[] for _ in self.cfgs]
        self.errors: list[str | None] = [None] * self.members
        #: the member of each row of the packed model's member dimension (retired members leave it)
        self.rows: list[int] = list(range(self.members))
        #: a retired member's trainable weights when it left the packed model
        self.retired_weights: dict[int, dict[str, torch.Tensor]] = {}
        #: configuration-steps trained: Σ over steps of the members training (what the pack's time bought)
        self.member_steps = 0

    def _rows_per_pass(self, memory_budget: float | None) -> int:
        """Measure what the pack will hold (``self.memory``) and bound the rows of one pass by the
        budget and by ``max_physical_batch_size``; refuse a pack whose members cannot fit."""
        lead, cfg = self.lead, self.lead.cfg
        x, y = take(lead.data.train, torch.arange(min(MEMORY_SAMPLE, len(lead.data.train))))
        self.memory = estimate(lead.model, lead.task.loss, to_device(x, lead.device), y.to(lead.device),
                               optimizer=cfg.optimizer, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        if memory_budget is None:
            budget = MEMORY_SHARE * free_memory(lead.device)
            budget_is = f"{MEMORY_SHARE:.0%} of the free memory of {lead.device}"
        else:
            budget, budget_is = memory_budget, "the memory budget given"
        rows = self.members * self.memory.plan(self.members, budget, cfg.model, budget_is)
        return rows if cfg.max_physical_batch_size is None else min(rows, cfg.max_physical_batch_size)

    @property
    def step(self) -> int:
        return self.lead.step

    @property
    def epoch(self) -> int:
        return self.lead.epoch

    @property
    def train_time_s(self) -> float:
        return self.lead.train_time_s

    @property
    def done(self) -> bool:
        return self.lead.done or not bool(self.engine.active.any())

    def is_active(self, k: int) -> bool:
        """Member ``k`` still trains (neither retired nor done)."""
        return k in self.rows and bool(self.engine.active[self.rows.index(k)])

    def retire(self, k: int, why: str | None = None) -> None:
        """Member ``k`` trains no more (``why``: its error, if it failed: its weights are zeroed). It
        leaves the packed model unless it was the last member training."""
        row = self.rows.index(k)
        self.engine.retire(row)
        if why is not None:
            self.errors[k] = why
            with torch.no_grad():
                for p in self.model.parameters():
                    if p.requires_grad:
                        p[row].zero_()
        self._drop_retired()

    def member_weights(self, k: int) -> dict[str, torch.Tensor]:
        """Member ``k``'s trainable weights by name: its rows of the packed model, or as it left it."""
        if k not in self.rows:
            return dict(self.retired_weights[k])
        row = self.rows.index(k)
        return {n: p[row].detach() for n, p in self.model.named_parameters() if p.requires_grad}

    def _drop_retired(self) -> None:
        """Shrink the packed model, its engine and its optimizer to the members still training (their
        weights, state, C, σ and η unchanged; each keeps drawing the noise it drew), keeping the
        weights of those that leave for :meth:`state_dict`."""
        keep = [row for row in range(len(self.rows)) if bool(self.engine.active[row])]
        if not keep or len(keep) == len(self.rows):
            return
        for row in set(range(len(self.rows))) - set(keep):
            self.retired_weights[self.rows[row]] = {n: p[row].detach().clone() for n, p in self.model.named_parameters()
                                                    if p.requires_grad}
        keep_members(self.model, keep)
        self.engine.keep_members(keep)
        self.optimizer.keep_members(keep, self.engine.active)
        self.rows = [self.rows[row] for row in keep]

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """One optimizer step of every active member on one Poisson batch (the lead's step, on the
        packed engine and optimizer): (norms [K, b] on the device, their groups, the step's statistics)."""
        return self.lead.train_step()

    def epoch_results(self, progress: tqdm | None = None) -> list[dict | None]:
        """Train to the next epoch boundary (the lead's epoch loop); each active member's metrics, from
        the lead's evaluation of its weights (None for a retired member)."""
        training, start = int(self.engine.active.sum()), self.step
        norms, labels, parts = self.lead.train_epoch(progress)
        self.member_steps += training * (self.step - start)
        norms, labels = self.lead.workers.gather(norms), self.lead.workers.gather(labels)   # all shards
        out: list[dict | None] = []
        score = self.lead.streams["score"]
        # private selection: each member draws the score noise it would alone (secure: fresh draws)
        drawn = score.state() if self.lead.cfg.score_noise is not None else None
        for k, cfg in enumerate(self.cfgs):
            if not self.is_active(k):
                out.append(None)
                continue
            row = self.rows.index(k)
            load_member(self.model, self.lead.model, row)
            if drawn is not None:
                score.load(drawn)
            if not cfg.private:
                out.append({**self.lead.baseline_metrics(), "pack_members": self.members})
                continue
            out.append({**self.lead.epoch_metrics(norms[row], labels, cfg.clip_bound, self.epsilons[k][self.epoch - 1]),
                        **part_metrics(self.engine.parts, {key: [step[row] for step in steps] for key, steps in parts.items()}),
                        "pack_members": self.members})
        return out

    def fit(self, report: EpochReport | None = None, progress: tqdm | None = None, *,
            state: dict | None = None) -> list[list[dict]]:
        """Train every member to step T or until it is retired (:func:`.epoch_loop.fit`: ``report`` gets
        every member's metrics of each epoch, None for a member retired before it; ``state``, a
        :meth:`checkpoint`, resumes the pack); returns the members' histories."""
        return fit_run(self, report, state=state, progress=progress)

    def checkpoint(self) -> dict:
        """What a pack trial's checkpoint holds: the :meth:`state_dict` (histories included)."""
        return {"pack": self.state_dict()}

    def restore(self, state: dict) -> None:
        """Resume from a :meth:`checkpoint`."""
        self.load_state_dict(state["pack"])

    def state_dict(self) -> dict:
        """Everything a resumed pack needs: the members' trainable weights and optimizer states (all K
        in the member dimension, a retired member's as it left), the streams' states (none of a secure
        run's), counters, which members are retired and why, and the histories."""
        lead = self.lead
        optimizer = self.optimizer.state_dict()
        params = [p for group in self.optimizer.optimizer.param_groups for p in group["params"]]
        for index, slots in optimizer["state"].items():
            optimizer["state"][index] = {key: self._all_members(value) if torch.is_tensor(value)
                                         and value.shape == params[index].shape else value
                                         for key, value in slots.items()}
        active = [self.is_active(k) for k in range(self.members)]
        return {"model": {n: self._all_members(p.detach(), n) for n, p in self.model.named_parameters()
                          if p.requires_grad},
                "buffers": dict(self.lead.model.named_buffers()),   # shared by the members (an export reads them)
                "optimizer": optimizer,
                "streams": {name: s.state() for name, s in lead.streams.items()},
                "torch_rng": torch.get_rng_state(), "workers": lead.workers.size, "step": self.step, "epoch": self.epoch,
                "train_time_s": self.train_time_s, "member_steps": self.member_steps, "active": active,
                "errors": list(self.errors),
                "histories": [list(h) for h in self.histories], "configs": [cfg.to_dict() for cfg in self.cfgs]}

    def _all_members(self, rows: torch.Tensor, name: str | None = None) -> torch.Tensor:
        """A per-member tensor of the packed model's rows with all K members: a retired member's weights
        (``name``) as it left, zeros for its optimizer state."""
        if len(self.rows) == self.members:
            return rows
        full = rows.new_zeros((self.members, *rows.shape[1:]))
        full[torch.tensor(self.rows, device=rows.device)] = rows
        if name is not None:
            for k, weights in self.retired_weights.items():
                full[k] = weights[name]
        return full

    def load_state_dict(self, state: dict) -> None:
        if state["configs"] != [cfg.to_dict() for cfg in self.cfgs]:
            raise UserError("this checkpoint holds another pack (its members' configurations differ)")
        if len(self.rows) != self.members:
            raise UserError("a pack that has retired members cannot load a checkpoint; build a new one")
        check_workers(state, self.lead.workers.size)
        self.model.load_state_dict(state["model"], strict=False)
        self.optimizer.load_state_dict(state["optimizer"])
        for name, saved in state["streams"].items():   # a secure run continues with fresh secret streams
            self.lead.streams[name].load(saved)
        torch.set_rng_state(state["torch_rng"])
        self.engine.active.copy_(torch.tensor(state["active"]))
        self.lead.step, self.lead.epoch, self.lead.train_time_s = state["step"], state["epoch"], state["train_time_s"]
        self.member_steps = state.get("member_steps", 0)   # a checkpoint written before it was counted: 0
        self.errors = list(state["errors"])
        self.histories = [list(h) for h in state["histories"]]
        self._drop_retired()


def train_pack(cfgs: list[TrainConfig], *, progress: bool = True, data: DatasetSplits | None = None) -> PackTrainer:
    """Train a pack without Ray, with a progress bar; returns the trainer (its ``histories`` and ``errors``)."""
    trainer = PackTrainer(cfgs, data)
    with tqdm(total=trainer.lead.plan.steps, disable=not progress, unit="step",
              desc=f"training a pack of {trainer.members}") as bar:
        trainer.fit(progress=bar)
    return trainer
