"""Norm estimators (ghost, Hutchinson, Hutch++) and the engine with each: against per-example loops and closed forms."""
import pytest
import torch
from torch import nn

from dptune.privacy import calibrate_noise, epsilon_spent
from dptune.trainables import DPEngine, ghost_sq_norms, hutchinson_sq_norms, hutchpp_sq_norms
from dptune.trainables.engine.clip_factors import flat_clip
from dptune.trainables.config import TrainConfig
from dptune.trainables.engine.dp_engine import NORM_ENGINES
from dptune.trainables.engine.book_keeping import BookKeepingEngine
from dptune.trainables.models.catalog import create_model
from dptune.trainables.training import Trainer

from per_example_reference import clipped_sum_loop

LOSS = nn.CrossEntropyLoss(reduction="none")


def explicit_sq_norms(A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """‖A_iᵀG_i‖² from the materialised per-sample gradients, one example at a time."""
    return torch.stack([(a.T @ g).pow(2).sum() for a, g in zip(A, G)])


class MixedModel(nn.Module):
    """Every family at once: embedding with padding, LayerNorm, a Linear used twice, Conv2d, RMSNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8, padding_idx=0)
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.rms = nn.RMSNorm(8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(self.norm(self.emb(ids))))  # [b, T, 8]
        h = self.fc(h)  # the same weight again
        image = self.conv(h[:, :4].unsqueeze(1)).mean(dim=(1, 2))  # [b, 8]
        return self.head(self.rms(h.mean(dim=1) + image))


def tiny_gpt2(lora: bool = False) -> nn.Module:
    from transformers import GPT2Config, GPT2ForSequenceClassification

    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=16, pad_token_id=0,
                        resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, num_labels=3)
    model = GPT2ForSequenceClassification(config).double().eval()
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True))
    return model


# ---- estimators --------------------------------------------------------------------------------

@pytest.mark.parametrize("T,d,p", [(5, 7, 3), (1, 6, 4), (16, 3, 2)])  # ghost form, T = 1, materialised
def test_ghost_equals_explicit_per_sample_gradients(T, d, p):
    g = torch.Generator().manual_seed(T)
    A = torch.randn(6, T, d, generator=g, dtype=torch.float64)
    G = torch.randn(6, T, p, generator=g, dtype=torch.float64)
    torch.testing.assert_close(ghost_sq_norms(A, G), explicit_sq_norms(A, G), rtol=1e-12, atol=0)


def _draws(estimator, A, G, k, n, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([estimator(A, G, k, gen) for _ in range(n)])  # [n, B]


def test_hutchinson_is_unbiased_with_variance_2_sum_sigma4_over_k():
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(3, 6, 10, generator=gen, dtype=torch.float64)
    G = torch.randn(3, 6, 8, generator=gen, dtype=torch.float64)
    exact = explicit_sq_norms(A, G)
    sigma4 = torch.stack([torch.linalg.svdvals(a.T @ g).pow(4).sum() for a, g in zip(A, G)])
    for k in (4, 16):
        draws = _draws(hutchinson_sq_norms, A, G, k, 4000, seed=k)
        assert torch.all((draws.mean(0) / exact - 1).abs() < 0.03)
        # ‖MP‖² = Σ_j σ_j²·χ²_k/k: variance 2Σσ⁴/k, so k·variance is the same for every k
        assert torch.all((draws.var(0) * k / (2 * sigma4) - 1).abs() < 0.12)


def test_hutchpp_is_unbiased_and_beats_hutchinson_on_low_rank():
    gen = torch.Generator().manual_seed(1)
    # M = AᵀG with rank ≤ T = 6 and a decaying spectrum; k = 4 sketches its head exactly-ish
    A = torch.randn(3, 6, 20, generator=gen, dtype=torch.float64) * torch.tensor([4.0, 2, 1, .3, .1, .05],
                                                                                  dtype=torch.float64)[:, None]
    G = torch.randn(3, 6, 12, generator=gen, dtype=torch.float64)
    exact = explicit_sq_norms(A, G)
    plus = _draws(hutchpp_sq_norms, A, G, 4, 3000, seed=2)
    plain = _draws(hutchinson_sq_norms, A, G, 4, 3000, seed=3)
    assert torch.all((plus.mean(0) / exact - 1).abs() < 0.01)
    assert torch.all(plus.var(0) < plain.var(0) / 20)
    full_rank_k = hutchpp_sq_norms(A, G, 6, torch.Generator().manual_seed(4))  # rank ≤ k: exact
    torch.testing.assert_close(full_rank_k, exact, rtol=1e-9, atol=0)


# ---- the hook engine ---------------------------------------------------------------------------

def _mixed_batch():
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 20, (6, 5), generator=gen)
    ids[0, 3:] = 0  # padding
    return ids, torch.randint(0, 3, (6,), generator=gen)


@pytest.mark.parametrize("case", ["mixed", "mlp", "cnn", "gpt2", "gpt2-lora"])
def test_hook_engine_with_exact_norms_equals_per_example_loop(case):
    torch.manual_seed(0)
    if case == "mixed":
        model, (x, y) = MixedModel().double(), _mixed_batch()
    elif case in ("mlp", "cnn"):
        model = create_model(case, num_classes=3, input_shape=(1, 8, 8)).double()
        x, y = torch.randn(5, 1, 8, 8, dtype=torch.float64), torch.tensor([0, 1, 2, 1, 0])
    else:
        model = tiny_gpt2(lora=case.endswith("lora"))
        ids = torch.randint(1, 50, (4, 7))
        mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 7, [1] * 3 + [0] * 4])
        x, y = {"input_ids": ids, "attention_mask": mask}, torch.tensor([0, 2, 1, 2])
    clip = 0.5
    sums, norms = BookKeepingEngine(model, LOSS).clipped_sum(x, y, lambda n: flat_clip(n, clip))
    ref_sums, ref_norms = clipped_sum_loop(model, x, y, clip)
    torch.testing.assert_close(norms, ref_norms, rtol=1e-10, atol=1e-12)
    for name in ref_sums:
        torch.testing.assert_close(sums[name], ref_sums[name], rtol=1e-10, atol=1e-12)


def test_hf_conv1d_gets_the_linear_rule():
    """GPT-2's Conv1D (a transformers class, recognised once transformers is loaded) takes the
    linear-like closed form, not the per-example fallback."""
    from transformers.pytorch_utils import Conv1D

    model = tiny_gpt2()
    engine = BookKeepingEngine(model, LOSS)
    ids = torch.randint(1, 50, (3, 5))
    engine.clipped_sum({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, torch.tensor([0, 1, 2]),
                       lambda n: flat_clip(n, 1.0))
    modules = dict(model.named_modules())
    rules = {row["rule"] for row in engine.explain() if isinstance(modules.get(row["module"]), Conv1D)}
    assert rules == {"linear"}


def test_micro_batches_give_the_same_clipped_sum():
    model = MixedModel().double()
    x, y = _mixed_batch()
    engine = BookKeepingEngine(model, LOSS)
    whole, _ = engine.clipped_sum(x, y, lambda n: flat_clip(n, 0.3))
    parts = [engine.clipped_sum(x[i:i + 2], y[i:i + 2], lambda n: flat_clip(n, 0.3))[0] for i in (0, 2, 4)]
    for name in whole:
        torch.testing.assert_close(sum(p[name] for p in parts), whole[name], rtol=1e-12, atol=1e-14)


def test_randomized_estimators_are_registered_and_need_k():
    assert {"hutchinson", "hutchpp"} <= set(NORM_ENGINES)
    model = create_model("mlp", num_classes=3, input_shape=(4,))
    with pytest.raises(ValueError, match="sketch_k"):
        DPEngine(model, LOSS, clip_bound=1.0, noise_multiplier=1.0, expected_batch_size=4, norm_estimator="hutchinson")


def test_each_norm_estimator_is_one_name_from_the_accountant_to_the_layer_rule():
    """A ``norm_estimator`` keeps its name from the accountant (``MECHANISMS``) through the engine
    registry to the estimator the layer rules apply: no second set of keys to keep in step."""
    from dptune.privacy.mechanisms import MECHANISMS
    from dptune.trainables.engine.norm_estimators import RANDOMISED_WEIGHT_NORMS

    assert list(NORM_ENGINES) == list(MECHANISMS)
    assert set(RANDOMISED_WEIGHT_NORMS) == set(MECHANISMS) - {"exact"}
    model = create_model("mlp", num_classes=3, input_shape=(4,))
    for name in MECHANISMS:
        assert NORM_ENGINES.get(name)(model, LOSS, sketch_k=2).ctx.estimator == name
    with pytest.raises(ValueError, match="estimator must be one of exact, hutchinson, hutchpp; got 'ghost'"):
        NORM_ENGINES.get("exact").func(model, LOSS, estimator="ghost")


class UsedOutside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) + nn.functional.linear(x, self.fc.weight)  # a use the hooks cannot see


def test_a_parameter_used_outside_its_module_goes_to_the_smallest_module_with_every_use():
    """``fc.weight`` is also used by its parent's functional call: found on the first batch, the
    parent (here the whole model) becomes one unit and the result equals the per-example loop."""
    model = UsedOutside().double()
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 0])
    engine = BookKeepingEngine(model, LOSS)  # statically fine: caught on the first batch
    sums, norms = engine.clipped_sum(x, y, lambda n: flat_clip(n, 0.5))
    ref_sums, ref_norms = clipped_sum_loop(model, x, y, 0.5)
    torch.testing.assert_close(norms, ref_norms, rtol=1e-9, atol=0)
    for name in ref_sums:
        torch.testing.assert_close(sums[name], ref_sums[name], rtol=1e-9, atol=1e-12)
    assert [(r["module"], r["rule"]) for r in engine.explain()] == [("<root>", "unit (vmap)")]


class NotPerExample(nn.Module):
    """A parameter whose use mixes the examples (the batch mean): no unit can attribute it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) + self.fc.weight.sum() * x.mean(0, keepdim=True)


