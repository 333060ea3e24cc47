"""``peft: head`` on cached frozen features (trainables/models/frozen_features.py): the same per-example
norms, clipped sums and accuracies as running the whole model every step, a disk cache keyed so that
a change of any input computes again, and a clear fallback where a model cannot be cut."""
import copy

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from dptune.trainables import DPEngine
from dptune.trainables import frozen_features
from dptune.trainables.engine.batching import model_outputs
from dptune.trainables.config import TrainConfig
from dptune.trainables.frozen_features import head_on_features
from dptune.trainables.data.hf import TokenizedDataset
from dptune.trainables.data.splits import DatasetSplits
from dptune.trainables.training import Trainer

from test_backbones import IMAGE_SHAPE, SEQ, SMALL, VIT, small, text_batch

NAMES = ["bert-base-uncased", "distilbert-base-uncased", VIT]
CLIP = 0.05   # below most per-example norms: clipping is active


def splits(name: str, n_train: int = 48, n_test: int = 24, seed: int = 0) -> DatasetSplits:
    """Random inputs (token ids with padding, or images) and 3-class labels, fixed by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    y_train, y_test = torch.randint(0, 3, (n_train,), generator=g), torch.randint(0, 3, (n_test,), generator=g)
    if name == VIT:
        return DatasetSplits("images", TensorDataset(torch.randn(n_train, *IMAGE_SHAPE, generator=g), y_train),
                             TensorDataset(torch.randn(n_test, *IMAGE_SHAPE, generator=g), y_test), 3,
                             ["a", "b", "c"], IMAGE_SHAPE)
    train, test = text_batch(n_train, g), text_batch(n_test, g)
    return DatasetSplits("text", TokenizedDataset(train["input_ids"], train["attention_mask"], y_train),
                         TokenizedDataset(test["input_ids"], test["attention_mask"], y_test), 3, ["a", "b", "c"],
                         (SEQ,))


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path))
    frozen_features._memory.clear()


def loop_clipped(model: nn.Module, data: DatasetSplits, idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Per-example gradients of the trainable parameters through the WHOLE model (frozen part in eval
    mode, float64), one example at a time: their norms and the sum of the clipped gradients."""
    model = model.double()
    for module in model.modules():
        module.eval()
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    norms, total = [], {n: torch.zeros_like(p) for n, p in params.items()}
    for i in idx.tolist():
        x, y = data.train[i]
        x = {k: v[None] for k, v in x.items()} if isinstance(x, dict) else x[None].double()
        loss = nn.functional.cross_entropy(model_outputs(model, x), y[None])
        grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
        norm = torch.sqrt(sum((g ** 2).sum() for g in grads.values()))
        norms.append(norm)
        for n, g in grads.items():
            total[n] += g * min(1.0, CLIP / float(norm))
    return torch.stack(norms), total


@pytest.mark.parametrize("name", NAMES)
def test_norms_and_clipped_sum_on_features_equal_a_loop_through_the_whole_model(name):
    data = splits(name)
    model = small(name, peft="head")
    reference = copy.deepcopy(model)
    head, features, source = head_on_features(model, data, torch.device("cpu"))
    assert source == "computed" and set(features.__dict__) >= {"train", "test"}
    assert {n for n, p in head.named_parameters() if p.requires_grad}   # only the head is left
    assert sum(p.numel() for p in head.parameters()) < sum(p.numel() for p in reference.parameters()) / 5
    idx = torch.tensor([0, 3, 5, 8, 13, 21, 34, 40])
    x, y = features.train.tensors[0][idx], features.train.tensors[1][idx]
    engine = DPEngine(head, nn.CrossEntropyLoss(reduction="none"), clip_bound=CLIP, noise_multiplier=0.0,
                      expected_batch_size=len(idx))
    stats = engine.private_gradient(x, y)
    want_norms, want_sum = loop_clipped(reference, data, idx)
    assert (want_norms > CLIP).sum() >= 4
    torch.testing.assert_close(stats["norms"].double(), want_norms, rtol=1e-4, atol=1e-7)
    got = [p.grad for p in head.parameters() if p.requires_grad]   # the head's order is the model's
    assert [g.shape for g in got] == [g.shape for g in want_sum.values()]
    for g, total in zip(got, want_sum.values()):
        torch.testing.assert_close(g.double(), total / (len(idx) * CLIP), rtol=1e-4, atol=1e-7)   # ĝ = s/(B C)


