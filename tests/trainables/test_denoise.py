"""RMT spectral denoising (dptune.trainables.engine.denoise) and its use by DPEngine and Trainer."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from dptune.cli import build_parser
from dptune.trainables import DPEngine, rmt_denoise
from dptune.trainables.config import TrainConfig
from dptune.trainables.engine.denoise import (RMTDenoiser, bbp_inflation, bbp_threshold, bulk_edge, epoch_denoise_metrics,
                                       invert_inflation, optimal_shrinkage, rmt_denoise_batch, rmt_denoise_matrices,
                                       shrink_singular_values)
from dptune.trainables.training import Trainer


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def low_rank(m: int, n: int, svs: list[float], g: torch.Generator) -> torch.Tensor:
    """A random m×n matrix with the given singular values."""
    u, _ = torch.linalg.qr(torch.randn(m, len(svs), generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, len(svs), generator=g, dtype=torch.float64))
    return (u * torch.tensor(svs, dtype=torch.float64)) @ v.T


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() * b.double()).sum() / (a.double().norm() * b.double().norm()))


def reference_denoise(y: np.ndarray, s: float, kappa: float = 1.02) -> np.ndarray:
    """docs/architecture.md "RMT denoising" step by step, one singular value at a time, in numpy float64."""
    m, n = y.shape
    u, sv, vt = np.linalg.svd(y, full_matrices=False)
    edge = s * (math.sqrt(m) + math.sqrt(n))
    if sv[0] <= kappa * edge:
        return y
    x_hat = np.zeros_like(y)
    for i, lt in enumerate(sv):
        if lt <= edge:
            continue
        b = lt ** 2 - s ** 2 * (m + n)
        lh = math.sqrt((b + math.sqrt(b * b - 4 * s ** 4 * m * n)) / 2)
        if lh ** 4 <= m * n * s ** 4:
            continue
        eta = (lh * math.sqrt((lh ** 4 - m * n * s ** 4) / (lh ** 4 + m * lh ** 2 * s ** 2))
               * math.sqrt((lh ** 4 - m * n * s ** 4) / (lh ** 4 + n * lh ** 2 * s ** 2)))
        x_hat += eta * np.outer(u[:, i], vt[i])
    return x_hat * np.linalg.norm(y) / np.linalg.norm(x_hat)


# --- the estimator on synthetic signal + noise ------------------------------------------------------

@pytest.mark.parametrize("m,n,rank,snr", [
    (8, 384, 2, 3.0),      # LoRA A factor
    (384, 16, 4, 2.0),     # LoRA B factor (tall)
    (64, 256, 4, 1.5),
    (256, 256, 8, 2.0),
    (100, 50, 1, 4.0),
    (128, 512, 3, 1.6),
])
def test_denoising_raises_cosine_to_signal_and_keeps_norm(m: int, n: int, rank: int, snr: float) -> None:
    """Rank-r signal (top singular value snr × BBP threshold, decaying) plus i.i.d. noise."""
    s = 0.01
    for seed in range(3):
        g = gen(seed)
        x = low_rank(m, n, [snr * bbp_threshold(s, m, n) * 0.8 ** i for i in range(rank)], g).float()
        y = x + s * torch.randn(m, n, generator=g)
        d = rmt_denoise(y, s)
        assert not torch.equal(d, y)  # the gate opened
        assert cosine(d, x) > cosine(y, x) + 0.05, (seed, cosine(y, x), cosine(d, x))
        torch.testing.assert_close(d.norm(), y.norm(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("m,n", [(8, 384), (64, 64), (200, 30)])
def test_matches_step_by_step_reference(m: int, n: int) -> None:
    s = 0.5
    g = gen(7)
    y = low_rank(m, n, [3 * bbp_threshold(s, m, n), 1.5 * bbp_threshold(s, m, n)], g) \
        + s * torch.randn(m, n, generator=g, dtype=torch.float64)
    expected = reference_denoise(y.numpy(), s)
    assert not np.array_equal(expected, y.numpy())
    torch.testing.assert_close(rmt_denoise(y, s), torch.from_numpy(expected), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(rmt_denoise(y.float(), s), torch.from_numpy(expected).float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("m,n", [(256, 1024), (512, 512), (384, 1536)])
def test_pure_noise_passes_through_unchanged(m: int, n: int) -> None:
    for seed in range(3):
        s = 10.0 ** -(1 + seed)
        y = s * torch.randn(m, n, generator=gen(seed))
        assert torch.equal(rmt_denoise(y, s), y)


def test_gate_on_small_pure_noise_is_rare() -> None:
    """For a LoRA-sized 8×384 factor the noise edge fluctuates; κ = 1.02 still rejects almost all."""
    s = 0.1
    y = s * torch.randn(400, 8, 384, generator=gen(3))
    out = rmt_denoise_batch(y, s)
    assert float(out.passed.float().mean()) < 0.1
    assert torch.equal(out.denoised[~out.passed], y[~out.passed])


def test_gate_sits_at_kappa_times_bulk_edge() -> None:
    m, n, s, kappa = 40, 90, 0.2, 1.05
    g = gen(4)
    u, _ = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, m, generator=g, dtype=torch.float64))
    tail = torch.linspace(0.5, 0.1, m - 1, dtype=torch.float64) * bulk_edge(s, m, n)
    for factor, opens in [(0.999, False), (1.001, True)]:
        sv = torch.cat([torch.tensor([factor * kappa * bulk_edge(s, m, n)], dtype=torch.float64), tail])
        y = (u * sv) @ v.T
        assert torch.equal(rmt_denoise(y, s, kappa=kappa), y) != opens


def test_zero_noise_is_the_identity_and_zero_gradient_is_kept() -> None:
    y = low_rank(30, 20, [3.0, 1.0], gen(5))
    torch.testing.assert_close(rmt_denoise(y, 0.0), y)
    zero = torch.zeros(30, 20)
    assert torch.equal(rmt_denoise(zero, 0.0), zero)
    assert torch.equal(rmt_denoise(zero, 0.3), zero)


# --- the closed forms ---------------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,s", [(8, 384, 0.01), (64, 256, 1.0), (300, 300, 3.0)])
def test_inverse_of_bbp_inflation(m: int, n: int, s: float) -> None:
    edge, threshold = bulk_edge(s, m, n), bbp_threshold(s, m, n)
    noisy = edge * torch.cat([1 + torch.logspace(-6, 1, 50, dtype=torch.float64)])  # above the edge
    torch.testing.assert_close(bbp_inflation(invert_inflation(noisy, s, m, n), s, m, n), noisy, rtol=1e-9, atol=0)
    signal = threshold * (1 + torch.logspace(-3, 2, 50, dtype=torch.float64))  # above the BBP threshold
    torch.testing.assert_close(invert_inflation(bbp_inflation(signal, s, m, n), s, m, n), signal, rtol=1e-6, atol=0)
    assert torch.all(bbp_inflation(signal, s, m, n) > signal)  # noise inflates
    # F maps the BBP threshold onto the bulk edge; nothing at or below the edge is inverted.
    torch.testing.assert_close(bbp_inflation(torch.tensor([threshold], dtype=torch.float64), s, m, n),
                               torch.tensor([edge], dtype=torch.float64))
    below = edge * torch.linspace(0, 1, 20, dtype=torch.float64)
    assert torch.all(invert_inflation(below, s, m, n) == 0)


@pytest.mark.parametrize("m,n,s", [(8, 384, 0.01), (64, 256, 1.0)])
def test_shrinkage_is_zero_below_bbp_threshold_and_shrinks_above(m: int, n: int, s: float) -> None:
    threshold = bbp_threshold(s, m, n)
    below = threshold * torch.linspace(0, 1 - 1e-9, 30, dtype=torch.float64)
    assert torch.all(optimal_shrinkage(below, s, m, n) == 0)
    at = optimal_shrinkage(torch.tensor([threshold], dtype=torch.float64), s, m, n)
    assert float(at) < 1e-9 * threshold  # continuous at the threshold (0 up to rounding)
    above = threshold * (1 + torch.logspace(-4, 3, 30, dtype=torch.float64))
    eta = optimal_shrinkage(above, s, m, n)
    assert torch.all(eta > 0) and torch.all(eta < above)
    assert torch.all(eta.diff() > 0)  # monotone in the signal
    assert float(eta[-1] / above[-1]) > 0.999  # a strong signal is barely shrunk
    noisy = bulk_edge(s, m, n) * torch.linspace(0, 1, 30, dtype=torch.float64)
    assert torch.all(shrink_singular_values(noisy, s, m, n) == 0)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="2-D"):
        rmt_denoise(torch.zeros(5), 1.0)
    with pytest.raises(ValueError, match="noise_std"):
        rmt_denoise(torch.zeros(3, 4), -1.0)
    with pytest.raises(ValueError, match="kappa"):
        rmt_denoise(torch.zeros(3, 4), 1.0, kappa=0.9)
    with pytest.raises(ValueError, match="2-D"):
        rmt_denoise_matrices({"b": torch.zeros(4)}, 1.0)


# --- batching -----------------------------------------------------------------------------------------

def test_batched_equals_per_matrix() -> None:
    s = 0.05
    g = gen(11)
    shapes = {"a0": (8, 96), "a1": (8, 96), "b0": (96, 8), "b1": (96, 8), "sq": (32, 32), "w": (20, 60),
              "noise": (64, 64)}
    grads = {}
    for name, (m, n) in shapes.items():
        signal = [] if name == "noise" else [4 * bbp_threshold(s, m, n), 2 * bbp_threshold(s, m, n)]
        grads[name] = (low_rank(m, n, signal, g) if signal else torch.zeros(m, n, dtype=torch.float64)).float() \
            + s * torch.randn(m, n, generator=g)
    out, stats = rmt_denoise_matrices(grads, s)
    assert list(out) == list(grads)
    changed = 0
    for name, y in grads.items():
        one = rmt_denoise(y, s)
        assert out[name].shape == y.shape
        torch.testing.assert_close(out[name], one, rtol=1e-4, atol=1e-5 * float(y.norm()))
        changed += not torch.equal(one, y)
    assert stats["layers"] == len(grads) and stats["passed_gate"] == changed == len(grads) - 1
    assert 0 < stats["mean_shrinkage"] < 1 and 1 <= stats["mean_rank"] <= 2
    _, none = rmt_denoise_matrices({"noise": grads["noise"]}, s)
    assert none["passed_gate"] == 0 and math.isnan(none["mean_shrinkage"])


def test_epoch_metrics_weight_steps_by_gated_layers() -> None:
    steps = [{"layers": 4, "passed_gate": 3, "mean_shrinkage": 0.2, "mean_rank": 1.0},
             {"layers": 4, "passed_gate": 0, "mean_shrinkage": math.nan, "mean_rank": math.nan},
             {"layers": 4, "passed_gate": 1, "mean_shrinkage": 0.6, "mean_rank": 3.0}]
    metrics = epoch_denoise_metrics(steps)
    assert metrics["denoise_gate_rate"] == pytest.approx(4 / 12)
    assert metrics["denoise_mean_shrinkage"] == pytest.approx((3 * 0.2 + 0.6) / 4)
    assert metrics["denoise_mean_rank"] == pytest.approx((3 * 1.0 + 3.0) / 4)
    assert math.isnan(epoch_denoise_metrics(steps[1:2])["denoise_mean_shrinkage"])


# --- the engine ---------------------------------------------------------------------------------------

def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv1d(1, 4, 3), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 10, 32), nn.Tanh(),
                         nn.Linear(32, 5))


def batch(seed: int, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    y = torch.randint(0, 5, (size,), generator=g)
    x = torch.randn(size, 1, 12, generator=g) + y[:, None, None].float()  # learnable: strong gradient
    return x, y


def engine(model: nn.Module, denoise: str | None, *, sigma: float = 0.3, seed: int = 0, **kw: object) -> DPEngine:
    return DPEngine(model, nn.CrossEntropyLoss(reduction="none"), clip_bound=1.0, noise_multiplier=sigma,
                    expected_batch_size=64, denoise=denoise, generator=gen(100 + seed), **kw)


def grads_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_engine_calls_denoiser_with_only_the_private_gradient_and_noise_std() -> None:
    calls = []

    class Recording(RMTDenoiser):
        """The rmt denoiser's scope, recording what the engine hands it and returning ĝ as it is."""

        def __call__(self, private, noise_std, names):
            calls.append(({n: private[n] for n in names}, noise_std))
            return dict(private), {"layers": len(names), "passed_gate": 0, "mean_shrinkage": math.nan,
                                   "mean_rank": math.nan}

    x, y = batch(0)
    plain_model, rec_model = small_model(), small_model()
    engine(plain_model, None).private_gradient(x, y)
    result = engine(rec_model, Recording(kappa=1.1)).private_gradient(x, y)
    assert len(calls) == 1 and result["denoise"]["layers"] == 2
    matrices, noise_std = calls[0]
    assert noise_std == pytest.approx(0.3 / 64)  # s = σ/B
    assert set(matrices) == {"3.weight", "5.weight"}  # the 2-D parameters only
    plain = grads_of(plain_model)
    for name, m in matrices.items():
        assert isinstance(m, torch.Tensor) and not m.requires_grad and m.grad_fn is None
        assert torch.equal(m, plain[name])  # exactly ĝ: noised and normalised, not the clean sum

    # The real denoiser's output is a function of (ĝ, s) alone: applying it to what the recorder
    # received reproduces the engine's gradients.
    rmt_model = small_model()
    stats = engine(rmt_model, RMTDenoiser(kappa=1.1)).private_gradient(x, y)
    expected, expected_stats = rmt_denoise_matrices(matrices, noise_std, kappa=1.1)
    denoised = grads_of(rmt_model)
    for name in matrices:
        assert torch.equal(denoised[name], expected[name])
    assert stats["denoise"] == expected_stats


