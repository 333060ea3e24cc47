"""Issue 18: the non-private ``denoise_cosine`` diagnostic and the RMT ablation options
(norm correction, κ, LoRA-factors-only scope), in DPEngine, TrainConfig, Trainer and the CLI."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from per_example_reference import clipped_sum_loop

from dptune.cli import build_parser
from dptune.platform.store.records import epoch_rows
from dptune.trainables import DPEngine, rmt_denoise
from dptune.trainables.config import TrainConfig
from dptune.trainables.engine.denoise import COSINE_METRICS, RMTDenoiser, epoch_cosine_metrics, rmt_denoise_matrices
from dptune.trainables.training import Trainer

C, B = 1.0, 64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 5))


def batch(seed: int = 0, size: int = B) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    y = torch.randint(0, 5, (size,), generator=g)
    return torch.randn(size, 1, 12, generator=g) + y[:, None, None].float(), y


def make_engine(model: nn.Module, **kw: object) -> DPEngine:
    return DPEngine(model, nn.CrossEntropyLoss(reduction="none"), clip_bound=C, noise_multiplier=kw.pop("sigma", 0.05),
                    expected_batch_size=B, generator=gen(7), **kw)


def np_cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().numpy().ravel(), b.detach().double().numpy().ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("denoise", [None, "rmt"])
def test_cosine_diagnostic_equals_a_direct_computation(denoise: str | None) -> None:
    """cos(ĝ, ḡ) and cos(rmt(ĝ), ḡ) against ḡ from a per-example loop and ĝ read back from .grad."""
    x, y = batch()
    model = small_model()
    sigma = 0.05
    stats = make_engine(model, sigma=sigma, denoise=denoise, diagnostics=["denoise_cosine"]).private_gradient(x, y)
    # ĝ: a plain engine with the same noise seed gives the same noisy gradient
    plain_model = small_model()
    make_engine(plain_model, sigma=sigma).private_gradient(x, y)
    noisy = {n: p.grad for n, p in plain_model.named_parameters()}
    sums, _ = clipped_sum_loop(small_model(), x, y, C)
    clean = {n: s / (B * C) for n, s in sums.items()}
    rows = {r["layer"]: r for r in stats["denoise_cosine"]}
    assert set(rows) == {"1.weight", "3.weight"}  # the 2-D parameters, not the biases
    s = sigma / B
    for name, row in rows.items():
        g = noisy[name]
        denoised = rmt_denoise(g, s)
        assert row["cos_noisy"] == pytest.approx(np_cos(g, clean[name]), rel=1e-4)
        assert row["cos_denoised"] == pytest.approx(np_cos(denoised, clean[name]), rel=1e-4)
        assert row["gain"] == pytest.approx(row["cos_denoised"] - row["cos_noisy"])
        sv = np.linalg.svd(g.double().numpy(), compute_uv=False)
        m, n = g.shape
        assert row["passed"] == bool(sv[0] > 1.02 * s * (math.sqrt(m) + math.sqrt(n)))
        if row["passed"]:
            assert 1 <= row["rank"] <= int((sv > s * (math.sqrt(m) + math.sqrt(n))).sum())
            assert 0 < row["shrinkage"] < 1
        else:
            assert row["gain"] == 0 and row["rank"] == 0
    assert any(r["passed"] for r in rows.values())  # σ small enough: the test covers an open gate
    if denoise == "rmt":  # what was applied is what was measured
        for name in rows:
            assert np_cos(model.get_parameter(name).grad, clean[name]) == pytest.approx(rows[name]["cos_denoised"],
                                                                                       rel=1e-4)


def test_diagnostic_does_not_change_training() -> None:
    """The counterfactual denoising of a plain run never reaches .grad, nor the noise stream."""
    cfg = dict(dataset="digits", model="mlp", epsilon=8.0, noise_multiplier=0.5, batch_size=256, epochs=1.0,
               learning_rate=1.0, device="cpu", model_options={"hidden": 32, "depth": 1})
    plain = Trainer(TrainConfig(**cfg))
    watched = Trainer(TrainConfig(**cfg, diagnostics=["denoise_cosine"]))
    m_plain, m_watched = plain.run_epoch(), watched.run_epoch()
    for (n, p), (_, q) in zip(plain.model.named_parameters(), watched.model.named_parameters()):
        assert torch.equal(p, q), n
    assert m_plain["test_accuracy"] == m_watched["test_accuracy"]
    assert set(COSINE_METRICS) <= set(m_watched) and not set(COSINE_METRICS) & set(m_plain)
    assert 0 <= m_watched["nonprivate_cos_gate_rate"] <= 1
    assert -1 <= m_watched["nonprivate_cos_noisy"] <= 1
    # the store's epoch rows carry the metrics (any numeric key of an epoch's metrics)
    assert set(COSINE_METRICS) <= set(epoch_rows([m_watched])[0])


def test_a_non_private_run_ignores_the_diagnostic() -> None:
    """A sweep whose ε axis includes inf may set the diagnostic for every cell: no noise, nothing to measure."""
    cfg = TrainConfig(dataset="digits", model="mlp", epsilon=math.inf, batch_size=256, epochs=0.5, learning_rate=0.1,
                      device="cpu", model_options={"hidden": 32, "depth": 1}, diagnostics=["denoise_cosine"]).validate()
    metrics = Trainer(cfg).run_epoch()
    assert not set(COSINE_METRICS) & set(metrics)


def test_epoch_cosine_metrics_against_hand_computation() -> None:
    def row(noisy: float, denoised: float, passed: bool, rank: int = 0, shrink: float = 1.0) -> dict:
        return {"layer": "w", "cos_noisy": noisy, "cos_denoised": denoised, "gain": denoised - noisy,
                "passed": passed, "rank": rank, "shrinkage": shrink}

    steps = [[row(0.2, 0.3, True, 2, 0.5), row(0.1, 0.1, False)],
             [row(0.4, 0.35, True, 1, 0.3), row(math.nan, math.nan, False)],  # empty batch: left out
             [row(0.3, 0.5, True, 3, 0.1)]]
    m = epoch_cosine_metrics(steps)
    assert m["nonprivate_cos_noisy"] == pytest.approx((0.2 + 0.1 + 0.4 + 0.3) / 4)
    assert m["nonprivate_cos_denoised"] == pytest.approx((0.3 + 0.1 + 0.35 + 0.5) / 4)
    assert m["nonprivate_cos_gate_rate"] == pytest.approx(3 / 4)
    assert m["nonprivate_cos_improved"] == pytest.approx(2 / 3)
    assert m["nonprivate_cos_gain"] == pytest.approx((0.1 - 0.05 + 0.2) / 3)
    assert m["nonprivate_cos_rank"] == pytest.approx(2.0)
    assert m["nonprivate_cos_shrinkage"] == pytest.approx(0.3)
    closed = epoch_cosine_metrics([[row(0.2, 0.2, False)]])
    assert closed["nonprivate_cos_gate_rate"] == 0 and math.isnan(closed["nonprivate_cos_gain"])


# --- ablations ----------------------------------------------------------------------------------------

def test_without_norm_correction_the_shrunk_matrix_is_returned() -> None:
    g = gen(3)
    u, _ = torch.linalg.qr(torch.randn(40, 2, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(30, 2, generator=g, dtype=torch.float64))
    s = 0.05
    noisy = (u * torch.tensor([4.0, 2.5], dtype=torch.float64)) @ v.T + s * torch.randn(40, 30, generator=g,
                                                                                          dtype=torch.float64)
    corrected = rmt_denoise(noisy, s)
    raw = rmt_denoise(noisy, s, norm_correction=False)
    # same direction, but the raw one keeps the shrunk norm ‖X̂‖ = Σ η_i² (η from numpy)
    assert np_cos(raw, corrected) == pytest.approx(1.0, abs=1e-12)
    assert float(corrected.norm()) == pytest.approx(float(noisy.norm()))
    sv = np.linalg.svd(noisy.numpy(), compute_uv=False)
    m, n = noisy.shape
    eta = []
    for lt in sv[sv > s * (math.sqrt(m) + math.sqrt(n))]:
        b = lt ** 2 - s ** 2 * (m + n)
        lh = math.sqrt((b + math.sqrt(b * b - 4 * s ** 4 * m * n)) / 2)
        eta.append(lh * math.sqrt((lh ** 4 - m * n * s ** 4) / (lh ** 4 + m * lh ** 2 * s ** 2))
                   * math.sqrt((lh ** 4 - m * n * s ** 4) / (lh ** 4 + n * lh ** 2 * s ** 2)))
    assert float(raw.norm()) == pytest.approx(math.sqrt(sum(e * e for e in eta)), rel=1e-9)
    _, stats = rmt_denoise_matrices({"w": noisy}, s, norm_correction=False)
    assert stats["mean_shrinkage"] == pytest.approx(float(raw.norm() / noisy.norm()), rel=1e-9)


class LoraToy(nn.Module):
    """A linear layer with LoRA-named factors (peft's naming) and a head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lora_A = nn.Linear(12, 4, bias=False)
        self.lora_B = nn.Linear(4, 16, bias=False)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.lora_B(self.lora_A(x.flatten(1)))))


