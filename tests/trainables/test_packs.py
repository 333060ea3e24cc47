"""Packed trials: every member of a pack equals its configuration trained alone.

References are independent of the pack: the unpacked DPEngine on each member's own model (whose
own rules are checked against a per-example loop in test_book_keeping.py), and the unpacked
Trainer of each configuration.
"""
import copy
import io

import pytest
import torch
from torch import nn

from dptune.errors import UserError
from dptune.schema import TrainConfig
from dptune.trainables import DPEngine
from dptune.trainables.engine.denoise import COSINE_METRICS
from dptune.trainables.engine.pack_memory import optimizer_slots
from dptune.trainables.engine.packed_layers import PackedUnit
from dptune.trainables.engine.packing import pack_models, packed_units, packing_problems
from dptune.trainables.engine.randomness import SeededStream
from dptune.trainables.models.catalog import create_model
from dptune.trainables.pack_training import PackTrainer
from dptune.trainables.registries import PACKABLE_MODELS
from dptune.trainables.training import Trainer

from dptune.trainables.tasks import completion_nll
from test_book_keeping import LOSS, SEQ, TEXT_SMALL, padded_text
from test_causal_lm import lm_batch, small_lm
from per_example_reference import clipped_sum_loop

CPU = torch.device("cpu")


class NormMLP(nn.Module):
    """Linear layers with a LayerNorm and a GroupNorm between them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 8)
        self.norm = nn.LayerNorm(8)
        self.group = nn.GroupNorm(2, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norm(self.fc1(x)))
        return self.fc2(torch.tanh(self.group(h)))


class RMSMLP(nn.Module):
    """Linear layers with torch's RMSNorm between them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 8)
        self.norm = nn.RMSNorm(8, eps=1e-6)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.norm(self.fc1(x))))


class Bag(nn.Module):
    """An embedding (with a padding row) and one linear layer called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 6, padding_idx=0)
        self.fc = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(torch.tanh(self.fc(self.emb(ids)))).mean(dim=1))


class Recurrent(nn.Module):
    """A GRU over a sequence-first input, then a two-layer LSTM with projections, then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 5)
        self.lstm = nn.LSTM(5, 6, num_layers=2, proj_size=3, batch_first=True)
        self.head = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(x.transpose(0, 1))
        out, (h_n, c_n) = self.lstm(torch.tanh(h.transpose(0, 1)))
        return self.head(out.mean(dim=1) + h_n[-1])


class SharedModule(nn.Module):
    """One Linear registered under two names (``self.b = self.a``), applied twice."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = self.a
        self.head = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(torch.tanh(self.a(x))))


class TiedWeights(nn.Module):
    """An embedding and an output layer sharing one weight (a language model's tie)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.emb(ids))).mean(dim=1)


class GroupedConv(nn.Module):
    """A convolution, a depthwise one (groups = channels) and a grouped one (2 groups), then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.depthwise = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.grouped = nn.Conv2d(4, 6, 3, stride=2, groups=2, bias=False)
        self.head = nn.Linear(6 * 3 * 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.depthwise(torch.tanh(self.conv(x))))
        return self.head(torch.tanh(self.grouped(h)).flatten(1))


class ConvNeXtNet(nn.Module):
    """timm's ConvNeXt parts no packed form covers: ``LayerNorm2d`` (LayerNorm over channels, its own
    forward) and a ``ConvNeXtBlock`` whose layer scale ``gamma`` multiplies its output around its
    sub-modules; torch's ``Conv1d`` (no packed form either) in the head."""

    def __init__(self) -> None:
        super().__init__()
        from timm.layers import LayerNorm2d
        from timm.models.convnext import ConvNeXtBlock

        self.stem = nn.Conv2d(1, 8, 2, stride=2)
        self.norm = LayerNorm2d(8)
        self.block = ConvNeXtBlock(8, ls_init_value=0.5)
        self.mix = nn.Conv1d(8, 4, 3)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.block(self.norm(self.stem(x))).flatten(2)   # [b, 8, 16]
        return self.head(torch.tanh(self.mix(h)).mean(dim=2))