def test_engine_denoises_matrices_and_leaves_other_parameters_untouched() -> None:
    x, y = batch(1)
    plain_model, rmt_model = small_model(), small_model()
    engine(plain_model, None, sigma=0.2).private_gradient(x, y)
    result = engine(rmt_model, "rmt", sigma=0.2).private_gradient(x, y)
    plain, rmt = grads_of(plain_model), grads_of(rmt_model)
    assert result["denoise"]["layers"] == 2 and result["denoise"]["passed_gate"] >= 1
    for name, p in rmt_model.named_parameters():
        if p.dim() == 2:
            torch.testing.assert_close(rmt[name].norm(), plain[name].norm(), rtol=1e-5, atol=0)
        else:  # biases (1-D) and the conv kernel (3-D) pass through
            assert torch.equal(rmt[name], plain[name]), name
    assert any(not torch.equal(rmt[n], plain[n]) for n in ("3.weight", "5.weight"))


def test_the_denoiser_rejects_kappa_below_one() -> None:
    with pytest.raises(ValueError, match="denoise_kappa"):
        RMTDenoiser(kappa=0.5)


# --- config, trainer, CLI -----------------------------------------------------------------------------

def test_config_validates_denoise_options() -> None:
    with pytest.raises(ValueError, match="denoise_kappa"):
        TrainConfig(denoise="rmt", denoise_kappa=0.99).validate()
    with pytest.raises(ValueError, match="denoise"):
        TrainConfig(denoise="wiener").validate()
    assert TrainConfig(denoise="rmt", denoise_kappa=1.05).validate().denoise_kappa == 1.05


def test_trainer_reports_denoise_metrics_per_epoch() -> None:
    cfg = TrainConfig(dataset="digits", model="mlp", epsilon=1.0, noise_multiplier=1.0, batch_size=256,
                      epochs=0.5, learning_rate=1.0, denoise="rmt", denoise_kappa=1.05, device="cpu",
                      model_options={"hidden": 32, "depth": 1})
    trainer = Trainer(cfg)
    assert trainer.engine.denoiser.kappa == 1.05
    metrics = trainer.run_epoch()
    assert 0 <= metrics["denoise_gate_rate"] <= 1
    if metrics["denoise_gate_rate"] > 0:
        assert 0 < metrics["denoise_mean_shrinkage"] <= 1
    plain = Trainer(TrainConfig(**{**cfg.to_dict(), "denoise": None})).run_epoch()
    assert not any(k.startswith("denoise") for k in plain)


def test_cli_train_accepts_denoise_options() -> None:
    args = build_parser().parse_args(["train", "--denoise", "rmt", "--denoise-kappa", "1.05"])
    assert (args.denoise, args.denoise_kappa) == ("rmt", 1.05)
    args = build_parser().parse_args(["train"])
    assert (args.denoise, args.denoise_kappa) == (None, 1.02)