def test_lora_scope_denoises_only_lora_factors() -> None:
    x, y = batch()
    plain, scoped, every = LoraToy(), LoraToy(), LoraToy()
    make_engine(plain, sigma=0.02).private_gradient(x, y)
    r_scoped = make_engine(scoped, sigma=0.02, denoise=RMTDenoiser(scope="lora")).private_gradient(x, y)
    r_every = make_engine(every, sigma=0.02, denoise="rmt").private_gradient(x, y)
    assert (r_scoped["denoise"]["layers"], r_every["denoise"]["layers"]) == (2, 3)
    assert torch.equal(scoped.head.weight.grad, plain.head.weight.grad)  # out of scope: left as ĝ
    s = 0.02 / B
    for name in ("lora_A.weight", "lora_B.weight"):
        expected = rmt_denoise(plain.get_parameter(name).grad, s)
        torch.testing.assert_close(scoped.get_parameter(name).grad, expected)


def test_bad_ablation_values_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^denoise_scope='lora' selects no 2-D trainable parameter"):
        make_engine(small_model(), denoise=RMTDenoiser(scope="lora"))
    with pytest.raises(ValueError, match="denoise_scope"):
        make_engine(small_model(), denoise=RMTDenoiser(scope="attention"))
    with pytest.raises(ValueError, match="diagnostics"):
        make_engine(small_model(), diagnostics=["cosine"])
    for bad, field in [({"denoise_kappa": 0.9}, "denoise_kappa"), ({"denoise_kappa": math.inf}, "denoise_kappa"),
                       ({"denoise_norm_correction": "no"}, "denoise_norm_correction"),
                       ({"denoise_scope": "loRA"}, "denoise_scope"), ({"diagnostics": ["cos"]}, "diagnostics"),
                       ({"diagnostics": "denoise_cosine"}, "diagnostics")]:
        with pytest.raises(ValueError, match=f"^{field} must be") as info:
            TrainConfig(**bad).validate()
        assert "\n" not in str(info.value)


def test_cli_train_takes_the_ablation_and_diagnostic_flags() -> None:
    args = build_parser().parse_args(["train", "--denoise", "rmt", "--denoise-norm-correction", "false",
                                      "--denoise-scope", "lora", "--diagnostics", "denoise_cosine"])
    assert (args.denoise_norm_correction, args.denoise_scope, args.diagnostics) == (False, "lora", ["denoise_cosine"])
    args = build_parser().parse_args(["train"])
    assert (args.denoise_norm_correction, args.denoise_scope, args.diagnostics) == (True, "all", [])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--denoise-norm-correction", "maybe"])
