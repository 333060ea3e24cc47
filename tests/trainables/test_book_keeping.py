"""The book-keeping engine (the default exact engine) against per-example autograd loops in float64:
per-sample norms and the clipped sum on every registered backbone, with padding masks, micro-batches,
an empty batch and a layer called twice; property tests over shapes; the per-layer explanation."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dptune.trainables import DPEngine
from dptune.trainables.engine.book_keeping import BookKeepingEngine
from dptune.trainables.engine.clip_factors import flat_clip
from dptune.trainables.engine.rules.linear import prefer_ghost
from dptune.trainables.models.catalog import create_model
from dptune.trainables.engine.per_sample import VmapNormEngine

from per_example_reference import clipped_sum_loop

LOSS = nn.CrossEntropyLoss(reduction="none")
RTOL = 1e-6
SEQ = 10


def assert_matches_loop(model, x, y, clip, micro=None):
    engine = DPEngine(model, LOSS, clip_bound=clip, noise_multiplier=0.0, expected_batch_size=1.0,
                      max_physical_batch_size=micro)
    assert isinstance(engine.norms, BookKeepingEngine)  # the default exact engine
    sums, norms = engine.clipped_sum(x, y)
    ref_sums, ref_norms = clipped_sum_loop(model, x, y, clip)
    assert bool((ref_norms > clip).any()) and bool((ref_norms < clip).any()) or len(y) < 2  # both regimes
    torch.testing.assert_close(norms, ref_norms, rtol=RTOL, atol=0)
    assert sums.keys() == ref_sums.keys()
    for name, ref in ref_sums.items():
        torch.testing.assert_close(sums[name], ref, rtol=RTOL, atol=RTOL * float(ref.abs().max()) + 1e-15)
    return engine


def median_clip(model, x, y) -> float:
    """A clipping bound between the smallest and the largest per-sample norm."""
    return float(clipped_sum_loop(model, x, y, 1.0)[1].median())


# ---- registered backbones ------------------------------------------------------------------

SCRATCH = {"mlp": dict(hidden=16), "cnn": dict(width=4), "wrn16_4": dict(width=1, groups=4)}
VIT = "vit_tiny_patch16_224.augreg_in21k"
VIT_SMALL = dict(depth=2, embed_dim=24, num_heads=2, patch_size=8, weights="random")
TEXT_SMALL = {
    "bert-base-uncased": dict(num_hidden_layers=2, hidden_size=24, num_attention_heads=2, intermediate_size=48,
                              vocab_size=120, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "all-MiniLM-L6-v2": dict(num_hidden_layers=2, hidden_size=24, num_attention_heads=2, intermediate_size=48,
                             vocab_size=120, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "distilbert-base-uncased": dict(n_layers=2, dim=24, n_heads=2, hidden_dim=48, vocab_size=120,
                                    dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0),
}


def padded_text(n: int, seed: int) -> dict[str, torch.Tensor]:
    """Token ids with right padding of different lengths (example 0 unpadded)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 120, (n, SEQ), generator=g)
    mask = torch.ones(n, SEQ, dtype=torch.long)
    for i in range(1, n):
        mask[i, SEQ - 1 - i % (SEQ - 2):] = 0
    return {"input_ids": ids * mask, "attention_mask": mask}


@pytest.mark.parametrize("name", list(SCRATCH))
@pytest.mark.parametrize("micro", [None, 2])
def test_scratch_models_match_the_loop(name, micro):
    torch.manual_seed(0)
    model = create_model(name, num_classes=5, input_shape=(3, 12, 12), **SCRATCH[name]).double()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, 3, 12, 12, generator=g, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 4])
    assert_matches_loop(model, x, y, median_clip(model, x, y), micro)


@pytest.mark.parametrize("peft", ["film", "lora", "head", "full"])
def test_vit_matches_the_loop(peft):
    torch.manual_seed(0)
    model = create_model(VIT, num_classes=3, input_shape=(3, 32, 32), peft=peft, **VIT_SMALL).double()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 1])
    if peft == "lora":  # B = 0 at init would make every LoRA-A gradient zero: give B values
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
    engine = assert_matches_loop(model, x, y, median_clip(model, x, y))
    rules = {row["rule"] for row in engine.norms.explain()}
    assert ("broadcast" in rules) == (peft == "full")  # class token, position embedding: per-example expansion
    modules = dict(model.named_modules())
    norms = {row["rule"] for row in engine.norms.explain() if isinstance(modules.get(row["module"]), nn.LayerNorm)}
    assert norms == ({"normalisation"} if peft in ("film", "full") else set())   # timm's LayerNorm: the closed form


