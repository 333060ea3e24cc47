"""The DP step of a pack: K members' privatised gradients from one forward and one backward.

For member k with clip bound C_k, noise multiplier σ_k and the pack's expected batch size B:

    ĝ_k = (Σ_i c_ki g_ki + σ_k C_k ξ_k) / (B C_k),   c_ki = clip_fn(n_ki, C_k)

where n_ki is example i's per-sample norm under member k's weights — every member sees the same
Poisson batch. The per-sample norms and clipped sums come from the book-keeping engine on the packed
model (``packed_layers``, ``packed_rules``); the batch is repeated once per member. ``ξ`` is drawn
once per parameter and step from the run's noise stream and shared by the members in reproducible
mode, which is exactly the noise each member would have drawn alone with the same seed; in secure
mode every member draws its own (independent) secret noise.

An example whose norm is not finite for member k contributes nothing to member k (as in
``DPEngine.clipped_sum``): the micro-batch is done again without it, and only member k's sums are
taken from that pass. A retired member (stopped, or diverged) contributes no rows, gets no noise and
no step. The statistics (per-sample norms) are NOT private.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ...errors import UserError
from ...privacy.validation import check_estimator
from ...schema import check_option
from ...schema.option_registries import CLIP_FNS, NORM_ENGINES
from .batching import Inputs, batch_len, micro_batches, select_rows
from .dp_engine import add_sums
from .per_sample import LossFn, check_model, trainable_parameters
from .randomness import Stream

Sums = dict[str, torch.Tensor]


def repeat_rows(inputs: Inputs, members: int) -> Inputs:
    """The batch once per member, member-major (row k·b + i is example i)."""
    if isinstance(inputs, torch.Tensor):
        return inputs.repeat(members, *(1,) * (inputs.dim() - 1))
    return {k: repeat_rows(v, members) for k, v in inputs.items()}


def _members_shape(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A [K] vector shaped to broadcast over [K, *shape]."""
    return value.reshape(-1, *(1,) * (like.dim() - 1)).to(like.dtype)


