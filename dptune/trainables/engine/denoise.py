"""RMT spectral denoising of a privatised gradient (docs/architecture.md, "RMT denoising").

From "Re-examining low-rank adaptation for private LLM fine-tuning" (NeurIPS 2026).

Isotropic Gaussian noise of std s per entry inflates every singular value of an m×n gradient
matrix: a signal singular value λ above the BBP threshold s·(mn)^{1/4} is seen as

    F(λ)² = λ² + s²(m+n) + s⁴mn/λ²,

and pure noise fills the bulk [0, e] with edge e = s(√m + √n). The denoiser inverts F for the
singular values above e, applies the optimal shrinkage η of Shabalin & Nobel (2013), and rescales
the result to the input's Frobenius norm (block norm correction: a per-layer cosine gain then
carries over to the whole gradient). A layer whose top singular value does not clear the gate
κ·e is returned unchanged.

It reads only ĝ and s, so it is post-processing of the privatised gradient: no privacy cost.
Same-shape matrices (an m×n matrix joins the n×m ones, transposed) share one batched SVD.

The engine's parts (:mod:`.dp_engine`): :class:`RMTDenoiser`, the ``rmt`` post-processor with its own
options (gate κ, norm correction, scope), and :class:`CosineDiagnostic`, the non-private
``denoise_cosine`` diagnostic. Each builds itself from a trial's config (``from_config``) and
aggregates its per-step statistics into epoch metrics (``epoch_metrics``).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, NamedTuple, Sequence

import torch

from ...errors import UserError
from ...schema import FIELDS, check_option
from ...schema.option_registries import DENOISE_SCOPES

if TYPE_CHECKING:
    from ...schema import TrainConfig
    from .dp_engine import DPStep

#: Gate factor κ of the paper (denoise only if λ̃₁ > κ·s(√m+√n)): the default of the trial option.
DEFAULT_KAPPA = FIELDS["denoise_kappa"].default


def every_matrix(name: str) -> bool:
    """``denoise_scope: all``: every 2-D trainable parameter is denoised."""
    return True


def lora_factors(name: str) -> bool:
    """``denoise_scope: lora``: only LoRA's factors (peft names them ``…lora_A…``/``…lora_B…``), an
    ablation of the paper's setting."""
    return "lora_A" in name or "lora_B" in name


def bulk_edge(noise_std: float, m: int, n: int) -> float:
    """e = s(√m + √n): the largest singular value of an m×n pure-noise matrix, asymptotically."""
    return noise_std * (math.sqrt(m) + math.sqrt(n))


def bbp_threshold(noise_std: float, m: int, n: int) -> float:
    """s·(mn)^{1/4}: signal singular values at or below it are not detectable (F maps it to e)."""
    return noise_std * (m * n) ** 0.25


def bbp_inflation(signal_sv: torch.Tensor, noise_std: float, m: int, n: int) -> torch.Tensor:
    """F(λ) = √(λ² + s²(m+n) + s⁴mn/λ²): where noise moves a signal singular value λ > 0."""
    s2 = noise_std ** 2
    return (signal_sv ** 2 + s2 * (m + n) + s2 * s2 * m * n / signal_sv ** 2).sqrt()


def invert_inflation(noisy_sv: torch.Tensor, noise_std: float, m: int, n: int) -> torch.Tensor:
    """λ̂ = F⁻¹(λ̃) for λ̃ above the bulk edge e, and 0 at or below it (no detectable signal).

    λ̂² = [b + √(b² − 4s⁴mn)]/2 with b = λ̃² − s²(m+n): the larger root, the one ≥ s²√(mn).
    """
    s2 = noise_std ** 2
    b = noisy_sv ** 2 - s2 * (m + n)
    disc = (b ** 2 - 4 * s2 * s2 * m * n).clamp_min(0)
    lam_hat = ((b + disc.sqrt()) / 2).clamp_min(0).sqrt()
    return torch.where(noisy_sv > bulk_edge(noise_std, m, n), lam_hat, torch.zeros_like(lam_hat))


