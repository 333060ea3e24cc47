"""Issue 26: every layer family Opacus computes per-sample gradients for (its grad-sample tests:
linear, convolutions 1-3-D and transposed, embedding and embedding bag, the normalisations, PReLU,
multi-head attention, RNN/LSTM/GRU, a sequence bias), a user's block that uses its parameter in an
expression, and tied weights — each against a per-example autograd loop in float64, whole and in
micro-batches, in the book-keeping and the two-backward-pass modes, plus an empty Poisson batch."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from dptune.errors import UserError
from dptune.trainables import DPEngine
from dptune.trainables.engine.book_keeping import BookKeepingEngine

from per_example_reference import clipped_sum_loop

LOSS = nn.CrossEntropyLoss(reduction="none")
RTOL = 1e-7
CLASSES = 3


def check(model, x, y, *, micro=None, kept=None, loss_fn=LOSS):
    """The engine's norms and clipped sum (C between the smallest and largest norm) equal the loop's."""
    clip = float(clipped_sum_loop(model, x, y, 1.0, loss_fn)[1].median())
    engine = DPEngine(model, loss_fn, clip_bound=clip, noise_multiplier=0.0, expected_batch_size=1.0,
                      max_physical_batch_size=micro)
    assert isinstance(engine.norms, BookKeepingEngine)
    engine.norms.max_kept_bytes = kept
    sums, norms = engine.clipped_sum(x, y)
    ref_sums, ref_norms = clipped_sum_loop(model, x, y, clip, loss_fn)
    assert bool((ref_norms > clip).any()) and bool((ref_norms < clip).any())
    torch.testing.assert_close(norms, ref_norms, rtol=RTOL, atol=0)
    assert sums.keys() == ref_sums.keys()
    for name, ref in ref_sums.items():
        torch.testing.assert_close(sums[name], ref, rtol=RTOL, atol=RTOL * float(ref.abs().max()) + 1e-15)
    return engine


class Head(nn.Module):
    """``body`` then a mean over every non-batch dim but the last, and a linear head."""

    def __init__(self, body: nn.Module, width: int, pool=None) -> None:
        super().__init__()
        self.body, self.head, self.pool = body, nn.Linear(width, CLASSES), pool

    def forward(self, x):
        h = self.pool(self.body(x)) if self.pool else self.body(x)
        return self.head(torch.tanh(h.reshape(h.shape[0], -1, h.shape[-1]).mean(1)))


def channels_last(h):
    """[b, C, *spatial] -> [b, 1, C], the mean over positions. (A transpose here would hand the layer a
    non-contiguous output gradient, for which PyTorch 2.14's own InstanceNorm backward is wrong.)"""
    return h.flatten(2).mean(2).unsqueeze(1)


def images(*shape):
    return lambda g: torch.randn(6, *shape, generator=g, dtype=torch.float64)


def padded(T, d):
    """Sequences [6, T, d] whose example i has T - i % 3 steps, zeros after them."""
    def draw(g):
        x = torch.randn(6, T, d, generator=g, dtype=torch.float64)
        for i in range(6):
            x[i, T - i % 3:] = 0
        return x
    return draw


def lengths_of(x):
    return (x.abs().sum(-1) > 0).sum(1)  # [b]: the steps before the zeros


def tokens(vocab, T):
    return lambda g: torch.randint(0, vocab, (6, T), generator=g)


class SequenceBias(nn.Module):
    """Opacus's SequenceBias: a learnt bias appended to every sequence (batch-first here)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return torch.cat([x, self.bias.expand(x.shape[0], 1, -1)], dim=1)


class Scaled(nn.Module):
    """A block that uses its own parameter in an expression around a sub-module."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return self.lin(x * self.w) + self.w


class Attention(nn.Module):
    """Self-attention with a padding mask, batch first or sequence first."""

    def __init__(self, batch_first: bool, need_weights: bool) -> None:
        super().__init__()
        self.batch_first, self.need_weights = batch_first, need_weights
        self.attn = nn.MultiheadAttention(8, 2, batch_first=batch_first, kdim=8, vdim=8)

    def forward(self, x):  # [b, T, 8]
        mask = torch.arange(x.shape[1])[None, :] >= lengths_of(x)[:, None]  # padded positions
        h = x if self.batch_first else x.transpose(0, 1)
        out, weights = self.attn(h, h, h, key_padding_mask=mask, need_weights=self.need_weights)
        out = out if self.batch_first else out.transpose(0, 1)
        return out + (weights.sum(-1, keepdim=True) if weights is not None else 0)


class Recurrent(nn.Module):
    """An RNN/LSTM/GRU, its outputs and final state both read; ``packed``: variable lengths."""

    def __init__(self, cls, batch_first: bool, packed: bool, **kw) -> None:
        super().__init__()
        self.rnn = cls(5, 6, batch_first=batch_first, **kw)
        self.batch_first, self.packed = batch_first, packed

    def forward(self, x):  # [b, T, 5]
        h = x if self.batch_first else x.transpose(0, 1)
        if self.packed:
            lengths = lengths_of(x)
            out, state = self.rnn(pack_padded_sequence(h, lengths, batch_first=self.batch_first, enforce_sorted=False))
            out = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]
        else:
            out, state = self.rnn(h)
            out = out if self.batch_first else out.transpose(0, 1)
        final = state[0] if isinstance(state, tuple) else state  # [layers·dirs, b, H]
        return torch.cat([out.mean(1), final.sum(0)], dim=-1)