def run(name: str, data: DatasetSplits, **options) -> Trainer:
    cfg = TrainConfig(dataset="unused", model=name, peft="head", weights="random", epsilon=4.0, delta=1e-5,
                      noise_multiplier=0.8, clip_bound=CLIP, batch_size=12, epochs=3, learning_rate=0.5,
                      optimizer="sgd", device="cpu", model_options=SMALL[name], seed=3, **options)
    trainer = Trainer(cfg, data)
    trainer.history = trainer.fit()
    return trainer


def head_weights(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach() for p in trainer.model.parameters() if p.requires_grad]


@pytest.mark.parametrize("name", NAMES)
def test_a_cached_run_trains_as_the_whole_model_does(name, monkeypatch):
    data = splits(name)
    cached = run(name, data)
    assert cached.features_source == "computed"
    monkeypatch.setattr(frozen_features, "FEATURE_CUTS", ())   # no cut known: the whole model every step
    with pytest.warns(UserWarning, match="frozen features not cached .no feature cut is known"):
        whole = run(name, data)
    assert whole.features_source is None
    assert [m["test_accuracy"] for m in cached.history] == [m["test_accuracy"] for m in whole.history]
    for a, b in zip([m["test_loss"] for m in cached.history], [m["test_loss"] for m in whole.history]):
        assert a == pytest.approx(b, rel=1e-4)
    got, want = head_weights(cached), head_weights(whole)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def seeded(name: str, seed: int = 0) -> nn.Module:
    """The small random model ``name``, its weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return small(name, peft="head")


def test_the_disk_cache_is_shared_and_any_change_of_input_computes_again(tmp_path):
    name, cpu = "bert-base-uncased", torch.device("cpu")
    data = splits(name)
    first = head_on_features(seeded(name), data, cpu)
    frozen_features._memory.clear()
    again = head_on_features(seeded(name), data, cpu)
    assert (first[2], again[2]) == ("computed", "disk")
    assert torch.equal(first[1].train.tensors[0], again[1].train.tensors[0])
    assert head_on_features(seeded(name), data, cpu)[2] == "memory"
    # another random initialisation of the frozen weights, other inputs, another split: computed again
    other_weights = head_on_features(seeded(name, 1), data, cpu)
    other_inputs = head_on_features(seeded(name), splits(name, seed=1), cpu)
    other_split = head_on_features(seeded(name), splits(name, n_train=40), cpu)
    assert [r[2] for r in (other_weights, other_inputs, other_split)] == ["computed"] * 3
    assert not torch.equal(other_weights[1].train.tensors[0], first[1].train.tensors[0])
    assert len(list((tmp_path / "features").glob("*.pt"))) == 4


def test_a_torn_cache_file_is_computed_again_and_off_disables_the_disk(tmp_path, monkeypatch):
    name, cpu = "distilbert-base-uncased", torch.device("cpu")
    data = splits(name)
    head_on_features(seeded(name), data, cpu)
    (path,) = (tmp_path / "features").glob("*.pt")
    path.write_bytes(path.read_bytes()[:100])
    frozen_features._memory.clear()
    assert head_on_features(seeded(name), data, cpu)[2] == "computed"
    frozen_features._memory.clear()
    assert head_on_features(seeded(name), data, cpu)[2] == "disk"   # written whole again
    monkeypatch.setenv("DPTUNE_CACHE_DIR", "off")
    frozen_features._memory.clear()
    assert head_on_features(seeded(name), data, cpu)[2] == "computed"


def test_a_trained_parameter_below_the_cut_runs_the_whole_model_and_says_why():
    model = small("bert-base-uncased", peft="head")
    model.bert.encoder.layer[0].output.LayerNorm.weight.requires_grad_(True)
    with pytest.warns(UserWarning, match="a parameter below the hf:bert cut trains"):
        assert head_on_features(model, splits("bert-base-uncased"), torch.device("cpu")) is None
    assert isinstance(model.bert, nn.Module) and hasattr(model.bert, "encoder")   # the model is left whole


def test_features_that_do_not_give_the_models_logits_are_refused(monkeypatch):
    """A cut whose head reads something the features do not hold (here: the features are shifted)."""
    model = small("bert-base-uncased", peft="head")
    original = frozen_features._hf_features

    def shifted(base):
        features = original(base)
        return lambda inputs: features(inputs) + 1.0

    monkeypatch.setattr(frozen_features, "_hf_features", shifted)
    with pytest.warns(UserWarning, match="does not give the model's logits"):
        assert head_on_features(model, splits("bert-base-uncased"), torch.device("cpu")) is None
    assert hasattr(model.bert, "encoder")   # restored