def optimal_shrinkage(signal_sv: torch.Tensor, noise_std: float, m: int, n: int) -> torch.Tensor:
    """η(λ̂) = λ̂·√((λ̂⁴ − mns⁴)/(λ̂⁴ + mλ̂²s²))·√((λ̂⁴ − mns⁴)/(λ̂⁴ + nλ̂²s²)); 0 when λ̂⁴ ≤ mns⁴.

    The weight of a noisy singular pair ũṽᵀ that minimises the Frobenius error, given the
    estimated signal singular value λ̂ (it discounts the pair's angle to the true one).
    """
    s2 = noise_std ** 2
    l2 = signal_sv ** 2
    l4 = l2 ** 2
    excess = l4 - m * n * s2 * s2
    above = excess > 0
    safe_l4 = torch.where(above, l4, torch.ones_like(l4))  # avoids 0/0 where η is 0 anyway
    eta = signal_sv * (excess / (safe_l4 + m * l2 * s2)).clamp_min(0).sqrt() \
        * (excess / (safe_l4 + n * l2 * s2)).clamp_min(0).sqrt()
    return torch.where(above, eta, torch.zeros_like(eta))


def shrink_singular_values(noisy_sv: torch.Tensor, noise_std: float, m: int, n: int) -> torch.Tensor:
    """η_i for noisy singular values λ̃_i: η(F⁻¹(λ̃_i)), and 0 for λ̃_i ≤ e."""
    return optimal_shrinkage(invert_inflation(noisy_sv, noise_std, m, n), noise_std, m, n)


class BatchDenoised(NamedTuple):
    """Result of :func:`rmt_denoise_batch`, per matrix of the batch."""

    denoised: torch.Tensor  # [k, m, n]
    passed: torch.Tensor    # [k] bool: cleared the gate (and was denoised)
    shrinkage: torch.Tensor  # [k] ‖X̂‖_F/‖ĝ‖_F before norm correction (1 where not denoised)
    rank: torch.Tensor      # [k] singular pairs kept (η_i > 0; 0 where not denoised)


def _check(noise_std: float, kappa: float) -> None:
    if not (math.isfinite(noise_std) and noise_std >= 0):
        raise UserError(f"noise_std must be finite and >= 0; got {noise_std!r}")
    if not (math.isfinite(kappa) and kappa >= 1):
        raise UserError(f"kappa must be >= 1 (the gate sits at κ times the noise bulk edge); got {kappa!r}")


def rmt_denoise_batch(grads: torch.Tensor, noise_std: float, kappa: float = DEFAULT_KAPPA, *,
                      norm_correction: bool = True) -> BatchDenoised:
    """Denoise a stack of same-shape gradient matrices [k, m, n] with one batched SVD.

    ``norm_correction=False`` (an ablation) returns the shrunk matrix X̂ itself, not X̂·‖ĝ‖/‖X̂‖."""
    _check(noise_std, kappa)
    if grads.dim() != 3:
        raise UserError(f"grads must be a [k, m, n] stack of matrices; got shape {tuple(grads.shape)}")
    _, m, n = grads.shape
    work = grads if grads.dtype in (torch.float32, torch.float64) else grads.float()  # SVD needs fp32/fp64
    U, S, Vh = torch.linalg.svd(work, full_matrices=False)  # [k, m, r], [k, r], [k, r, n]; r = min(m, n)
    sv = S.double()  # the closed forms take differences of O(s⁴mn) terms: keep them in float64
    eta = shrink_singular_values(sv, noise_std, m, n)  # [k, r]
    eta_norm = eta.norm(dim=1)  # [k] = ‖X̂‖_F (U, V orthonormal)
    grad_norm = sv.norm(dim=1)  # [k] = ‖ĝ‖_F
    passed = (sv[:, 0] > kappa * bulk_edge(noise_std, m, n)) & (eta_norm > 0)  # [k]
    # Norm correction: X̂·‖ĝ‖/‖X̂‖, so the denoised matrix keeps ĝ's Frobenius norm.
    scale = torch.where(passed, grad_norm / torch.where(passed, eta_norm, torch.ones_like(eta_norm)),
                        torch.zeros_like(eta_norm)) if norm_correction else torch.ones_like(eta_norm)  # [k]
    coef = (eta * scale[:, None]).to(work.dtype)  # [k, r]
    rebuilt = ((U * coef[:, None, :]) @ Vh).to(grads.dtype)  # [k, m, n]
    denoised = torch.where(passed[:, None, None], rebuilt, grads)  # [k, m, n]
    shrinkage = torch.where(passed, eta_norm / grad_norm.clamp_min(torch.finfo(sv.dtype).tiny),
                            torch.ones_like(eta_norm))
    rank = torch.where(passed, (eta > 0).sum(dim=1), torch.zeros_like(passed, dtype=torch.long))
    return BatchDenoised(denoised, passed, shrinkage, rank)