def roberta(tmp_path) -> str:
    from transformers import RobertaConfig

    RobertaConfig(vocab_size=120, hidden_size=24, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48,
                  max_position_embeddings=40, type_vocab_size=1, pad_token_id=1, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0).save_pretrained(tmp_path)
    return f"hf:{tmp_path}"


@pytest.mark.parametrize("name", [*TEXT_SMALL, "roberta"])
def test_text_models_with_lora_and_padding_masks_match_the_loop(name, tmp_path):
    torch.manual_seed(0)
    options = dict(TEXT_SMALL.get(name, {}))
    model_name = roberta(tmp_path) if name == "roberta" else name
    model = create_model(model_name, num_classes=3, input_shape=(SEQ,), peft="lora", weights="random",
                         **options).double()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    x, y = padded_text(5, seed=3), torch.tensor([0, 1, 2, 1, 0])
    if name == "roberta":
        x["input_ids"] = torch.where(x["attention_mask"] == 1, x["input_ids"], 1)  # RoBERTa's pad id
    assert_matches_loop(model, x, y, median_clip(model, x, y), micro=3)


# ---- edge cases ----------------------------------------------------------------------------

class CalledTwice(nn.Module):
    """One Linear applied twice (weight tying within a module), an Embedding, a LayerNorm, a GroupNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 6, padding_idx=0)
        self.fc = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)
        self.group = nn.GroupNorm(2, 4)
        self.rms = nn.RMSNorm(6)
        self.head = nn.Linear(6, 3)

    def forward(self, ids):
        h = self.fc(torch.tanh(self.fc(self.norm(self.emb(ids)))))  # [b, T, 6]
        g = self.group(h[:, :4].unsqueeze(-1)).squeeze(-1)  # [b, 4, 6]
        return self.head(self.rms(h.mean(1) + g.mean(1)))


def test_a_layer_called_twice_and_every_closed_form_match_the_loop():
    torch.manual_seed(0)
    model = CalledTwice().double()
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 20, (6, 5), generator=g)
    ids[1, 3:] = 0
    y = torch.randint(0, 3, (6,), generator=g)
    engine = assert_matches_loop(model, ids, y, median_clip(model, ids, y))
    forms = {row["module"]: row["form"] for row in engine.norms.explain()}
    assert forms["norm"] == forms["group"] == forms["rms"] == "closed form"


def test_an_empty_poisson_batch_gives_pure_noise_and_no_norms():
    model = create_model("mlp", num_classes=3, input_shape=(4,), hidden=8)
    engine = DPEngine(model, LOSS, clip_bound=1.0, noise_multiplier=0.0, expected_batch_size=4.0)
    stats = engine.private_gradient(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long))
    assert stats["norms"].numel() == 0
    assert all(bool((p.grad == 0).all()) for p in model.parameters())


def test_explain_lists_every_layer_with_its_form_and_memory():
    model = create_model("cnn", num_classes=10, input_shape=(1, 28, 28), width=4)
    engine = DPEngine(model, LOSS, clip_bound=1.0, noise_multiplier=1.0, expected_batch_size=8.0)
    engine.private_gradient(torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,)))
    rows = engine.norms.explain()
    owners = {n.rsplit(".", 1)[0] for n, p in model.named_parameters()}
    assert {r["module"] for r in rows} == owners
    assert all(r["form"] != "unused" and r["kept_bytes"] > 0 for r in rows)


# ---- properties over shapes ------------------------------------------------------------------

class SeqLinear(nn.Module):
    def __init__(self, d: int, p: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, p)
        self.head = nn.Linear(p, 2)

    def forward(self, x):  # [b, T, d]
        return self.head(torch.tanh(self.fc(x)).mean(1))


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 64), T=st.sampled_from([1, 2, 7, 33, 128, 512]), d=st.integers(1, 12), p=st.integers(1, 12))
def test_sequence_linear_matches_explicit_per_sample_gradients(b, T, d, p):
    """Whatever form the shapes pick (T = 1, ghost or materialised), norms and clipped sums equal the
    explicit per-sample gradients, here from torch.func's per-example grad of the whole model."""
    torch.manual_seed(b * 1000 + T)
    model = SeqLinear(d, p).double()
    x = torch.randn(b, T, d, dtype=torch.float64)
    y = torch.randint(0, 2, (b,))
    clip = 0.1
    ref = DPEngine(model, LOSS, clip_bound=clip, noise_multiplier=0.0, expected_batch_size=1.0,
                   norm_estimator=VmapNormEngine(model, LOSS))
    ours = DPEngine(model, LOSS, clip_bound=clip, noise_multiplier=0.0, expected_batch_size=1.0)
    ref_sums, ref_norms = ref.clipped_sum(x, y)
    sums, norms = ours.clipped_sum(x, y)
    torch.testing.assert_close(norms, ref_norms, rtol=RTOL, atol=1e-14)
    for name in ref_sums:
        torch.testing.assert_close(sums[name], ref_sums[name], rtol=RTOL, atol=1e-14)