def test_a_use_that_mixes_examples_is_refused_with_the_parameter_path():
    engine = BookKeepingEngine(NotPerExample().double(), LOSS)
    with pytest.raises(ValueError, match=r"fc\.weight.*whole model"):
        engine.clipped_sum(torch.randn(3, 4, dtype=torch.float64), torch.tensor([0, 1, 2]),
                           lambda n: flat_clip(n, 1.0))


def test_one_example_contributes_at_most_z_times_c_over_b_c():
    """σ = 0: removing example i changes ĝ by exactly c_i·g_i/(BC) (same probes: same seed), whose
    norm is at most Z_i·C/(BC) with Z_i = true / estimated norm, with equality when clipped."""
    torch.manual_seed(3)
    model = create_model("mlp", num_classes=4, input_shape=(6,), hidden=16).double()
    x, y = torch.randn(5, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 0])
    C, B = 0.05, 7.0
    _, true_norms = clipped_sum_loop(model, x, y, C)

    def private(keep):
        engine = DPEngine(model, LOSS, clip_bound=C, noise_multiplier=0.0, expected_batch_size=B,
                          norm_estimator="hutchinson", sketch_k=3, probes=torch.Generator().manual_seed(9))
        stats = engine.private_gradient(x[keep], y[keep])
        return torch.cat([p.grad.flatten() for p in model.parameters()]), stats["norms"]

    full, estimated = private(torch.arange(5))
    for i in range(5):
        without, _ = private(torch.tensor([j for j in range(5) if j != i]))
        contribution = (full - without).norm() * B * C  # = ‖c_i g_i‖
        z = float(true_norms[i] / estimated[i])
        assert contribution <= z * C * (1 + 1e-9)
        if estimated[i] > C:  # clipped: the bound is attained
            assert contribution == pytest.approx(z * C, rel=1e-9)
    assert not torch.allclose(estimated, true_norms, rtol=1e-3)  # the estimates really are random