class Conv1DNet(nn.Module):
    """transformers' Conv1D (GPT-2's linear maps, weight stored [in, out]) over a sequence."""

    def __init__(self) -> None:
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        self.inner = Conv1D(8, 5)   # (out, in)
        self.outer = Conv1D(3, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(torch.tanh(self.inner(x))).mean(dim=1)


class TiedLinears(nn.Module):
    """Two linear layers sharing one weight: a tie the pack has no per-member rule for."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def case(name: str, seed: int):
    """(model, inputs, targets) in float64; LoRA's B factors given values (zero at init)."""
    torch.manual_seed(seed)
    y = torch.tensor([0, 1, 2, 1, 0, 2])
    if name == "cnn":
        return create_model("cnn", num_classes=3, input_shape=(1, 8, 8), width=4).double(), \
            torch.randn(6, 1, 8, 8, dtype=torch.float64), y
    if name in ("norm_mlp", "rms_mlp"):
        return (NormMLP if name == "norm_mlp" else RMSMLP)().double(), torch.randn(6, 12, dtype=torch.float64), y
    if name == "lstm":   # the registry's LSTM over image rows: two layers, both directions
        return create_model("lstm", num_classes=3, input_shape=(1, 6, 4), hidden=5, layers=2,
                            bidirectional=True).double(), torch.randn(6, 1, 6, 4, dtype=torch.float64), y
    if name == "gru_lstm":
        return Recurrent().double(), torch.randn(6, 7, 4, dtype=torch.float64), y
    if name == "timm_linear":   # timm's Linear subclass (a timm classifier head): nn.Linear's algebra
        from timm.layers import Linear as TimmLinear

        return nn.Sequential(TimmLinear(12, 8), nn.Tanh(), TimmLinear(8, 3)).double(), \
            torch.randn(6, 12, dtype=torch.float64), y
    if name == "grouped_conv":
        return GroupedConv().double(), torch.randn(6, 1, 8, 8, dtype=torch.float64), y
    if name == "conv1d":
        return Conv1DNet().double(), torch.randn(6, 4, 5, dtype=torch.float64), y
    if name == "convnext":   # units: every parameter given values (the block's second linear starts near 0)
        model = ConvNeXtNet().double()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        return model, torch.randn(6, 1, 8, 8, dtype=torch.float64), y
    if name == "shared":
        return SharedModule().double(), torch.randn(6, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0, 1, 0])
    if name == "tied":
        ids = torch.randint(0, 10, (6, 5))
        return TiedWeights().double(), ids, y
    if name == "llama_full":   # a causal LM fine-tuned in full: its token embeddings tied to its output layer
        return (small_lm("llama", "full"), *lm_batch(seed))
    if name == "bag":
        ids = torch.randint(0, 20, (6, 5))
        ids[1, 3:] = 0
        return Bag().double(), ids, y
    if name == "vit_full":   # timm's ViT fine-tuned in full: its class token and position embedding are broadcasts
        model = create_model("vit_tiny_patch16_224.augreg_in21k", num_classes=3, input_shape=(3, 16, 16),
                             weights="random", peft="full", depth=1, embed_dim=16, num_heads=2, patch_size=8)
        return model.double(), torch.randn(6, 3, 16, 16, dtype=torch.float64), y
    if name == "vit_tv":   # torchvision's ViT: nn.MultiheadAttention, its class token and position embedding
        model = create_model("vit", num_classes=3, input_shape=(3, 8, 8), patch_size=4, depth=2, embed_dim=8,
                             num_heads=2)
        return model.double(), torch.randn(6, 3, 8, 8, dtype=torch.float64), y
    if name == "qwen2_full":   # a causal LM fine-tuned in full: Qwen2's RMSNorm, q/k/v biases, untied embeddings
        return (small_lm("qwen2", "full"), *lm_batch(seed))
    if name == "llama_lora":   # a causal LM: token targets [b, T], a tied (frozen) embedding
        model = small_lm("llama", "lora")
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
        return (model, *lm_batch(seed))
    model = create_model("all-MiniLM-L6-v2", num_classes=3, input_shape=(SEQ,), peft="lora", weights="random",
                         **TEXT_SMALL["all-MiniLM-L6-v2"]).double()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    return model, padded_text(6, seed=seed), y


SETTINGS = [(0.05, 1.0), (0.3, 0.5), (5.0, 2.0)]   # (C, σ) per member: mostly clipped … never clipped


@pytest.mark.parametrize("estimator", ["exact", "hutchinson"])
@pytest.mark.parametrize("name", ["cnn", "norm_mlp", "rms_mlp", "bag", "minilm_lora", "llama_lora", "qwen2_full",
                                  "vit_full", "vit_tv", "lstm", "gru_lstm", "shared", "tied", "llama_full",
                                  "grouped_conv", "conv1d", "timm_linear", "convnext"])