def rmt_denoise(grad: torch.Tensor, noise_std: float, kappa: float = DEFAULT_KAPPA, *,
                norm_correction: bool = True) -> torch.Tensor:
    """Denoise one 2-D gradient ĝ [m, n] whose entries carry i.i.d. noise of std ``noise_std``.

    Returns ĝ unchanged when its top singular value is at most κ·s(√m+√n); otherwise the optimal
    spectral shrinkage of ĝ rescaled to ‖ĝ‖_F. Example (pure noise stays as it is):

    >>> g = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    >>> bool(torch.equal(rmt_denoise(g, noise_std=1.0), g))
    True
    """
    if grad.dim() != 2:
        raise UserError(f"grad must be a 2-D matrix; got shape {tuple(grad.shape)}")
    return rmt_denoise_batch(grad.unsqueeze(0), noise_std, kappa, norm_correction=norm_correction).denoised[0]


def rmt_denoise_matrices(grads: Mapping[str, torch.Tensor], noise_std: float, *, kappa: float = DEFAULT_KAPPA,
                         norm_correction: bool = True) -> tuple[dict[str, torch.Tensor], dict]:
    """Denoise named 2-D gradients, one batched SVD per group of equal (shape up to transpose,
    dtype, device); the ``denoise="rmt"`` entry of the engine's ``DENOISERS``.

    Returns the denoised matrices (same names and shapes) and the step's statistics:
    ``layers``, ``passed_gate`` (layers that cleared the gate), ``mean_shrinkage`` (mean over those
    of ‖X̂‖_F/‖ĝ‖_F before norm correction; nan when none passed) and ``mean_rank`` (mean number of
    singular pairs kept; nan when none passed), and ``per_layer``: {name: (passed, rank, shrinkage)}
    tensors on the gradients' device, for the non-private cosine diagnostic.
    """
    _check(noise_std, kappa)
    groups: dict[tuple, list[str]] = {}
    for name, g in grads.items():
        if g.dim() != 2:
            raise UserError(f"{name}: only 2-D gradients can be denoised; got shape {tuple(g.shape)}")
        m, n = sorted(g.shape)  # m×n and n×m matrices share a batch (the formulas are symmetric in m, n)
        groups.setdefault((m, n, g.dtype, g.device), []).append(name)
    out: dict[str, torch.Tensor] = {}
    per_layer: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    passed, shrinkage, rank = [], [], []  # per group: [k] gate flags; [k_passed] of the gated layers
    for (m, n, _, _), names in groups.items():
        flip = [grads[name].shape[0] != m for name in names]
        stack = torch.stack([grads[name].T if f else grads[name] for name, f in zip(names, flip)])  # [k, m, n]
        result = rmt_denoise_batch(stack, noise_std, kappa, norm_correction=norm_correction)
        for i, (name, f) in enumerate(zip(names, flip)):
            out[name] = result.denoised[i].T.contiguous() if f else result.denoised[i]
            per_layer[name] = (result.passed[i], result.rank[i], result.shrinkage[i])
        passed.append(result.passed.cpu())
        shrinkage.append(result.shrinkage[result.passed].cpu())
        rank.append(result.rank[result.passed].cpu().double())
    n_layers, n_passed = len(grads), int(sum(int(p.sum()) for p in passed))
    stats = {"layers": n_layers, "passed_gate": n_passed,
             "mean_shrinkage": float(torch.cat(shrinkage).mean()) if n_passed else math.nan,
             "mean_rank": float(torch.cat(rank).mean()) if n_passed else math.nan, "per_layer": per_layer}
    return out, stats