@pytest.mark.parametrize("T,d,p,ghost", [
    (64, 2304, 256, True),     # wrn16_4's last convolutions, 8×8 positions: grams are cheap
    (1024, 576, 64, False),    # its first group, 32×32 positions: T² work would dwarf dp
    (128, 384, 384, False),    # a 128-token BERT projection
    (512, 8, 384, False),      # a LoRA factor at 512 tokens: dp is tiny
    (4, 4096, 4096, True),     # a short sequence through a wide layer
])
def test_the_cheaper_form_is_chosen_from_the_shapes(T, d, p, ghost):
    assert prefer_ghost(64, T, d, p, 4) is ghost
    assert prefer_ghost(10**6, T, d, p, 4) is True  # b·d·p too large to materialise: ghost whatever the work


def test_the_step_is_private_whatever_the_engine():
    """One example changes ĝ by at most C/(B·C) = 1/B, with equality for a clipped example."""
    torch.manual_seed(1)
    model = create_model("cnn", num_classes=3, input_shape=(1, 8, 8), width=4).double()
    x, y = torch.randn(6, 1, 8, 8, dtype=torch.float64), torch.randint(0, 3, (6,))
    B = 9.0
    engine = DPEngine(model, LOSS, clip_bound=0.01, noise_multiplier=0.0, expected_batch_size=B)

    def grad(xs, ys):
        engine.private_gradient(xs, ys)
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    change = (grad(x, y) - grad(x[1:], y[1:])).norm()
    assert float(change) == pytest.approx(1 / B, rel=1e-9)
    assert math.isfinite(float(change))


class InPlace(nn.Module):
    """Outputs modified in place after their module returns (ReLU(inplace=True), +=)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(5, 6), nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = self.fc1(x)
        h.relu_()
        z = self.fc2(h)
        z += h
        return self.head(torch.tanh(z))


@pytest.mark.parametrize("case", ["inplace", "cnn", "minilm"])
def test_two_backward_passes_when_g_would_not_fit_give_the_same_result(case, tmp_path):
    """max_kept_bytes = 0 forces the fallback: norms layer by layer, then a second backward."""
    torch.manual_seed(0)
    if case == "inplace":
        model, x, y = InPlace().double(), torch.randn(6, 5, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    elif case == "cnn":
        model = create_model("cnn", num_classes=3, input_shape=(1, 8, 8), width=4).double()
        x, y = torch.randn(5, 1, 8, 8, dtype=torch.float64), torch.tensor([0, 1, 2, 1, 0])
    else:
        model = create_model("all-MiniLM-L6-v2", num_classes=3, input_shape=(SEQ,), peft="lora", weights="random",
                             **TEXT_SMALL["all-MiniLM-L6-v2"]).double()
        x, y = padded_text(4, seed=5), torch.tensor([0, 1, 2, 1])
    clip = median_clip(model, x, y)
    ref_sums, ref_norms = clipped_sum_loop(model, x, y, clip)
    for budget, mode in ((None, "book-keeping"), (0, "two backward passes")):
        engine = BookKeepingEngine(model, LOSS, max_kept_bytes=budget)
        for _ in range(2):  # the first batch checks coverage, the second does not
            sums, norms = engine.clipped_sum(x, y, lambda n: flat_clip(n, clip))
            assert engine.mode == mode
            torch.testing.assert_close(norms, ref_norms, rtol=RTOL, atol=0)
            for name, ref in ref_sums.items():
                torch.testing.assert_close(sums[name], ref, rtol=RTOL, atol=RTOL * float(ref.abs().max()) + 1e-15)
    assert {row["mode"] for row in engine.explain()} == {"two backward passes"}


class Convolutions(nn.Module):
    """A wide convolution over few positions called twice (ghost form), a grouped one (materialised)."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Conv2d(8, 8, 3, padding=1)
        self.grouped = nn.Conv2d(8, 4, 3, padding=1, groups=2, bias=False)
        self.head = nn.Linear(4, 3)

    def forward(self, x):  # [b, 8, 2, 2]
        h = self.wide(torch.tanh(self.wide(x)))
        return self.head(self.grouped(torch.tanh(h)).mean(dim=(2, 3)))


