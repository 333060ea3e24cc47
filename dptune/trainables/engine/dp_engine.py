"""DPEngine: the privatised gradient of one Poisson-sampled logical batch (docs/architecture.md, "The DP step").

    ĝ = (Σ_i c_i g_i + σ C ξ) / (B C),   c_i = min(1, C/n_i) (flat) or C/(n_i + γ) (AUTO-S)

over the trainable parameters only, with B the *expected* batch size. The result does not depend
on how the logical batch is split into physical micro-batches. The optimizer then steps with ĝ.

The same engine computes it for a pack (``members`` K: a model built by :func:`.packing.pack_models`,
whose parameters carry a leading member dimension): member k with clip bound C_k and noise
multiplier σ_k gets

    ĝ_k = (Σ_i c_ki g_ki + σ_k C_k ξ_k) / (B C_k),   c_ki = clip_fn(n_ki, C_k)

where n_ki is example i's norm under member k's weights — every member sees the same Poisson batch,
repeated once per member (row k·b + i). A single model is the case K = 1 without the member
dimension: the clipping factors, the exclusion of non-finite examples, the noise and the
normalisation are one code path, written over the members' vectors [K].

The engine is a sequence of named, swappable parts, each usable and testable alone:

1. **per-sample norms and clipped sums** (``norm_estimator``: a ``NORM_ENGINES`` entry, e.g. the
   book-keeping hook engine with exact or randomised norms, or any object with ``clipped_sum``);
2. **clipping factors** (``clip_fn``: a ``CLIP_FNS`` entry);
3. the **all-reduce** of the clipped sums over data-parallel workers (optional);
4. **noise** (:class:`~.noise.GaussianNoise`, or any callable on the sums);
5. **normalisation** by the expected B·C (here: it is what makes the accounting hold);
6. **post-processors** of ĝ (``denoise``: a ``DENOISERS`` entry or instance; no privacy cost);
7. **diagnostics** (``diagnostics``: ``DIAGNOSTICS`` entries or instances; NOT private), which
   observe each step and never change it.

A new estimator, denoiser or diagnostic is one class registered in :mod:`dptune.schema.option_registries`.

The statistics returned with each step (per-sample norms, clipped fraction) are computed from
private examples and are **not** differentially private.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from ...errors import UserError
from ...privacy.validation import check_estimator
from .batching import Inputs, batch_len, members_shape, micro_batches, repeat_rows, select_rows
from ...schema import CLIP_BOUND, check_option
from .noise import GaussianNoise
from .per_sample import LossFn, check_model, trainable_parameters
from .randomness import Stream
from ...schema.option_registries import CLIP_FNS, DENOISERS, DIAGNOSTICS, NORM_ENGINES

Sums = dict[str, torch.Tensor]


@dataclass
class DPStep:
    """One step's quantities, handed to the diagnostics: the clipped sums Σ c_i g_i (after the
    all-reduce), ĝ before (``private``) and after (``gradient``) post-processing, the
    post-processors' statistics by key, the noise std σ/B of each entry of ĝ and the normalisation
    1/(B·C). ``clean`` is ḡ = Σ c_i g_i/(B·C), the step before noise: NOT private."""

    clipped: Sums
    private: Sums
    gradient: Sums
    post: dict = field(default_factory=dict)
    noise_std: float = 0.0
    scale: float = 1.0

    @property
    def clean(self) -> Sums:
        return {name: s * self.scale for name, s in self.clipped.items()}


def add_sums(sums: Sums, part: Sums, dtypes: dict[str, torch.dtype]) -> None:
    """Add one micro-batch's clipped sums to ``sums``; the first one of a parameter is taken as it is
    (in ``dtypes[name]``): no zeros to fill and add to, a pass over every parameter and step."""
    for name, s in part.items():
        if name in sums:
            sums[name] += s
        else:
            sums[name] = s.to(dtypes[name])


class DPEngine:
    """Computes privatised gradients for ``model`` and writes them to ``.grad`` (see the module docstring).

    Keyword-only privacy settings: ``clip_bound`` C > 0, ``noise_multiplier`` σ ≥ 0 (σ = 0 gives
    no privacy), ``expected_batch_size`` B = qN. The guarantee holds only when the batches passed
    to :meth:`private_gradient` are Poisson-sampled with rate q = B/N (see ``PoissonSampler``) and
    σ comes from ``dptune.privacy.calibrate_noise`` for the same q, steps and norm estimator.

    Parts: ``norm_estimator`` (a name with ``sketch_k`` probes for the randomised ones, seeded once
    per logical batch and layer from ``probes`` (a run's probe stream, or a torch generator), so that
    neither the micro-batch size nor the number of workers changes them; or a per-sample engine
    object), ``clip_fn``, the noise (``noise``; by default Gaussian from ``generator``: a run's noise
    stream, a torch generator or None), ``denoise`` (a name or a post-processor),
    ``diagnostics`` (names or objects, NOT private), ``all_reduce`` (W data-parallel workers,
    :mod:`.distributed`: sums the workers' clipped sums before the noise, which every worker then
    draws identically: noise added once). ``max_physical_batch_size`` bounds the micro-batches (a
    pack's: the rows of one packed pass, K times the examples).
    ``precision`` (fp32, bf16, fp16: :mod:`.precision`) autocasts the forward and backward only;
    norms, factors, clipped sums and noise stay in float32 or wider.

    A pack: ``members`` K, ``clip_bound`` and ``noise_multiplier`` one per member; ``shared_noise``
    draws one ξ per parameter and step for all members (reproducible runs: exactly the noise each
    member draws alone from the same seed), else each member its own (secure runs). A retired member
    (:meth:`retire`) contributes no rows, gets no noise and no step. The denoiser and the diagnostics
    see each active member's step as that member's own (:meth:`member_steps`: its slices, its σ_k/B and
    1/(B C_k)), so a member's ĝ and statistics are those of its configuration alone.
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, *, clip_bound: float | Sequence[float],
                 noise_multiplier: float | Sequence[float], expected_batch_size: float,
                 norm_estimator: str | object = "exact", sketch_k: int | None = None,
                 denoise: str | object | None = None, clip_fn: str = "flat",
                 max_physical_batch_size: int | None = None, generator: Stream | torch.Generator | None = None,
                 noise: Callable[[Sums], Sums] | None = None, diagnostics: Sequence[str | object] = (),
                 probes: Stream | torch.Generator | None = None,
                 all_reduce: Callable[[Sums], Sums] | None = None, precision: str = "fp32",
                 members: int | None = None, shared_noise: bool = True) -> None:
        self.packed = members is not None
        bounds = list(clip_bound) if self.packed else [clip_bound]
        sigmas = list(noise_multiplier) if self.packed else [noise_multiplier]
        self.members = members if self.packed else 1
        if len(bounds) != self.members or len(sigmas) != self.members:
            raise UserError(f"a pack of {members} members needs {members} clip bounds and noise multipliers; "
                            f"got {len(bounds)} and {len(sigmas)}")
        for c, s in zip(bounds, sigmas):
            check_option(CLIP_BOUND, c)   # the trainer's own rule for each (dptune/schema/trial.py)
            check_option("noise_multiplier", s)
        for name, value in (("clip_fn", clip_fn), ("max_physical_batch_size", max_physical_batch_size),
                            ("precision", precision)):
            check_option(name, value)
        if not expected_batch_size > 0:
            raise UserError(f"expected_batch_size must be > 0; got {expected_batch_size!r}")
        check_model(model)
        self.model = model
        self.params = trainable_parameters(model)
        # the members' vectors live on the model's device: no host-to-device copy (a synchronisation) per step
        device = next(iter(self.params.values())).device
        self.clip_bounds = torch.tensor([float(c) for c in bounds], dtype=torch.float64, device=device)
        self.noise_multipliers = torch.tensor([float(s) for s in sigmas], dtype=torch.float64, device=device)
        self.active = torch.ones(self.members, dtype=torch.bool, device=device)
        #: a single model's C and σ (None in a pack: see ``clip_bounds``, ``noise_multipliers``)
        self.clip_bound = None if self.packed else float(clip_bound)
        self.noise_multiplier = None if self.packed else float(noise_multiplier)
        self.expected_batch_size = float(expected_batch_size)
        self.clip = CLIP_FNS.get(clip_fn)
        self.max_physical_batch_size = max_physical_batch_size
        if isinstance(norm_estimator, str):
            check_estimator(norm_estimator, sketch_k)   # the accountant's rule: it exists; k when randomised
            norm_estimator = NORM_ENGINES.get(norm_estimator)(model, loss_fn, sketch_k=sketch_k, precision=precision)
        elif precision != "fp32":
            raise UserError(f"precision {precision!r} applies to the named norm estimators; a per-sample engine "
                            "object runs its own forward")
        self.norms = norm_estimator
        self.probes = probes
        std = self.noise_multipliers * self.clip_bounds if self.packed else self.noise_multiplier * self.clip_bound
        self.noise = noise or GaussianNoise(std, generator, shared=shared_noise)   # σC, a pack's σ_k C_k
        self.all_reduce = all_reduce
        self.denoiser = DENOISERS.get(denoise)() if isinstance(denoise, str) else denoise
        # a member's parameters: what its configuration alone would have (a pack's [K, …] less the member dimension)
        member = {n: p[0] for n, p in self.params.items()} if self.packed else self.params
        self.denoised = self.denoiser.matrices(member) if self.denoiser is not None else []
        self.diagnostics = [DIAGNOSTICS.get(d)() if isinstance(d, str) else d for d in diagnostics]
        for diagnostic in self.diagnostics:
            diagnostic.matrices(member)   # refuse one that has nothing to observe, before training

    @property
    def noise_std(self) -> float:
        """The noise std of each entry of a single model's ĝ: σ/B."""
        return self.noise_multiplier / self.expected_batch_size

    @property
    def parts(self) -> list:
        """The post-processors and diagnostics, whose step statistics the trainer aggregates per epoch."""
        return ([self.denoiser] if self.denoiser is not None else []) + self.diagnostics

    def retire(self, k: int) -> None:
        """Member ``k`` of a pack stops: from now on it gets no gradient (and the optimizer leaves it as it is)."""
        self.active[k] = False

    def keep_members(self, rows: Sequence[int]) -> None:
        """Shrink a pack to its members ``rows`` (indices into the member dimension, in order): their
        C, σ, noise std and active flags; the model's packed layers shrink with it
        (:func:`.packing.keep_members`). The noise stays one shared ξ per parameter (reproducible
        runs): each kept member draws what it drew before, as it would alone."""
        if not self.packed or not isinstance(self.noise, GaussianNoise):
            raise UserError("only a pack with the engine's own Gaussian noise can drop members")
        index = torch.tensor(list(rows), dtype=torch.long, device=self.clip_bounds.device)
        self.clip_bounds, self.noise_multipliers = self.clip_bounds[index], self.noise_multipliers[index]
        self.active = self.active[index]
        self.members = len(index)
        self.noise.std = self.noise_multipliers * self.clip_bounds

    def private_gradient(self, inputs: Inputs, targets: torch.Tensor) -> dict:
        """Set ``.grad`` of every trainable parameter to ĝ for this logical batch (in a pack, each
        member's slice to its ĝ_k).

        The parts in order: clipped sum → all-reduce → noise → normalise → post-processors.
        Returns ``norms`` (per-sample norms used for clipping; NaN or inf for an example that
        contributed nothing), ``clipped_fraction``, ``batch_size`` (realised) and ``nonfinite``
        (examples whose norm was not finite) — non-private diagnostics; in a pack ``norms`` [K, b]
        and the others per member [K] — and each post-processor's and diagnostic's statistics under its ``key``
        (a pack's: a list over the members, None for a retired one).
        """
        sums, norms = self._clipped_sums(inputs, targets)
        if self.all_reduce is not None:  # W workers: Σ over their clipped sums, before the one noise draw
            sums = self.all_reduce(sums)
        private = self.normalise(self.noise(sums))
        steps = self.member_steps(sums, private) if self.parts else []
        if self.denoiser is not None:
            for step in steps:
                if step is not None:
                    step.gradient, step.post[self.denoiser.key] = self.denoiser(step.private, step.noise_std,
                                                                                self.denoised)
            private = self._gradient(private, steps)
        for name, p in self.params.items():
            p.grad = private[name].to(p.dtype)
        finite = torch.isfinite(norms)
        over = (norms > self.clip_bounds.to(norms.dtype)[:, None]) & finite
        nonfinite, clipped = (~finite).sum(dim=1), over.sum(dim=1) / finite.sum(dim=1).clamp_min(1)
        if self.packed:
            stats = {"norms": norms, "batch_size": int(norms.shape[1]), "nonfinite": nonfinite,
                     "clipped_fraction": clipped}
        else:
            stats = {"norms": norms[0], "batch_size": int(norms.shape[1]), "nonfinite": int(nonfinite[0]),
                     "clipped_fraction": float(clipped[0])}
        for part in self.parts:   # diagnostics are NOT private: they may read the clipped sum before noise
            observed = [None if step is None else step.post[part.key] if part is self.denoiser else part.observe(step)
                        for step in steps]
            stats[part.key] = observed if self.packed else observed[0]
        return stats

    def member_steps(self, sums: Sums, private: Sums) -> list[DPStep | None]:
        """Each member's step as its configuration alone takes it (None for a retired member): its
        clipped sums and ĝ (a pack's row k), the noise std σ_k/B of each entry and 1/(B C_k)."""
        if not self.packed:
            return [DPStep(sums, private, private, noise_std=self.noise_std, scale=self.scale)]
        active = self.active.tolist()
        steps: list[DPStep | None] = []
        for k, (c, sigma) in enumerate(zip(self.clip_bounds.tolist(), self.noise_multipliers.tolist())):
            mine = {name: g[k] for name, g in private.items()}
            steps.append(DPStep({name: s[k] for name, s in sums.items()}, mine, mine,
                                noise_std=sigma / self.expected_batch_size,
                                scale=1.0 / (self.expected_batch_size * c)) if active[k] else None)
        return steps

    def _gradient(self, private: Sums, steps: list[DPStep | None]) -> Sums:
        """The step taken: ĝ with each member's post-processed matrices (a retired member's rows as they are)."""
        if not self.packed:
            return steps[0].gradient
        return {**private, **{name: torch.stack([private[name][k] if step is None else step.gradient[name]
                                                 for k, step in enumerate(steps)]) for name in self.denoised}}

    def clipped_sum(self, inputs: Inputs, targets: torch.Tensor) -> tuple[Sums, torch.Tensor]:
        """(Σ_i c_i g_i per trainable parameter, per-sample norms n_i) over the logical batch, one
        physical micro-batch at a time (the result does not depend on the split); a pack's norms
        are [K, b] and its sums [K, *shape], member k's in row k."""
        sums, norms = self._clipped_sums(inputs, targets)
        return sums, norms if self.packed else norms[0]

    def _clipped_sums(self, inputs: Inputs, targets: torch.Tensor) -> tuple[Sums, torch.Tensor]:
        """:meth:`clipped_sum` with the norms always [K, b] (K = 1 for a single model).

        An example whose norm is not finite for member k (a NaN or an overflow in its gradient)
        contributes nothing to member k: the micro-batch is computed again without it, and member k's
        sums taken from that pass, so it enters no product (0·NaN is NaN), and whether a step succeeds
        never depends on one example. Its norm is returned as is, so the caller can count it."""
        K = self.members
        # in at least float32, whatever the parameters' dtype (noise is added to them: noise.py)
        dtypes = {n: torch.promote_types(p.dtype, torch.float32) for n, p in self.params.items()}
        sums: Sums = {}
        all_norms = []
        if self.probes is not None and hasattr(self.norms, "start_step"):  # probes per (step, layer)
            self.norms.start_step(self.probes.seed() if isinstance(self.probes, Stream) else
                                  int(torch.randint(1 << 62, (1,), generator=self.probes, device=self.probes.device)))
        per_pass = None if self.max_physical_batch_size is None else max(1, self.max_physical_batch_size // K)
        if batch_len(inputs) > 0:
            for x, y in micro_batches(inputs, targets, per_pass):
                part, norms = self._pass(x, y)
                bad = ~torch.isfinite(norms) & self.active[:, None]
                for k in bad.any(dim=1).nonzero(as_tuple=True)[0].tolist():   # member k, without its bad rows
                    keep = (~bad[k]).nonzero(as_tuple=True)[0]
                    redone = self._pass(select_rows(x, keep), y[keep])[0] if len(keep) else {}
                    if not self.packed:
                        part = redone
                        continue
                    for name in part:
                        part[name][k] = redone[name][k] if redone else 0
                add_sums(sums, part, dtypes)
                all_norms.append(norms.detach())
        norms = torch.cat(all_norms, dim=1) if all_norms else torch.zeros(K, 0, device=targets.device)
        return {n: sums[n] if n in sums else torch.zeros_like(p, dtype=dtypes[n]) for n, p in self.params.items()}, norms

    def _pass(self, x: Inputs, y: torch.Tensor) -> tuple[Sums, torch.Tensor]:
        """One forward and backward of a micro-batch (a pack's: every member's rows): (sums, norms [K, b])."""
        if self.packed:
            x, y = repeat_rows(x, self.members), repeat_rows(y, self.members)
        part, norms = self.norms.clipped_sum(x, y, self._factors)
        return part, norms.reshape(self.members, -1)

    def _factors(self, norms: torch.Tensor) -> torch.Tensor:
        """c_ki = clip_fn(n_ki, C_k); 0 for a retired member's rows and for non-finite norms (those
        rows are done again without them: :meth:`_clipped_sums`)."""
        rows = norms.reshape(self.members, -1)
        c = self.clip(rows, self.clip_bounds.to(rows.dtype)[:, None]) * self.active[:, None]
        return torch.where(torch.isfinite(c), c, torch.zeros_like(c)).reshape(-1)

    @property
    def scale(self) -> float:
        """A single model's 1/(B C), with B the *expected* batch size (the realised one would leak)."""
        return 1.0 / (self.expected_batch_size * self.clip_bound)

    def normalise(self, noisy: Sums) -> Sums:
        """ĝ = s / (B C); a pack's member k by 1/(B C_k), a retired member's by 0."""
        if not self.packed:
            return {name: s * self.scale for name, s in noisy.items()}
        scale = self.active / (self.expected_batch_size * self.clip_bounds)
        return {name: s * members_shape(scale, s) for name, s in noisy.items()}