def test_hutchinson_training_matches_exact_clipping_on_digits():
    """Same ε: Hutchinson (k = 32) gets the larger σ of its accountant and still trains to within a
    few points of exact clipping; each run stays within its ε."""
    accuracy = {}
    for estimator, k in (("exact", None), ("hutchinson", 32)):
        cfg = TrainConfig(dataset="digits", model="mlp", epsilon=3.0, clip_bound=1.0, batch_size=128,
                          learning_rate=2.0, epochs=8, norm_estimator=estimator, sketch_k=k, seed=0, device="cpu",
                          model_options={"hidden": 64})
        trainer = Trainer(cfg)
        assert isinstance(trainer.engine.norms, BookKeepingEngine)
        metrics = [trainer.run_epoch() for _ in range(trainer.num_epochs)][-1]
        assert metrics["epsilon_spent"] <= 3.0
        accuracy[estimator] = metrics["test_accuracy"]
        if estimator == "hutchinson":
            q, T = trainer.plan.sample_rate, trainer.plan.steps
            assert trainer.plan.noise_multiplier > calibrate_noise(3.0, 1e-5, q, T) * 1.03
            assert epsilon_spent(trainer.plan.noise_multiplier, 1e-5, q, T) < 3.0  # exact-accounted: slack
    assert accuracy["hutchinson"] >= 0.85
    assert accuracy["hutchinson"] >= accuracy["exact"] - 0.04