def rnn_width(kw):
    return (kw.get("proj_size") or 6) * (3 if kw.get("bidirectional") else 2)


RNN_CASES = [
    (nn.LSTM, True, False, dict(num_layers=2, bidirectional=True)),
    (nn.LSTM, False, True, dict(num_layers=2)),
    (nn.LSTM, True, True, dict(bidirectional=True, proj_size=3)),
    (nn.GRU, False, False, dict(num_layers=2, bidirectional=True)),
    (nn.GRU, True, True, dict(bidirectional=True, bias=False)),
    (nn.RNN, True, False, dict(num_layers=2, nonlinearity="relu")),
    (nn.RNN, False, True, dict(bidirectional=True)),
]

FAMILIES = {
    "linear 2-D": (lambda: Head(nn.Linear(5, 4), 4), images(5)),
    "linear 3-D": (lambda: Head(nn.Linear(5, 4), 4), images(7, 5)),
    "conv1d": (lambda: Head(nn.Conv1d(3, 4, 3, padding=1, stride=2), 4, channels_last), images(3, 9)),
    "conv2d grouped dilated": (lambda: Head(nn.Conv2d(4, 6, 3, groups=2, dilation=2), 6, channels_last), images(4, 7, 7)),
    "conv3d": (lambda: Head(nn.Conv3d(2, 3, 2), 3, channels_last), images(2, 4, 4, 3)),
    "conv transpose 2d": (lambda: Head(nn.ConvTranspose2d(3, 4, 3, stride=2), 4, channels_last), images(3, 4, 4)),
    "embedding": (lambda: Head(nn.Embedding(11, 4, padding_idx=0), 4), tokens(11, 5)),
    "embedding bag": (lambda: Head(nn.EmbeddingBag(11, 4, mode="mean"), 4), tokens(11, 5)),
    "layer norm": (lambda: Head(nn.LayerNorm(5), 5), images(7, 5)),
    "group norm": (lambda: Head(nn.GroupNorm(2, 4), 4, channels_last), images(4, 3, 3)),
    "instance norm": (lambda: Head(nn.InstanceNorm2d(4, affine=True), 4, channels_last), images(4, 3, 3)),
    "rms norm": (lambda: Head(nn.RMSNorm(5), 5), images(7, 5)),
    "prelu": (lambda: Head(nn.PReLU(5), 7), images(5, 7)),
    "sequence bias": (lambda: Head(SequenceBias(5), 5), images(4, 5)),
    "expression around a sub-module": (lambda: Head(Scaled(5), 5), images(4, 5)),
    "attention batch first": (lambda: Head(Attention(True, True), 8), padded(5, 8)),
    "attention sequence first": (lambda: Head(Attention(False, False), 8), padded(5, 8)),
    **{f"{cls.__name__} batch_first={bf} packed={packed} {kw}": (
        lambda cls=cls, bf=bf, packed=packed, kw=kw: Head(Recurrent(cls, bf, packed, **kw), rnn_width(kw)),
        padded(4, 5)) for cls, bf, packed, kw in RNN_CASES},
}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("mode", ["whole", "micro-batches", "two passes"])
def test_every_family_matches_the_loop(family, mode):
    build, data = FAMILIES[family]
    torch.manual_seed(0)
    model = build().double()
    g = torch.Generator().manual_seed(1)
    x, y = data(g), torch.randint(0, CLASSES, (6,), generator=g)
    check(model, x, y, micro=4 if mode == "micro-batches" else None, kept=0 if mode == "two passes" else None)