def test_each_member_of_a_pack_gets_its_own_private_gradient(name, estimator):
    """Members with different weights, C and σ: per-sample norms and ĝ_k (same noise and probe
    streams) equal those of DPEngine on each member's own model, over two steps."""
    # a full fine-tune's norms are larger: its never-clipped member needs a larger C
    settings = SETTINGS if name not in ("qwen2_full", "llama_full", "vit_full", "vit_tv") else [(0.05, 1.0), (0.3, 0.5), (1e3, 2.0)]
    models = [case(name, seed=k)[0] for k in range(len(settings))]
    with torch.no_grad():   # the members of a pack share what is frozen (a pretrained backbone)
        for model in models[1:]:
            for p, q in zip(model.parameters(), models[0].parameters()):
                if not p.requires_grad:
                    p.copy_(q)
    x, y = case(name, seed=0)[1:]
    sketch = 4 if estimator == "hutchinson" else None
    loss = completion_nll if name in ("llama_lora", "qwen2_full", "llama_full") else LOSS
    packed = pack_models(models)
    engine = DPEngine(packed, loss, members=len(models), clip_bound=[c for c, _ in settings],
                      noise_multiplier=[s for _, s in settings], expected_batch_size=4.0,
                      norm_estimator=estimator, sketch_k=sketch, generator=SeededStream(7, "noise", CPU),
                      probes=SeededStream(7, "probes", CPU), max_physical_batch_size=len(models) * 4)
    if estimator == "exact":   # each member's clipped sum at its own C against its own model, one example at a time
        sums = engine.clipped_sum(x, y)[0]
        for k, (model, (c, _)) in enumerate(zip(models, settings)):
            for n, s in clipped_sum_loop(model, x, y, c, loss)[0].items():
                torch.testing.assert_close(sums[n][k], s, rtol=1e-9, atol=1e-12, msg=f"member {k}: {n}")
    alone = [DPEngine(m, loss, clip_bound=c, noise_multiplier=s, expected_batch_size=4.0, norm_estimator=estimator,
                      sketch_k=sketch, generator=SeededStream(7, "noise", CPU), probes=SeededStream(7, "probes", CPU))
             for m, (c, s) in zip(models, settings)]
    for _ in range(2):
        stats = engine.private_gradient(x, y)
        for k, (model, single) in enumerate(zip(models, alone)):
            reference = single.private_gradient(x, y)
            torch.testing.assert_close(stats["norms"][k], reference["norms"], rtol=1e-9, atol=1e-12)
            if estimator == "exact":   # and against each member's own model, one example at a time
                torch.testing.assert_close(stats["norms"][k], clipped_sum_loop(model, x, y, 1.0, loss)[1],
                                           rtol=1e-9, atol=1e-12)
            assert float(stats["clipped_fraction"][k]) == pytest.approx(reference["clipped_fraction"])
            for (n, p), (_, q) in zip(packed.named_parameters(), model.named_parameters()):
                if q.requires_grad:
                    torch.testing.assert_close(p.grad[k], q.grad, rtol=1e-9, atol=1e-12, msg=f"member {k}: {n}")
    assert float(stats["clipped_fraction"][2]) < float(stats["clipped_fraction"][0])   # the members clip apart


def digits(**options) -> TrainConfig:
    """An MLP: the trajectories are compared in float32, where a max-pool's argmax tie (tanh
    saturated at exactly 1) can route one gradient differently after a rounding-level difference;
    the packed convolution is checked above, in float64."""
    return TrainConfig(**{"dataset": "digits", "model": "mlp", "epochs": 2, "batch_size": 64, "seed": 3,
                          "device": "cpu", "model_options": {"hidden": 32}, **options})


MEMBERS = [dict(clip_bound=0.3, learning_rate=0.2, epsilon=1.0), dict(clip_bound=1.0, learning_rate=0.1, epsilon=8.0),
           dict(clip_bound=3.0, learning_rate=0.4, epsilon=4.0)]


def final_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in model.named_parameters()}


def pack_and_alone(cfgs: list[TrainConfig]) -> tuple[list, list]:
    """Train ``cfgs`` as one pack and each alone, check that every member ends with its lone run's
    weights, and return both histories (the pack's per member, the lone runs')."""
    pack = PackTrainer(cfgs)
    histories = pack.fit()
    lone = []
    for k, cfg in enumerate(cfgs):
        trainer = Trainer(cfg)
        lone.append(trainer.fit())
        for n, w in final_weights(trainer.model).items():
            torch.testing.assert_close(pack.member_weights(k)[n], w, rtol=1e-4, atol=1e-5, msg=f"member {k}: {n}")
    return histories, lone


@pytest.mark.parametrize("options", [dict(optimizer="sgd", momentum=0.9, weight_decay=1e-3),
                                     dict(optimizer="adam")],
                         ids=["sgd-momentum", "adam"])