def test_ghost_and_grouped_convolutions_match_the_loop():
    torch.manual_seed(0)
    model = Convolutions().double()
    x, y = torch.randn(5, 8, 2, 2, dtype=torch.float64), torch.tensor([0, 1, 2, 1, 0])
    engine = assert_matches_loop(model, x, y, median_clip(model, x, y))
    forms = {row["module"]: row["form"] for row in engine.norms.explain()}
    assert forms["wide"].startswith("ghost") and forms["grouped"].startswith("materialised")


def test_train_explain_engine_prints_every_layer_with_its_form():
    import io

    from dptune.cli import main

    out = io.StringIO()
    code = main(["train", "--dataset", "digits", "--model", "cnn", "--epochs", "1", "--batch-size", "256",
                 "--quiet", "--explain-engine"], out=out)
    assert code == 0
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("engine: book-keeping"))
    table = lines[start + 1:start + 5]
    assert [line.split()[0] for line in table] == ["0.0", "0.3", "1", "3"]  # the cnn's four layers
    assert all(line.rstrip().endswith("MiB") for line in table)
    assert "materialised (grouped conv)" in table[0] and "ghost (T = 1)" in table[2]


class SometimesOutside(nn.Module):
    """``fc.weight`` also used outside ``fc`` (a functional call), but only on inputs whose first
    feature is large: the first batch does not take the branch, so its coverage check passes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        h = self.fc(x)
        branch = (x[:, :1] > 2.0).to(x.dtype)          # [b, 1]: per example, no mixing
        h = h + branch * torch.tanh(x @ self.fc.weight.T)
        return self.head(torch.tanh(h))


@pytest.mark.parametrize("budget", [None, 0])
def test_no_example_counts_for_more_than_its_norm_whatever_branch_it_takes(budget):
    """Issue 22: the two-pass fallback (budget 0) took its clipped sum from autograd, which counts a
    use of a parameter the hooks do not see: an example taking the branch then moved ĝ by more than
    C. Now every form builds Σ c_i g_i from the rules that measured n_i: removing one example
    changes the sum by c_i·(what its norm measured) ≤ C."""
    torch.manual_seed(0)
    model = SometimesOutside().double()
    engine = BookKeepingEngine(model, LOSS, max_kept_bytes=budget)
    C = 0.01
    first = torch.randn(6, 4, dtype=torch.float64).clamp(max=1.0)        # no branch: coverage passes
    engine.clipped_sum(first, torch.tensor([0, 1, 0, 1, 0, 1]), lambda n: flat_clip(n, C))
    x = torch.randn(5, 4, dtype=torch.float64).clamp(max=1.0)
    x[2, 0] = 5.0                                                        # this one takes the branch
    y = torch.tensor([0, 1, 1, 0, 1])

    def flat(sums):
        return torch.cat([s.flatten() for s in sums.values()])

    full, norms = engine.clipped_sum(x, y, lambda n: flat_clip(n, C))
    without, _ = engine.clipped_sum(x[[0, 1, 3, 4]], y[[0, 1, 3, 4]], lambda n: flat_clip(n, C))
    contribution = float((flat(full) - flat(without)).norm())
    assert contribution <= C * (1 + 1e-9)
    assert norms[2] > C   # it was clipped: its contribution is exactly C by what its norm measured
    assert contribution == pytest.approx(C, rel=1e-9)


@pytest.mark.parametrize("kernel, dilation, padding, stride", [((3, 3), (1, 1), (1, 1), (1, 1)),
                                                              ((3, 2), (2, 1), (2, 0), (2, 3)),
                                                              ((1, 1), (1, 1), (0, 0), (2, 2))])
def test_unfolded_patches_are_torch_unfold(kernel, dilation, padding, stride):
    from dptune.trainables.engine.rules.base import unfold_patches

    conv = nn.Conv2d(3, 4, kernel, stride=stride, padding=padding, dilation=dilation)
    x = torch.randn(5, 3, 9, 11, dtype=torch.float64)
    assert torch.equal(unfold_patches(x, conv), torch.nn.functional.unfold(x, kernel, dilation, padding, stride))