def epoch_denoise_metrics(steps: Sequence[dict]) -> dict:
    """Aggregate per-step ``denoise`` statistics into epoch metrics.

    ``denoise_gate_rate``: fraction of (layer, step) pairs that cleared the gate;
    ``denoise_mean_shrinkage`` and ``denoise_mean_rank``: means over those pairs (nan if none).
    """
    layers = sum(s["layers"] for s in steps)
    passed = sum(s["passed_gate"] for s in steps)
    gated = [s for s in steps if s["passed_gate"]]
    return {
        "denoise_gate_rate": passed / layers if layers else math.nan,
        "denoise_mean_shrinkage": (sum(s["mean_shrinkage"] * s["passed_gate"] for s in gated) / passed
                                   if passed else math.nan),
        "denoise_mean_rank": sum(s["mean_rank"] * s["passed_gate"] for s in gated) / passed if passed else math.nan,
    }


#: Keys of the epoch metrics of the ``denoise_cosine`` diagnostic; the ``nonprivate_`` prefix says
#: that they are computed from the clipped mean before noise, i.e. from private examples.
COSINE_METRICS = ("nonprivate_cos_noisy", "nonprivate_cos_denoised", "nonprivate_cos_gain",
                  "nonprivate_cos_improved", "nonprivate_cos_gate_rate", "nonprivate_cos_rank",
                  "nonprivate_cos_shrinkage")


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """cos(a, b) in float64; nan when either is zero (e.g. an empty Poisson batch)."""
    a, b = a.double().flatten(), b.double().flatten()
    denom = float(a.norm() * b.norm())
    return float(a @ b) / denom if denom > 0 else math.nan


def cosine_diagnostic(noisy: Mapping[str, torch.Tensor], denoised: Mapping[str, torch.Tensor],
                      clean: Mapping[str, torch.Tensor], per_layer: Mapping[str, tuple]) -> list[dict]:
    """Per 2-D layer of one step: cos(ĝ, ḡ), cos(denoised, ḡ), their difference, the gate, kept rank
    and shrinkage, with ḡ the same step's clipped sum before noise (on ĝ's scale, Σ c_i g_i/(BC)).

    This tests the claim of "Re-examining low-rank adaptation for private LLM fine-tuning" that the
    cosine to the signal never decreases once the gate opens. ḡ is computed from private examples:
    the result is NOT differentially private.
    """
    rows = []
    for name, (passed, rank, shrinkage) in per_layer.items():
        cos_noisy = _cosine(noisy[name], clean[name])
        cos_denoised = _cosine(denoised[name], clean[name])
        rows.append({"layer": name, "cos_noisy": cos_noisy, "cos_denoised": cos_denoised,
                     "gain": cos_denoised - cos_noisy, "passed": bool(passed), "rank": int(rank),
                     "shrinkage": float(shrinkage)})
    return rows


def epoch_cosine_metrics(steps: Sequence[Sequence[dict]]) -> dict:
    """Aggregate the per-step, per-layer rows of :func:`cosine_diagnostic` into epoch metrics.

    Over (layer, step) pairs with a defined cosine: ``nonprivate_cos_noisy`` / ``_denoised`` (means),
    ``_gate_rate`` (share of pairs whose gate opened); over the gate-open pairs: ``_gain`` (mean of
    cos(denoised, ḡ) − cos(ĝ, ḡ)), ``_improved`` (share with a positive gain), ``_rank`` and
    ``_shrinkage`` (means); nan where there is nothing to average. NOT differentially private.
    """
    rows = [r for step in steps for r in step if not math.isnan(r["cos_noisy"])]
    gated = [r for r in rows if r["passed"]]

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    return {"nonprivate_cos_noisy": mean([r["cos_noisy"] for r in rows]),
            "nonprivate_cos_denoised": mean([r["cos_denoised"] for r in rows]),
            "nonprivate_cos_gain": mean([r["gain"] for r in gated]),
            "nonprivate_cos_improved": mean([float(r["gain"] > 0) for r in gated]),
            "nonprivate_cos_gate_rate": len(gated) / len(rows) if rows else math.nan,
            "nonprivate_cos_rank": mean([float(r["rank"]) for r in gated]),
            "nonprivate_cos_shrinkage": mean([r["shrinkage"] for r in gated])}