def test_a_pack_trains_each_member_as_its_configuration_alone(options):
    """Two epochs of three configurations (C, η, ε differ) in one pack: each member's weights,
    test metrics, ε spent and clipped fraction equal those of its configuration's own Trainer."""
    if options["optimizer"] == "adam":
        members = [{**m, "learning_rate": m["learning_rate"] / 50} for m in MEMBERS]
    else:
        members = MEMBERS
    histories, lone = pack_and_alone([digits(**options, **m) for m in members])
    for k, alone in enumerate(lone):
        assert len(histories[k]) == len(alone) == 2
        for mine, theirs in zip(histories[k], alone):
            assert mine["test_accuracy"] == pytest.approx(theirs["test_accuracy"], abs=1 / 360)
            assert mine["test_loss"] == pytest.approx(theirs["test_loss"], rel=1e-4)
            assert mine["epsilon_spent"] == theirs["epsilon_spent"]
            assert mine["clipped_fraction"] == pytest.approx(theirs["clipped_fraction"], abs=2e-3)
            assert mine["pack_members"] == 3


def test_a_pack_denoises_and_observes_each_member_as_its_configuration_alone():
    """RMT denoising and the non-private cosine diagnostic in a pack of three configurations whose
    noise std σ_k/B differs: each member's weights (the denoised steps it took) and every epoch's
    denoising and cosine metrics equal its configuration's own Trainer's. Before: refused by name."""
    options = dict(denoise="rmt", diagnostics=["denoise_cosine"])
    histories, lone = pack_and_alone([digits(**options, **m) for m in MEMBERS])
    keys = ("denoise_gate_rate", "denoise_mean_shrinkage", "denoise_mean_rank", *COSINE_METRICS)
    for k, alone in enumerate(lone):
        for mine, theirs in zip(histories[k], alone):
            for key in keys:
                assert mine[key] == pytest.approx(theirs[key], rel=1e-3, abs=1e-6, nan_ok=True), (k, key)
    gates = [h[-1]["denoise_gate_rate"] for h in lone]
    assert max(gates) > 0 and len(set(gates)) > 1   # the gate opened, and not alike for every member's σ_k


def test_a_pack_under_private_selection_draws_each_members_noisy_score_as_alone():
    """Private selection's one noisy look at the validation split, in a pack (reproducible mode): each
    member's ``selection_score`` is its lone run's — its validation accuracy plus the score noise its
    seed draws — not the next draw of a stream the members share; nothing earlier reports a score."""
    options = dict(validation_fraction=0.2, score_noise=0.5, epochs=1)
    histories, lone = pack_and_alone([digits(**options, **m) for m in MEMBERS])
    for k, alone in enumerate(lone):
        assert histories[k][-1]["selection_score"] == pytest.approx(alone[-1]["selection_score"], abs=1e-9)
        assert "validation_accuracy" not in histories[k][-1]


@pytest.mark.parametrize("options,rates", [({}, (0.05, 0.2, 0.8)), (dict(optimizer="sgd", momentum=0.9), (0.02, 0.05, 0.1))],
                         ids=["sgd", "momentum"])   # (η = 0.8 with momentum 0.9 is chaotic: rounding grows)
def test_a_pack_of_non_private_baselines_trains_each_member_as_its_configuration_alone(options, rates):
    """ε = inf (no clipping, no noise, the mean gradient over the realised batch), three learning
    rates: each member's weights and every epoch's test metrics equal its configuration's own
    Trainer's, ε is infinite and no norm statistic is reported. Before: refused by name."""
    cfgs = [digits(clip_bound=1.0, learning_rate=lr, epsilon=float("inf"), **options) for lr in rates]
    histories, lone = pack_and_alone(cfgs)
    for k, alone in enumerate(lone):
        assert len(histories[k]) == len(alone) == 2
        for mine, theirs in zip(histories[k], alone):
            assert mine["test_loss"] == pytest.approx(theirs["test_loss"], rel=1e-4)
            assert mine["test_accuracy"] == pytest.approx(theirs["test_accuracy"], abs=1 / 360)
            assert mine["epsilon_spent"] == theirs["epsilon_spent"] == float("inf")
            assert "clipped_fraction" not in mine
    assert len({h[-1]["test_loss"] for h in histories}) == 3   # three trajectories, not one