@pytest.mark.parametrize("family", ["attention sequence first", "expression around a sub-module",
                                    next(f for f in FAMILIES if f.startswith("LSTM"))])
def test_an_empty_batch_gives_no_norms_and_zero_gradient(family):
    build, data = FAMILIES[family]
    model = build().double()
    x = data(torch.Generator().manual_seed(0))[:0]
    engine = DPEngine(model, LOSS, clip_bound=1.0, noise_multiplier=0.0, expected_batch_size=4.0)
    stats = engine.private_gradient(x, torch.zeros(0, dtype=torch.long))
    assert stats["norms"].numel() == 0
    assert all(bool((p.grad == 0).all()) for p in model.parameters())


@settings(max_examples=12, deadline=None)
@given(b=st.integers(2, 5), T=st.integers(1, 4), hidden=st.integers(1, 4), layers=st.integers(1, 2),
       kind=st.sampled_from(["LSTM", "GRU", "RNN"]), bidirectional=st.booleans())
def test_recurrent_layers_match_the_loop_over_shapes(b, T, hidden, layers, kind, bidirectional):
    torch.manual_seed(b * 100 + T * 10 + hidden)
    rnn = getattr(nn, kind)(3, hidden, num_layers=layers, bidirectional=bidirectional, batch_first=True)
    model = Head(_Wrap(rnn), hidden * (2 if bidirectional else 1)).double()
    g = torch.Generator().manual_seed(T)
    x = torch.randn(b, T, 3, generator=g, dtype=torch.float64)
    y = torch.arange(b) % CLASSES
    _, ref_norms = clipped_sum_loop(model, x, y, 1.0)
    engine = BookKeepingEngine(model, LOSS)
    _, norms = engine.clipped_sum(x, y, lambda n: torch.ones_like(n))
    torch.testing.assert_close(norms, ref_norms, rtol=RTOL, atol=1e-12)


@settings(max_examples=12, deadline=None)
@given(b=st.integers(2, 5), L=st.integers(1, 4), heads=st.sampled_from([1, 2]), head_dim=st.integers(1, 3),
       kdim=st.sampled_from([None, 3]), bias=st.booleans(), batch_first=st.booleans())
def test_attention_matches_the_loop_over_shapes(b, L, heads, head_dim, kdim, bias, batch_first):
    torch.manual_seed(b * 100 + L * 10 + head_dim)
    E = heads * head_dim
    attn = nn.MultiheadAttention(E, heads, bias=bias, kdim=kdim, vdim=kdim, batch_first=batch_first)
    model = _Cross(attn, batch_first).double()
    g = torch.Generator().manual_seed(L)
    x = {"q": torch.randn(b, L, E, generator=g, dtype=torch.float64),
         "kv": torch.randn(b, L + 1, kdim or E, generator=g, dtype=torch.float64)}
    y = torch.arange(b) % CLASSES
    _, ref_norms = clipped_sum_loop(model, x, y, 1.0)
    engine = BookKeepingEngine(model, LOSS)
    _, norms = engine.clipped_sum(x, y, lambda n: torch.ones_like(n))
    torch.testing.assert_close(norms, ref_norms, rtol=RTOL, atol=1e-12)


class _Cross(nn.Module):
    """Cross-attention from keyword inputs ``q`` and ``kv``, then a linear head."""

    def __init__(self, attn: nn.MultiheadAttention, batch_first: bool) -> None:
        super().__init__()
        self.attn, self.batch_first = attn, batch_first
        self.head = nn.Linear(attn.embed_dim, CLASSES)

    def forward(self, q, kv):
        if not self.batch_first:
            q, kv = q.transpose(0, 1), kv.transpose(0, 1)
        out = self.attn(q, kv, kv)[0]
        out = out if self.batch_first else out.transpose(0, 1)
        return self.head(torch.tanh(out).mean(1))