class RMTDenoiser:
    """The ``rmt`` entry of ``DENOISERS``: a post-processor of the privatised gradient that denoises
    each in-scope 2-D parameter's ĝ (:func:`rmt_denoise_matrices`, noise std σ/B per entry). It sees
    ĝ and the noise std, nothing per-sample: no privacy cost. ``scope`` names a ``DENOISE_SCOPES``
    entry (``all``, or ``lora``: the LoRA factors only)."""

    #: The key of its per-step statistics in the engine's step result.
    key = "denoise"

    def __init__(self, *, kappa: float = DEFAULT_KAPPA, norm_correction: bool = True, scope: str = "all") -> None:
        for name, value in (("denoise_kappa", kappa), ("denoise_norm_correction", norm_correction)):
            check_option(name, value)   # the trial options' rules (dptune/schema/trial.py)
        self.kappa, self.norm_correction, self.scope = float(kappa), bool(norm_correction), scope
        self.in_scope = DENOISE_SCOPES.get(scope)

    @classmethod
    def from_config(cls, cfg: "TrainConfig") -> "RMTDenoiser":
        return cls(kappa=cfg.denoise_kappa, norm_correction=cfg.denoise_norm_correction, scope=cfg.denoise_scope)

    def matrices(self, params: Mapping[str, torch.Tensor]) -> list[str]:
        """The names of the parameters it denoises (2-D, in scope); refuses a scope that selects none."""
        names = [n for n, p in params.items() if p.dim() == 2 and self.in_scope(n)]
        if not names:
            raise UserError(f"denoise_scope={self.scope!r} selects no 2-D trainable parameter of this model "
                             f"(allowed: {', '.join(DENOISE_SCOPES)}; 'lora' needs LoRA factors)")
        return names

    def __call__(self, private: dict[str, torch.Tensor], noise_std: float,
                 names: Sequence[str]) -> tuple[dict[str, torch.Tensor], dict]:
        """ĝ with the matrices ``names`` denoised, and the step's statistics."""
        denoised, stats = rmt_denoise_matrices({n: private[n].detach() for n in names}, noise_std, kappa=self.kappa,
                                               norm_correction=self.norm_correction)
        return {**private, **denoised}, stats

    epoch_metrics = staticmethod(epoch_denoise_metrics)


class CosineDiagnostic:
    """The ``denoise_cosine`` entry of ``DIAGNOSTICS`` (NOT private): per step and denoised 2-D layer,
    cos(ĝ, ḡ) and cos(rmt(ĝ), ḡ) with ḡ the step's clipped sum before noise (:func:`cosine_diagnostic`).
    When the engine denoises, rmt(ĝ) is the step it took; otherwise ``denoiser`` (the trial's rmt
    options) says what rmt would have made of ĝ, and the step itself is left as it is."""

    key = "denoise_cosine"

    def __init__(self, denoiser: RMTDenoiser | None = None) -> None:
        self.denoiser = denoiser or RMTDenoiser()

    @classmethod
    def from_config(cls, cfg: "TrainConfig") -> "CosineDiagnostic":
        return cls(RMTDenoiser.from_config(cfg))

    def matrices(self, params: Mapping[str, torch.Tensor]) -> list[str]:
        return self.denoiser.matrices(params)

    def observe(self, step: "DPStep") -> list[dict]:
        stats = step.post.get(RMTDenoiser.key)
        denoised = step.gradient
        if stats is None:   # a plain step: what rmt would have made of ĝ
            denoised, stats = self.denoiser(step.private, step.noise_std, self.matrices(step.private))
        return cosine_diagnostic(step.private, denoised, step.clean, stats["per_layer"])

    epoch_metrics = staticmethod(epoch_cosine_metrics)