class PackedDPEngine:
    """Writes each member's ĝ_k into its slice of the packed parameters' ``.grad`` (module docstring).

    ``clip_bounds`` and ``noise_multipliers``: one per member; ``noise``: the run's noise stream
    (``shared_noise``: one ξ for all members, as reproducible runs of one seed draw alone; else
    independent per member); ``probes``: the run's probe stream for randomised estimators.
    ``max_physical_batch_size`` bounds the rows of one packed forward (K times the examples)."""

    def __init__(self, model: nn.Module, loss_fn: LossFn, *, members: int, clip_bounds: Sequence[float],
                 noise_multipliers: Sequence[float], expected_batch_size: float, norm_estimator: str = "exact",
                 sketch_k: int | None = None, clip_fn: str = "flat", max_physical_batch_size: int | None = None,
                 noise: Stream | None = None, shared_noise: bool = True, probes: Stream | None = None,
                 precision: str = "fp32") -> None:
        if len(clip_bounds) != members or len(noise_multipliers) != members:
            raise UserError(f"a pack of {members} members needs {members} clip bounds and noise multipliers; "
                            f"got {len(clip_bounds)} and {len(noise_multipliers)}")
        for c, s in zip(clip_bounds, noise_multipliers):
            check_option("clip_bound", c)
            check_option("noise_multiplier", s)
        check_option("clip_fn", clip_fn)
        check_option("max_physical_batch_size", max_physical_batch_size)
        check_option("precision", precision)
        if not expected_batch_size > 0:
            raise UserError(f"expected_batch_size must be > 0; got {expected_batch_size!r}")
        check_model(model)
        check_estimator(norm_estimator, sketch_k)
        self.model = model
        self.members = members
        self.params = trainable_parameters(model)
        # the members' vectors live on the model's device: no host-to-device copy (a synchronisation) per step
        device = next(iter(self.params.values())).device
        self.clip_bounds = torch.tensor([float(c) for c in clip_bounds], dtype=torch.float64, device=device)
        self.noise_multipliers = torch.tensor([float(s) for s in noise_multipliers], dtype=torch.float64, device=device)
        self.expected_batch_size = float(expected_batch_size)
        self.clip = CLIP_FNS.get(clip_fn)
        self.max_physical_batch_size = max_physical_batch_size
        self.norms = NORM_ENGINES.get(norm_estimator)(model, loss_fn, sketch_k=sketch_k, precision=precision)
        self.noise_stream = noise
        self.shared_noise = shared_noise
        self.probes = probes
        self.active = torch.ones(members, dtype=torch.bool, device=device)

    def retire(self, k: int) -> None:
        """Member ``k`` stops: from now on it gets no gradient (and the optimizer leaves it as it is)."""
        self.active[k] = False

    def private_gradient(self, inputs: Inputs, targets: torch.Tensor) -> dict:
        """Set ``.grad`` of every packed parameter to the members' ĝ_k for one logical batch (b rows,
        seen by every member). Returns ``norms`` [K, b] and ``clipped_fraction`` [K] (NOT private)."""
        sums, norms = self.clipped_sum(inputs, targets)
        scale = self.active / (self.expected_batch_size * self.clip_bounds)   # 1/(B C_k), 0 if retired
        std = self.noise_multipliers * self.clip_bounds                       # σ_k C_k
        for name, p in self.params.items():
            s = sums[name]
            noisy = s + _members_shape(std, s) * self.standard_normal(s)
            p.grad = (noisy * _members_shape(scale, s)).to(p.dtype)
        finite = torch.isfinite(norms)
        over = (norms > self.clip_bounds.to(norms.dtype)[:, None]) & finite
        counted = finite.sum(dim=1).clamp_min(1)
        return {"norms": norms, "batch_size": int(norms.shape[1]),
                "nonfinite": (~finite).sum(dim=1), "clipped_fraction": over.sum(dim=1) / counted}

    def standard_normal(self, like: torch.Tensor) -> torch.Tensor:
        """ξ for a packed parameter's sums [K, *shape]: one draw of [*shape] shared by the members,
        or [K, *shape] independent draws; in at least float32."""
        dtype = torch.promote_types(like.dtype, torch.float32)
        shape = like.shape[1:] if self.shared_noise else like.shape
        if self.noise_stream is not None:
            xi = self.noise_stream.normal(shape, dtype=dtype, device=like.device)
        else:
            xi = torch.randn(shape, dtype=dtype, device=like.device)
        return xi.expand(like.shape) if self.shared_noise else xi

    def clipped_sum(self, inputs: Inputs, targets: torch.Tensor) -> tuple[Sums, torch.Tensor]:
        """(Σ_i c_ki g_ki per packed parameter [K, *shape], per-sample norms [K, b])."""
        K = self.members
        dtypes = {n: torch.promote_types(p.dtype, torch.float32) for n, p in self.params.items()}
        sums: Sums = {}
        all_norms = []
        if self.probes is not None and hasattr(self.norms, "start_step"):  # the same probes as alone
            self.norms.start_step(self.probes.seed())
        per_pass = None if self.max_physical_batch_size is None else max(1, self.max_physical_batch_size // K)
        if batch_len(inputs) > 0:
            for x, y in micro_batches(inputs, targets, per_pass):
                part, norms = self._pass(x, y)
                bad = ~torch.isfinite(norms) & self.active[:, None]
                for k in bad.any(dim=1).nonzero(as_tuple=True)[0].tolist():   # member k, without its bad rows
                    keep = (~bad[k]).nonzero(as_tuple=True)[0]
                    redone = self._pass(select_rows(x, keep), y[keep])[0] if len(keep) else None
                    for name in part:
                        part[name][k] = redone[name][k] if redone is not None else 0
                add_sums(sums, part, dtypes)
                all_norms.append(norms.detach())
        norms = torch.cat(all_norms, dim=1) if all_norms else torch.zeros(K, 0, device=targets.device)
        return {n: sums[n] if n in sums else torch.zeros_like(p, dtype=dtypes[n]) for n, p in self.params.items()}, norms

    def _pass(self, x: Inputs, y: torch.Tensor) -> tuple[Sums, torch.Tensor]:
        """One packed forward and backward of a micro-batch: (sums [K, ...], norms [K, b])."""
        part, norms = self.norms.clipped_sum(repeat_rows(x, self.members), repeat_rows(y, self.members), self._factors)
        return part, norms.reshape(self.members, -1)

    def _factors(self, norms: torch.Tensor) -> torch.Tensor:
        """c_ki = clip_fn(n_ki, C_k); 0 for a retired member's rows and for non-finite norms (those
        rows are done again without them when they matter: ``clipped_sum``)."""
        rows = norms.reshape(self.members, -1)
        bounds = self.clip_bounds.to(rows.dtype)[:, None]
        c = self.clip(rows, bounds) * self.active[:, None]
        return torch.where(torch.isfinite(c), c, torch.zeros_like(c)).reshape(-1)


class PackedOptimizer:
    """A torch optimizer over the packed parameters at learning rate 1, each member's displacement
    then scaled by its own η_k. Exact for SGD (with momentum and weight decay), Adam and AdamW,
    whose updates are linear in the learning rate; retired members are left as they are."""

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rates: Sequence[float], active: torch.Tensor) -> None:
        for group in optimizer.param_groups:
            if group["lr"] != 1.0:
                raise UserError(f"the packed optimizer steps at learning rate 1 and scales per member; got {group['lr']}")
        self.optimizer = optimizer
        device = optimizer.param_groups[0]["params"][0].device
        self.learning_rates = torch.tensor([float(lr) for lr in learning_rates], dtype=torch.float64, device=device)
        self.active = active

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        before = [p.detach().clone() for p in params]
        self.optimizer.step()
        rates = self.learning_rates * self.active
        for p, old in zip(params, before):
            rate = _members_shape(rates, p)
            p.copy_(old + rate * (p - old))

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)