def test_a_pack_of_non_private_baselines_over_its_memory_budget_still_equals_its_lone_runs():
    """Passes of at most 15 rows (several per step): each member's mean gradient is still over its
    whole realised batch, and it ends where its configuration alone does."""
    cfgs = [digits(clip_bound=1.0, learning_rate=lr, epsilon=float("inf"), epochs=1) for lr in (0.05, 0.2, 0.8)]
    memory = PackTrainer(cfgs).memory
    pack = PackTrainer(cfgs, memory_budget=memory.bytes(3, 5) + memory.row_bytes // 2)
    rows = []
    pack.model.register_forward_hook(lambda module, args, out: rows.append(len(args[0])))
    pack.fit()
    assert rows and max(rows) <= 15 and len(rows) > pack.step
    for k, cfg in enumerate(cfgs):
        alone = Trainer(cfg)
        alone.fit()
        for n, w in final_weights(alone.model).items():
            torch.testing.assert_close(pack.member_weights(k)[n], w, rtol=1e-4, atol=1e-5, msg=f"member {k}: {n}")


def test_a_pack_of_vision_transformers_trains_each_member_as_its_configuration_alone():
    """torchvision's ViT (nn.MultiheadAttention, a class token and a position embedding, LayerNorm) for
    one epoch: each member's weights and ε equal its configuration's own Trainer's."""
    histories, lone = pack_and_alone([TrainConfig(**{**digits(**m).to_dict(), "epochs": 1, "model": "vit",
                                                     "model_options": {"patch_size": 4, "depth": 1, "embed_dim": 16,
                                                                       "num_heads": 2}}) for m in MEMBERS])
    for k, alone in enumerate(lone):
        assert histories[k][-1]["epsilon_spent"] == alone[-1]["epsilon_spent"]


@pytest.mark.parametrize("model,options", [("mlp", {"hidden": 32}), ("cnn", {}), ("lstm", {"hidden": 8})])
def test_a_pack_of_one_trains_as_its_configuration_alone(model, options):
    """K = 1 (the backbones of the example specs, reproducible mode): the packed model on the one engine
    ends where the single trial does — weights, every epoch's test metrics, clipped fraction and ε."""
    cfg = TrainConfig(**{**digits(**MEMBERS[1]).to_dict(), "model": model, "model_options": options})
    histories, lone = pack_and_alone([cfg])
    assert len(histories[0]) == len(lone[0]) == 2
    for mine, theirs in zip(histories[0], lone[0]):
        assert mine["test_accuracy"] == pytest.approx(theirs["test_accuracy"], abs=1 / 360)
        assert mine["test_loss"] == pytest.approx(theirs["test_loss"], rel=1e-4)
        assert mine["clipped_fraction"] == pytest.approx(theirs["clipped_fraction"], abs=2e-3)
        assert mine["epsilon_spent"] == theirs["epsilon_spent"]


def test_a_pack_of_lstms_trains_each_member_as_its_configuration_alone():
    """The registry's LSTM over image rows (two layers, both directions) for one epoch: each member's
    weights, ε and test accuracy equal its configuration's own Trainer's."""
    histories, lone = pack_and_alone([TrainConfig(**{**digits(**m).to_dict(), "epochs": 1, "model": "lstm",
                                                     "model_options": {"hidden": 8, "layers": 2,
                                                                       "bidirectional": True}}) for m in MEMBERS])
    for k, alone in enumerate(lone):
        assert histories[k][-1]["epsilon_spent"] == alone[-1]["epsilon_spent"]
        assert histories[k][-1]["test_accuracy"] == pytest.approx(alone[-1]["test_accuracy"], abs=1 / 360)


def test_a_pack_over_its_memory_budget_splits_its_passes_and_still_equals_its_lone_runs():
    """A budget that holds the members' state and 5 examples each per pass: every packed forward
    sees at most 15 rows (B = 64: several passes per step), and each member still ends where its
    configuration alone does."""
    cfgs = [digits(**m, epochs=1) for m in MEMBERS]
    memory = PackTrainer(cfgs).memory
    budget = memory.bytes(3, 5) + memory.row_bytes // 2
    pack = PackTrainer(cfgs, memory_budget=budget)
    assert pack.rows_per_pass == 15
    rows = []
    pack.model.register_forward_hook(lambda module, args, out: rows.append(len(args[0])))
    pack.fit()
    assert rows and max(rows) <= 15 and len(rows) > pack.step   # several passes per step
    assert memory.bytes(3, max(rows) // 3) <= budget
    for k, cfg in enumerate(cfgs):
        alone = Trainer(cfg)
        alone.fit()
        for n, w in final_weights(alone.model).items():
            torch.testing.assert_close(pack.member_weights(k)[n], w, rtol=1e-4, atol=1e-5, msg=f"member {k}: {n}")


def test_a_pack_whose_members_do_not_fit_is_refused_before_training_with_what_fits():
    cfgs = [digits(**m) for m in MEMBERS]
    memory = PackTrainer(cfgs).memory
    with pytest.raises(UserError, match=r"a pack of 3 members of mlp needs .* set search.pack: 2 \(at most 2"):
        PackTrainer(cfgs, memory_budget=memory.bytes(2, 1))
    with pytest.raises(UserError, match="set search.pack: off"):
        PackTrainer(cfgs, memory_budget=memory.bytes(1, 1))


def test_the_optimizers_state_is_counted_from_a_real_step():
    """SGD keeps nothing per parameter, with momentum one buffer, Adam two moments (torch's own)."""
    assert [optimizer_slots(*a) for a in (("sgd", 0.0, 0.0), ("sgd", 0.9, 0.0), ("adam", 0.0, 0.0), ("adamw", 0.0, 0.01))] \
        == [0, 1, 2, 2]


def test_a_diverging_member_is_recorded_and_retired_while_the_others_finish():
    cfgs = [digits(**MEMBERS[0]), digits(clip_bound=1.0, learning_rate=1e38, epsilon=8.0), digits(**MEMBERS[2])]
    pack = PackTrainer(cfgs)
    histories = pack.fit()
    assert pack.errors[0] is None and pack.errors[2] is None
    assert "became" in pack.errors[1]
    assert len(histories[1]) == 1 and len(histories[0]) == len(histories[2]) == 2
    alone = Trainer(cfgs[2])
    alone.fit()
    for n, w in final_weights(alone.model).items():
        torch.testing.assert_close(pack.member_weights(2)[n], w, rtol=1e-4, atol=1e-5)


def test_a_stopped_member_leaves_its_pack_and_the_others_still_train_as_alone():
    """Member 1 of three stopped at its first report, as a scheduler stops it: every later packed pass
    holds the two others' rows only (2·b_t, b_t the batch each draws alone), each of them ends with its
    lone run's weights (momentum: the optimizer's state shrank with them), and the pack's checkpoint still
    holds all three members — member 1 as its configuration alone after that one epoch."""
    cfgs = [digits(**m, optimizer="sgd", momentum=0.9) for m in MEMBERS]

    def training_rows(model: nn.Module, steps: list) -> list:
        rows = []
        model.register_forward_hook(lambda module, args, out: rows.append((steps[0](), len(args[0])))
                                    if torch.is_grad_enabled() else None)
        return rows

    pack = PackTrainer(cfgs)
    packed_rows = training_rows(pack.model, [lambda: pack.step])

    def report(epoch: list) -> None:
        if epoch[1] is not None:
            pack.retire(1)

    pack.fit(report)
    assert [len(h) for h in pack.histories] == [2, 1, 2]
    lone = Trainer(cfgs[0])
    lone_rows = training_rows(lone.model, [lambda: lone.step])
    lone.fit()
    first = lone.plan.steps // 2   # the steps of epoch 1
    assert [rows for step, rows in packed_rows] == [(3 if step < first else 2) * rows for step, rows in lone_rows]
    assert all(p.shape[0] == 2 for p in pack.model.parameters())
    assert pack.member_steps == 3 * first + 2 * (lone.plan.steps - first)   # what the sweep's pack policy weighs
    for k in (0, 2):
        alone = lone if k == 0 else Trainer(cfgs[k])
        if k:
            alone.fit()
        for n, w in final_weights(alone.model).items():
            torch.testing.assert_close(pack.member_weights(k)[n], w, rtol=1e-4, atol=1e-5, msg=f"member {k}: {n}")
    state = pack.checkpoint()["pack"]
    assert state["active"] == [True, False, True]
    stopped = Trainer(cfgs[1])
    stopped.epoch_results()
    for n, w in final_weights(stopped.model).items():
        assert state["model"][n].shape[0] == 3
        torch.testing.assert_close(state["model"][n][1], w, rtol=1e-4, atol=1e-5, msg=n)
        torch.testing.assert_close(state["model"][n][0], pack.member_weights(0)[n], rtol=0, atol=0)


def test_members_share_noise_when_reproducible_and_draw_their_own_when_secure():
    """Two identical configurations: one trajectory in reproducible mode (the seed's noise, as
    each would draw alone); two in secure mode (each member its own secret noise)."""
    for randomness, same in (("reproducible", True), ("secure", False)):
        cfg = digits(randomness=randomness, **MEMBERS[1])
        pack = PackTrainer([cfg, cfg])
        pack.train_step()
        differs = [bool((p[0] != p[1]).any()) for p in pack.model.parameters()]
        assert not any(differs) if same else all(differs)


def test_what_cannot_be_packed_is_refused_by_name():
    with pytest.raises(UserError, match="batch_size"):
        PackTrainer([digits(**MEMBERS[0]), TrainConfig(**{**digits(**MEMBERS[1]).to_dict(), 'batch_size': 32})])
    with pytest.raises(UserError, match="all private or all non-private"):
        PackTrainer([digits(**MEMBERS[0]), digits(clip_bound=1.0, learning_rate=0.1, epsilon=float("inf"))])


@pytest.mark.parametrize("model,names", [(SharedModule, ("a", "b")), (TiedWeights, ("emb", "out"))])
def test_a_shared_module_or_a_tied_weight_stays_one_parameter_per_member_in_its_pack(model, names):
    """Issue 47: ``self.b = self.a`` packed a.weight but left b.weight one tensor for all members
    (K = 3 ran: one example's contribution to it reached Σ_k C_k); a tied weight got two independent
    stacks. Now the module is packed once under both names and the tie is one packed parameter: the
    names reach one [K, …] parameter (the test above checks each member's gradient)."""
    for members in (2, 3):
        packed = pack_models([model() for _ in range(members)])
        first, second = (packed.get_parameter(f"{n}.weight") for n in names)
        assert first is second and first.shape[0] == members


def test_a_timm_backbone_with_a_timm_linear_head_packs_under_film():
    """MobileNetV3's classifier is timm's Linear (refused as having no packed form before)."""
    model = create_model("timm:mobilenetv3_small_050", num_classes=4, input_shape=(3, 32, 32), weights="random",
                         peft="film")
    assert packing_problems(model) == [] and packed_units(model) == []


@pytest.mark.parametrize("peft", ["film", "full"])
def test_a_timm_convnext_packs_and_each_member_computes_and_clips_as_its_own_model(peft):
    """timm's ConvNeXt (``LayerNorm2d`` in its stem, downsampling and head; layer scale ``gamma`` in its
    blocks under ``full``) was refused as having no packed form: now each such module is packed whole
    (``PackedUnit``). Each member's rows of the packed forward and its clipped sum equal its own model's,
    one example at a time."""
    models = []
    for k in range(2):
        torch.manual_seed(k)
        models.append(create_model("timm:convnext_atto", num_classes=3, input_shape=(3, 32, 32), weights="random",
                                   peft=peft, depths=[1, 1, 1, 1], dims=[8, 8, 16, 16]).double())
    with torch.no_grad():   # the members share what is frozen
        for p, q in zip(models[1].parameters(), models[0].parameters()):
            if not p.requires_grad:
                p.copy_(q)
    assert packing_problems(models[0]) == []
    packed = pack_models(models)
    units = ["stem.1", "head.norm"] + (["stages.0.blocks.0"] if peft == "full" else ["stages.0.blocks.0.norm"])
    assert all(isinstance(packed.get_submodule(u), PackedUnit) for u in units)
    x, y = torch.randn(3, 3, 32, 32, dtype=torch.float64), torch.tensor([0, 2, 1])
    rows = packed(x.repeat(2, 1, 1, 1))
    engine = DPEngine(packed, LOSS, members=2, clip_bound=[0.05, 1e3], noise_multiplier=[1.0, 1.0],
                      expected_batch_size=3.0, generator=SeededStream(7, "noise", CPU),
                      probes=SeededStream(7, "probes", CPU), max_physical_batch_size=6)
    sums = engine.clipped_sum(x, y)[0]
    for k, (model, c) in enumerate(zip(models, [0.05, 1e3])):
        torch.testing.assert_close(rows[3 * k:3 * (k + 1)], model(x), rtol=1e-9, atol=1e-12)
        for n, s in clipped_sum_loop(model, x, y, c, LOSS)[0].items():
            torch.testing.assert_close(sums[n][k], s, rtol=1e-9, atol=1e-12, msg=f"member {k}: {n}")


def test_a_pack_with_units_shrunk_to_two_members_computes_and_clips_as_their_own_models():
    """A member leaving a pack (``keep_members``) leaves its units too: the rest's rows and clipped sums
    are still their own models'."""
    from dptune.trainables.engine.packing import keep_members

    models = [case("convnext", seed=k)[0] for k in range(3)]
    x, y = case("convnext", seed=0)[1:]
    packed = pack_models(models)
    keep_members(packed, [0, 2])
    assert packed.block.gamma.shape[0] == 2 and packed.norm.members == 2
    rows = packed(x.repeat(2, 1, 1, 1))
    engine = DPEngine(packed, LOSS, members=2, clip_bound=[0.05, 5.0], noise_multiplier=[1.0, 1.0],
                      expected_batch_size=4.0, generator=SeededStream(7, "noise", CPU),
                      probes=SeededStream(7, "probes", CPU), max_physical_batch_size=12)
    sums = engine.clipped_sum(x, y)[0]
    for k, (model, c) in enumerate(zip([models[0], models[2]], [0.05, 5.0])):
        torch.testing.assert_close(rows[6 * k:6 * (k + 1)], model(x), rtol=1e-9, atol=1e-12)
        for n, s in clipped_sum_loop(model, x, y, c, LOSS)[0].items():
            torch.testing.assert_close(sums[n][k], s, rtol=1e-9, atol=1e-12, msg=f"member {k}: {n}")


def test_a_tie_the_pack_has_no_rule_for_is_refused_by_name():
    assert any("a.weight = b.weight (a weight tied across layers" in p for p in packing_problems(TiedLinears()))
    with pytest.raises(UserError, match=r"cannot be packed: .*a.weight = b.weight"):
        pack_models([TiedLinears() for _ in range(3)])


def test_a_planted_shared_parameter_fails_the_pack_invariant():
    """The invariant itself, on a pack that was built right and then broken: a layer swapped back for
    the unpacked one (its weight shared by the members), or a source weight missing from the pack."""
    from dptune.trainables.engine.packing import check_members

    source = NormMLP()
    packed = pack_models([source, copy.deepcopy(source), copy.deepcopy(source)])
    check_members(source, packed, 3)
    planted = copy.deepcopy(packed)
    planted.fc2 = copy.deepcopy(source.fc2)
    with pytest.raises(UserError, match=r"fc2.weight \(3, 8\) is not one packed parameter of shape \(3, 3, 8\)"):
        check_members(source, planted, 3)
    extra = copy.deepcopy(packed)
    extra.register_parameter("stray", nn.Parameter(torch.zeros(3)))
    with pytest.raises(UserError, match="belong to no single member: stray"):
        check_members(source, extra, 3)


def test_a_pack_killed_after_an_epoch_and_resumed_ends_where_an_uninterrupted_one_does():
    """Killed once its first epoch is reported (one member already retired) and resumed in a new
    trainer from the state saved then: every member's weights and history equal the uninterrupted
    pack's, and each epoch of each member is in its history once."""
    cfgs = [digits(**m, optimizer="sgd", momentum=0.5) for m in MEMBERS]
    whole = PackTrainer(cfgs)
    whole.retire(1, "stopped by the scheduler")
    whole.fit()

    class Killed(Exception):
        pass

    saved = io.BytesIO()
    first = PackTrainer(cfgs)
    first.retire(1, "stopped by the scheduler")

    def report(epoch: list) -> None:   # the epoch's report: its checkpoint, then the kill
        assert epoch[1] is None and [m["epoch"] for m in (epoch[0], epoch[2])] == [1, 1]
        torch.save(first.checkpoint(), saved)
        raise Killed

    with pytest.raises(Killed):
        first.fit(report)
    saved.seek(0)
    resumed = PackTrainer(cfgs)
    resumed.fit(state=torch.load(saved, weights_only=False))
    assert resumed.errors == whole.errors == [None, "stopped by the scheduler", None]
    for k in range(len(cfgs)):
        for n, w in whole.member_weights(k).items():
            assert torch.equal(resumed.member_weights(k)[n], w), (k, n)
    assert [[m["epoch"] for m in h] for h in resumed.histories] == [[1, 2], [], [1, 2]]
    assert [[m["test_accuracy"] for m in h] for h in resumed.histories] == \
        [[m["test_accuracy"] for m in h] for h in whole.histories]


#: Inputs each packable backbone is built for (the shape its registry entry is given by the trainer).
PACKABLE_INPUTS = {"mlp": (1, 8, 8), "cnn": (1, 8, 8), "wrn16_4": (3, 32, 32), "vit": (3, 8, 8), "all-MiniLM-L6-v2": (16,),
                   "smollm2-135m": (16,)}


@pytest.mark.parametrize("name", PACKABLE_MODELS)
def test_every_backbone_declared_packable_has_a_packed_form_of_every_trainable_layer(name):
    """The sweep packs the backbones of ``PACKABLE_MODELS`` by default (search_spaces/levers.py):
    each, built with its default peft, has nothing a pack cannot batch (pretrained weights random
    where the real ones are not here: the modules are the same)."""
    from dptune.trainables.registries import MODELS, PAPER_VITS

    options = {"weights": "random"} if name in PAPER_VITS else {}
    shape = (3, 224, 224) if name in PAPER_VITS else PACKABLE_INPUTS[name]
    model = MODELS.get(name)(num_classes=4, input_shape=shape, **options)
    assert packing_problems(model) == [] and packed_units(model) == []   # no layer replayed whole under vmap
    assert any(p.requires_grad for p in model.parameters())