class _Wrap(nn.Module):
    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)[0]


# ---- tied weights ----------------------------------------------------------------------------

class TiedLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.head = nn.Linear(4, CLASSES)

    def forward(self, x):
        return self.head(self.b(torch.tanh(self.a(x))))


def test_a_weight_shared_by_two_modules_gets_the_sum_of_its_uses():
    torch.manual_seed(0)
    model = TiedLinears().double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.arange(6) % CLASSES
    for mode in ("whole", "two passes"):
        engine = check(model, x, y, kept=0 if mode == "two passes" else None)
    rows = {r["module"]: r for r in engine.norms.explain()}
    assert rows["a"]["parameters"] == "weight, bias" and rows["b"]["parameters"] == "weight, bias"
    assert "tied" in rows["b"]["form"]


def tiny_tied_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=40, n_positions=16, n_embd=12, n_layer=2, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
    return GPT2LMHeadModel(config)


def next_token_loss(logits, targets):
    """Per-example mean next-token cross-entropy (targets: the token ids)."""
    return nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), targets[:, 1:], reduction="none").mean(1)


def test_gpt2_with_tied_embeddings_fully_fine_tuned_matches_the_loop():
    torch.manual_seed(0)
    model = tiny_tied_gpt2().double()
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.randint(0, 40, (5, 7), generator=torch.Generator().manual_seed(2))
    engine = check(model, {"input_ids": ids}, ids, loss_fn=next_token_loss, micro=3)
    forms = {r["module"]: r["form"] for r in engine.norms.explain()}
    assert "tied weight: closed form" in forms["lm_head"] and "tied weight: closed form" in forms["transformer.wte"]
    assert forms["transformer.h.0.attn.c_attn"].startswith(("ghost", "materialised"))  # closed forms stay


class TiedEmbeddingHead(nn.Module):
    """Token embeddings with a padding index, called twice, tied to a linear output layer that has
    its own bias: the closed form of a tied embedding and output layer, cross term included."""

    def __init__(self, vocabulary: int = 9) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, 5, padding_idx=0)
        self.mix = nn.Linear(5, 5)
        self.head = nn.Linear(5, vocabulary)
        self.head.weight = self.embed.weight

    def forward(self, input_ids):
        ids = input_ids
        return self.head(torch.tanh(self.mix(self.embed(ids) + 0.5 * self.embed(ids.flip(1)))))


@pytest.mark.parametrize("mode", ["whole", "two passes", "micro-batches"])
def test_an_embedding_tied_to_the_output_layer_gets_its_closed_form_with_the_cross_term(mode):
    torch.manual_seed(0)
    model = TiedEmbeddingHead().double()
    ids = torch.randint(0, 9, (6, 7), generator=torch.Generator().manual_seed(3))
    ids[:, -2:] = 0   # padding: no gradient reaches the padding row through the embedding
    engine = check(model, {"input_ids": ids}, ids, loss_fn=next_token_loss,
                   kept=0 if mode == "two passes" else None, micro=4 if mode == "micro-batches" else None)
    forms = {r["module"]: r["form"] for r in engine.norms.explain()}
    assert "tied weight: closed form" in forms["embed"] and "tied weight: closed form" in forms["head"]


# ---- what is still refused -------------------------------------------------------------------

class UsedOutside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) + nn.functional.linear(x, self.fc.weight)


def test_a_parameter_mixing_examples_is_refused_with_its_path():
    model = Head(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), 4)
    with pytest.raises(UserError, match=r"body\.1 \(BatchNorm1d\): mixes examples"):
        DPEngine(model, LOSS, clip_bound=1.0, noise_multiplier=1.0, expected_batch_size=4.0)


