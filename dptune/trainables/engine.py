"""DPEngine: the privatised gradient of one Poisson-sampled logical batch (DESIGN "The DP step").

    ĝ = (Σ_i c_i g_i + σ C ξ) / (B C),   c_i = min(1, C/n_i) (flat) or C/(n_i + γ) (AUTO-S)

over the trainable parameters only, with B the *expected* batch size. The result does not depend
on how the logical batch is split into physical micro-batches. The optimizer then steps with ĝ.

The statistics returned with each step (per-sample norms, clipped fractions, per-class norm
quantiles) are computed from private examples and are **not** differentially private.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .batching import Inputs, batch_len, micro_batches
from .clipping import CLIP_FNS, clip_factors
from .denoise import DEFAULT_KAPPA, rmt_denoise_matrices
from .norm_stats import class_norm_statistics
from .hook_norms import hook_engine
from .per_sample import ExactNormEngine, LossFn, check_model, trainable_parameters

#: Per-sample norm engines by ``norm_estimator``; randomised estimators register here too.
NORM_ENGINES: dict[str, Callable[..., object]] = {
    "exact": ExactNormEngine, "hutchinson": hook_engine("hutchinson"), "hutchpp": hook_engine("hutchpp")}
#: Gradient denoisers by ``denoise`` name: fn({name: ĝ of a 2-D parameter}, noise std per entry, *, kappa)
#: -> ({name: denoised matrix}, step statistics). They see the privatised ĝ and nothing per-sample.
DENOISERS: dict[str, Callable[..., tuple[dict[str, torch.Tensor], dict]]] = {"rmt": rmt_denoise_matrices}


class DPEngine:
    """Computes privatised gradients for ``model`` and writes them to ``.grad``.

    Keyword-only privacy settings: ``clip_bound`` C > 0, ``noise_multiplier`` σ ≥ 0 (σ = 0 gives
    no privacy), ``expected_batch_size`` B = qN. The guarantee holds only when the batches passed
    to :meth:`private_gradient` are Poisson-sampled with rate q = B/N (see ``PoissonSampler``) and
    σ comes from ``dptune.privacy.calibrate_noise`` for the same q, steps and norm estimator.
    ``generator`` drives the Gaussian noise (seed it for reproducible runs). ``denoise`` names a
    ``DENOISERS`` entry applied to the 2-D parameters' ĝ (post-processing, no privacy cost) with
    gate factor ``denoise_kappa``.
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, *, clip_bound: float, noise_multiplier: float,
                 expected_batch_size: float, norm_estimator: str = "exact", sketch_k: int | None = None,
                 denoise: str | None = None, clip_fn: str = "flat", max_physical_batch_size: int | None = None,
                 generator: torch.Generator | None = None, denoise_kappa: float = DEFAULT_KAPPA) -> None:
        if not clip_bound > 0:
            raise ValueError(f"clip_bound must be > 0; got {clip_bound!r}")
        if not noise_multiplier >= 0:
            raise ValueError(f"noise_multiplier must be >= 0; got {noise_multiplier!r}")
        if not expected_batch_size > 0:
            raise ValueError(f"expected_batch_size must be > 0; got {expected_batch_size!r}")
        if clip_fn not in CLIP_FNS:
            raise ValueError(f"clip_fn must be one of {', '.join(CLIP_FNS)}; got {clip_fn!r}")
        if norm_estimator not in NORM_ENGINES:
            raise ValueError(f"norm_estimator must be one of {', '.join(NORM_ENGINES)}; got {norm_estimator!r}")
        if denoise is not None and denoise not in DENOISERS:
            allowed = ", ".join(["None", *DENOISERS])
            raise ValueError(f"denoise must be one of {allowed}; got {denoise!r}")
        if not denoise_kappa >= 1:
            raise ValueError(f"denoise_kappa must be >= 1; got {denoise_kappa!r}")
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
        self.max_physical_batch_size = max_physical_batch_size
        self.generator = generator
        self.norms = NORM_ENGINES[norm_estimator](model, loss_fn, sketch_k=sketch_k, generator=generator)

    def private_gradient(self, inputs: Inputs, targets: torch.Tensor) -> dict:
        """Set ``.grad`` of every trainable parameter to ĝ for this logical batch.

        Returns ``norms`` (per-sample norms used for clipping), ``clipped_fraction``,
        ``batch_size`` (realised) and, for integer class targets, ``per_class`` statistics — all
        non-private diagnostics — and, when denoising, the denoiser's ``denoise`` statistics.
        """
        C = self.clip_bound
        sums = {n: torch.zeros_like(p) for n, p in self.params.items()}
        all_norms = []
        if batch_len(inputs) > 0:
            for x, y in micro_batches(inputs, targets, self.max_physical_batch_size):
                part, norms = self.norms.clipped_sum(x, y, lambda n: clip_factors(self.clip_fn, n, C))
                for name, s in part.items():
                    sums[name] += s
                all_norms.append(norms.detach())
        scale = 1.0 / (self.expected_batch_size * C)
        noise_std = self.noise_multiplier * C
        private = {}
        for name, g in sums.items():
            if noise_std > 0:
                g = g + noise_std * self._gaussian_like(g)
            private[name] = g * scale
        denoise_stats = None
        if self.denoise is not None:
            # Post-processing: the denoiser gets ĝ of the 2-D parameters and s = σ/B, nothing else.
            matrices = {n: g.detach() for n, g in private.items() if g.dim() == 2}
            entry_std = self.noise_multiplier / self.expected_batch_size
            denoised, denoise_stats = DENOISERS[self.denoise](matrices, entry_std, kappa=self.denoise_kappa)
            private.update(denoised)
        for name, p in self.params.items():
            p.grad = private[name].to(p.dtype)
        norms = torch.cat(all_norms) if all_norms else torch.zeros(0, device=targets.device)
        stats = self._statistics(norms, targets)
        if denoise_stats is not None:
            stats["denoise"] = denoise_stats
        return stats

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
