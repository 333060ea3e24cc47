"""DPEngine: the privatised gradient of one Poisson-sampled logical batch (docs/architecture.md, "The DP step").

    ĝ = (Σ_i c_i g_i + σ C ξ) / (B C),   c_i = min(1, C/n_i) (flat) or C/(n_i + γ) (AUTO-S)

over the trainable parameters only, with B the *expected* batch size. The result does not depend
on how the logical batch is split into physical micro-batches. The optimizer then steps with ĝ.

The statistics returned with each step (per-sample norms, clipped fractions, per-class norm
quantiles) are computed from private examples and are **not** differentially private.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from .batching import Inputs, batch_len, micro_batches
from .clip_factors import CLIP_FNS, clip_factors
from .denoise import DEFAULT_KAPPA, cosine_diagnostic
from .norm_stats import class_norm_statistics
from ..registry import Registry
from .per_sample import LossFn, VmapNormEngine, check_model, trainable_parameters
from .registries import DENOISE_SCOPES, DENOISERS, DIAGNOSTICS, NORM_ENGINES

#: Implementations of exact per-sample gradients (``per_sample``): ``hooks`` is the default
#: book-keeping engine, ``vmap`` the whole-model ``torch.func`` reference that tests compare to.
EXACT_ENGINES: Registry[Callable[..., object]] = Registry("per_sample")
EXACT_ENGINES.register("hooks", NORM_ENGINES.get("exact"))  # noqa
EXACT_ENGINES.register("vmap", VmapNormEngine)


class DPEngine:
    """Computes privatised gradients for ``model`` and writes them to ``.grad``.

    Keyword-only privacy settings: ``clip_bound`` C > 0, ``noise_multiplier`` σ ≥ 0 (σ = 0 gives
    no privacy), ``expected_batch_size`` B = qN. The guarantee holds only when the batches passed
    to :meth:`private_gradient` are Poisson-sampled with rate q = B/N (see ``PoissonSampler``) and
    σ comes from ``dptune.privacy.calibrate_noise`` for the same q, steps and norm estimator.
    ``generator`` drives the Gaussian noise (seed it for reproducible runs). ``denoise`` names a
    ``DENOISERS`` entry applied to the 2-D parameters' ĝ (post-processing, no privacy cost) with
    gate factor ``denoise_kappa``, norm correction ``denoise_norm_correction`` and the 2-D parameters
    of ``denoise_scope``. ``probe_generator`` (optional) seeds the randomised estimators' probes once
    per logical batch and layer: then neither the micro-batch size nor the number of workers changes
    them. ``all_reduce`` (W data-parallel workers, :mod:`.distributed`) sums the workers' clipped sums
    before the noise, which every worker then draws identically: noise added once.
    ``diagnostics`` names ``DIAGNOSTICS`` entries (NOT private). ``per_sample`` picks the implementation of exact norms:
    ``hooks`` (book-keeping, the default) or ``vmap`` (the whole-model reference, for tests).
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, *, clip_bound: float, noise_multiplier: float,
                 expected_batch_size: float, norm_estimator: str = "exact", sketch_k: int | None = None,
                 denoise: str | None = None, clip_fn: str = "flat", max_physical_batch_size: int | None = None,
                 generator: torch.Generator | None = None, denoise_kappa: float = DEFAULT_KAPPA,
                 per_sample: str = "hooks", denoise_norm_correction: bool = True, denoise_scope: str = "all",
                 diagnostics: Sequence[str] = (), probe_generator: torch.Generator | None = None,
                 all_reduce: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None) -> None:
        if not clip_bound > 0:
            raise ValueError(f"clip_bound must be > 0; got {clip_bound!r}")
        if not noise_multiplier >= 0:
            raise ValueError(f"noise_multiplier must be >= 0; got {noise_multiplier!r}")
        if not expected_batch_size > 0:
            raise ValueError(f"expected_batch_size must be > 0; got {expected_batch_size!r}")
        CLIP_FNS.get(clip_fn), NORM_ENGINES.get(norm_estimator), EXACT_ENGINES.get(per_sample)  # name the field
        if per_sample != "hooks" and norm_estimator != "exact":
            raise ValueError(f"per_sample={per_sample!r} computes exact norms only; got norm_estimator={norm_estimator!r}")
        if denoise is not None and denoise not in DENOISERS:
            allowed = ", ".join(["None", *DENOISERS])
            raise ValueError(f"denoise must be one of {allowed}; got {denoise!r}")
        if not denoise_kappa >= 1:
            raise ValueError(f"denoise_kappa must be >= 1; got {denoise_kappa!r}")
        in_scope = DENOISE_SCOPES.get(denoise_scope)
        for name in diagnostics:
            DIAGNOSTICS.get(name)
        if max_physical_batch_size is not None and max_physical_batch_size < 1:
            raise ValueError(f"max_physical_batch_size must be >= 1 or None; got {max_physical_batch_size!r}")
        check_model(model)
        self.model = model
        self.params = trainable_parameters(model)
        self.clip_bound = float(clip_bound)
        self.noise_multiplier = float(noise_multiplier)
        self.expected_batch_size = float(expected_batch_size)
        self.clip_fn = clip_fn
        self.denoise = denoise
        self.denoise_kappa = float(denoise_kappa)
        self.denoise_norm_correction = bool(denoise_norm_correction)
        self.diagnostics = tuple(diagnostics)
        self.denoised_names = [n for n, p in self.params.items() if p.dim() == 2 and in_scope(n)]
        if (denoise is not None or self.diagnostics) and not self.denoised_names:
            raise ValueError(f"denoise_scope={denoise_scope!r} selects no 2-D trainable parameter of this model "
                             f"(allowed: {', '.join(DENOISE_SCOPES)}; 'lora' needs LoRA factors)")
        self.max_physical_batch_size = max_physical_batch_size
        self.generator = generator
        self.probe_generator = probe_generator
        self.all_reduce = all_reduce
        build = EXACT_ENGINES.get(per_sample) if norm_estimator == "exact" else NORM_ENGINES.get(norm_estimator)
        self.norms = build(model, loss_fn, sketch_k=sketch_k, generator=generator)

    def private_gradient(self, inputs: Inputs, targets: torch.Tensor) -> dict:
        """Set ``.grad`` of every trainable parameter to ĝ for this logical batch.

        The steps of the DP step, in order: clipped sum → add noise → normalise → denoise.
        Returns ``norms`` (per-sample norms used for clipping), ``clipped_fraction``,
        ``batch_size`` (realised) and, for integer class targets, ``per_class`` statistics — all
        non-private diagnostics — and, when denoising, the denoiser's ``denoise`` statistics.
        """
        sums, norms = self.clipped_sum(inputs, targets)
        if self.all_reduce is not None:  # W workers: Σ over their clipped sums, before the one noise draw
            sums = self.all_reduce(sums)
        private = self.normalise(self.add_noise(sums))
        denoised, denoise_stats = self.denoised(private)
        for name, p in self.params.items():
            p.grad = denoised[name].to(p.dtype)
        stats = self._statistics(norms, targets)
        if denoise_stats is not None:
            stats["denoise"] = denoise_stats
        if "denoise_cosine" in self.diagnostics:  # NOT private: reads the clipped sum before noise
            if denoise_stats is None:  # what rmt would have made of ĝ; the step above is plain
                denoised, denoise_stats = self.denoised(private, "rmt")
            stats["denoise_cosine"] = cosine_diagnostic(private, denoised, self.normalise(sums),
                                                        denoise_stats["per_layer"])
        return stats

    def clipped_sum(self, inputs: Inputs, targets: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(Σ_i c_i g_i per trainable parameter, per-sample norms n_i) over the logical batch, one
        physical micro-batch at a time (the result does not depend on the split)."""
        sums = {n: torch.zeros_like(p) for n, p in self.params.items()}
        all_norms = []
        if self.probe_generator is not None and hasattr(self.norms, "start_step"):  # probes per (step, layer)
            self.norms.start_step(int(torch.randint(1 << 62, (1,), generator=self.probe_generator,
                                                    device=self.probe_generator.device)))
        if batch_len(inputs) > 0:
            for x, y in micro_batches(inputs, targets, self.max_physical_batch_size):
                part, norms = self.norms.clipped_sum(x, y, lambda n: clip_factors(self.clip_fn, n, self.clip_bound))
                for name, s in part.items():
                    sums[name] += s
                all_norms.append(norms.detach())
        norms = torch.cat(all_norms) if all_norms else torch.zeros(0, device=targets.device)
        return sums, norms

    def add_noise(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """s + σ C ξ, ξ ~ N(0, I) drawn from the engine's generator."""
        noise_std = self.noise_multiplier * self.clip_bound
        if noise_std == 0:
            return sums
        return {name: s + noise_std * self._gaussian_like(s) for name, s in sums.items()}

    def normalise(self, noisy: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """ĝ = s / (B C) with B the *expected* batch size (the realised one would leak)."""
        scale = 1.0 / (self.expected_batch_size * self.clip_bound)
        return {name: s * scale for name, s in noisy.items()}

    def denoised(self, private: dict[str, torch.Tensor],
                 denoise: str | None = None) -> tuple[dict[str, torch.Tensor], dict | None]:
        """ĝ with the 2-D parameters of ``denoise_scope`` denoised (post-processing: the denoiser sees
        ĝ and the noise std per entry σ/B, nothing per-sample), and the denoiser's statistics;
        unchanged without one. ``denoise`` overrides the engine's denoiser (the diagnostic's use)."""
        denoise = denoise or self.denoise
        if denoise is None:
            return private, None
        matrices = {n: private[n].detach() for n in self.denoised_names}
        entry_std = self.noise_multiplier / self.expected_batch_size
        denoised, stats = DENOISERS.get(denoise)(matrices, entry_std, kappa=self.denoise_kappa,
                                                 norm_correction=self.denoise_norm_correction)
        return {**private, **denoised}, stats

    def _gaussian_like(self, t: torch.Tensor) -> torch.Tensor:
        if self.generator is None:
            return torch.randn_like(t)
        noise = torch.randn(t.shape, generator=self.generator, dtype=t.dtype, device=self.generator.device)
        return noise.to(t.device)

    def _statistics(self, norms: torch.Tensor, targets: torch.Tensor) -> dict:
        stats = {"norms": norms, "batch_size": int(norms.numel()),
                 "clipped_fraction": float((norms > self.clip_bound).float().mean()) if norms.numel() else 0.0}
        if targets.dim() == 1 and not targets.is_floating_point() and norms.numel():
            stats["per_class"] = class_norm_statistics(norms, targets, self.clip_bound)
        return stats