def test_dropout_inside_a_replayed_unit_is_refused_not_replayed_wrongly():
    model = Head(nn.LSTM(5, 6, num_layers=2, dropout=0.5, batch_first=True), 6, pool=lambda out: out[0])
    engine = BookKeepingEngine(model.double(), LOSS)
    with pytest.raises(UserError, match="dropout"):
        engine.clipped_sum(torch.randn(4, 3, 5, dtype=torch.float64), torch.arange(4) % CLASSES,
                           lambda n: torch.ones_like(n))


# ---- randomised estimators and the command line on the new modules ----------------------------

@pytest.mark.parametrize("family", ["attention batch first", next(f for f in FAMILIES if f.startswith("GRU"))])
def test_hutchinson_on_replayed_modules_is_unbiased(family):
    """The randomised weight norms plug into the replayed linear maps: over many probe draws the mean
    squared-norm estimate is the exact one (the loop's) within 4 standard errors."""
    build, data = FAMILIES[family]
    torch.manual_seed(0)
    model = build().double()
    g = torch.Generator().manual_seed(1)
    x, y = data(g), torch.randint(0, CLASSES, (6,), generator=g)
    exact = clipped_sum_loop(model, x, y, 1.0)[1].pow(2)
    engine = BookKeepingEngine(model, LOSS, estimator="hutchinson", sketch_k=2,
                               generator=torch.Generator().manual_seed(5))
    forms = None
    draws = []
    for _ in range(400):
        draws.append(engine.clipped_sum(x, y, lambda n: torch.ones_like(n))[1].pow(2))
        forms = forms or {r["module"]: r["form"] for r in engine.explain()}
    draws = torch.stack(draws)  # [400, b]
    assert [f for m, f in forms.items() if m.startswith("body.")][0].startswith("hutchinson")
    error = (draws.mean(0) - exact).abs() / (draws.std(0) / 20)
    assert bool((error < 4).all()), error
    assert bool((draws.std(0) > 1e-3 * exact).all())  # really random


@pytest.mark.parametrize("model,options,rule", [
    ("vit", {"patch_size": 4, "depth": 2, "embed_dim": 32, "num_heads": 2}, "replay"),
    ("lstm", {"hidden": 32}, "replay"),
])
def test_torchvision_vit_and_lstm_train_end_to_end(model, options, rule):
    """`dptune train` fine-tunes torchvision's ViT (nn.MultiheadAttention inside) and an LSTM on
    digits: every parameter gets a per-sample norm, the attention/LSTM by the replay rule, and the
    model learns (well above the 10% of chance in three epochs at ε = 8)."""
    import io
    import json

    from dptune.cli import main

    out = io.StringIO()
    code = main(["train", "--dataset", "digits", "--model", model, "--model-options", json.dumps(options),
                 "--epochs", "3", "-B", "256", "--lr", "2", "--quiet", "--explain-engine"], out=out)
    text = out.getvalue()
    assert code == 0, text
    table = [line.split() for line in text.splitlines() if line.startswith("  ")]
    unit = "self_attention" if model == "vit" else "lstm"
    assert any(row[0].endswith(unit) and rule in row for row in table)
    accuracy = float(text.splitlines()[-1].split("test acc")[1].split()[0])
    assert accuracy > 0.3


class ScaledLSTM(nn.Module):
    """A block that scales an LSTM's output by its own parameter: the block is one unit, and its
    LSTM is replayed in plain ops inside the unit's vmap."""

    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.lstm = nn.LSTM(5, 6, num_layers=2, batch_first=batch_first)
        self.scale = nn.Parameter(torch.randn(6))
        self.batch_first = batch_first

    def forward(self, x):
        h = x if self.batch_first else x.transpose(0, 1)
        out, (hn, _) = self.lstm(h)
        out = out if self.batch_first else out.transpose(0, 1)
        return out * self.scale + hn[-1][:, None, :]


@pytest.mark.parametrize("batch_first", [True, False])
def test_a_recurrent_layer_inside_a_unit_matches_the_loop(batch_first):
    torch.manual_seed(0)
    model = Head(ScaledLSTM(batch_first), 6).double()
    x, y = padded(4, 5)(torch.Generator().manual_seed(1)), torch.arange(6) % CLASSES
    engine = check(model, x, y, micro=4)
    assert {r["module"]: r["rule"] for r in engine.norms.explain()}["body"] == "unit (vmap)"
