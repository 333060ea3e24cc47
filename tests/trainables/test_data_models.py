"""Embedded datasets (seeded stratified splits) and the model registry."""
import pytest
import torch
from torch import nn

from dptune.trainables.data.catalog import DATASETS, load_dataset
from dptune.trainables.models.catalog import CAUSAL_LMS, INPUT_SPECS, MODELS, create_model


@pytest.mark.parametrize("name,n_train,n_test,shape", [("digits", 1437, 360, (1, 8, 8)),
                                                        ("mnist5k", 4000, 1000, (1, 28, 28))])
def test_embedded_sets_are_stratified_and_seeded(name, n_train, n_test, shape):
    data = load_dataset(name, seed=0)
    x, y = data.train.tensors
    assert (len(data.train), len(data.test), data.input_shape, data.num_classes) == (n_train, n_test, shape, 10)
    assert x.shape[1:] == shape and len(data.class_names) == 10
    share = torch.bincount(y, minlength=10).double() / len(y)
    test_share = torch.bincount(data.test.tensors[1], minlength=10).double() / len(data.test)
    assert (share - test_share).abs().max() < 0.01  # stratified: same class mix in both splits
    assert torch.equal(load_dataset(name, seed=0).train.tensors[0], x)
    assert not torch.equal(load_dataset(name, seed=1).train.tensors[0], x)
    assert abs(x.mean().item()) < 1e-3 and x.std().item() == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("cache", ["fresh", "off"])
def test_embedded_splits_are_scikit_learns_whether_computed_or_read_from_disk(cache, tmp_path, monkeypatch):
    """The split tensors kept on disk for the next process are those of the reference: scikit-learn's
    stratified split of the raw data, standardised with the train mean and std, computed here; a second
    load reads the file (no scikit-learn split: patched to fail) and gives the same tensors; with
    DPTUNE_CACHE_DIR=off nothing is written."""
    import sklearn.model_selection
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path) if cache == "fresh" else "off")
    d = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(d.data / 16.0, d.target, test_size=0.2, stratify=d.target, random_state=4)
    mean, std = x_tr.mean(), x_tr.std()
    first = load_dataset("digits", seed=4)
    if cache == "fresh":
        monkeypatch.setattr(sklearn.model_selection, "train_test_split", lambda *a, **k: 1 / 0)
    loads = [first, load_dataset("digits", seed=4)] if cache == "fresh" else [first]
    for data in loads:
        assert torch.allclose(data.train.tensors[0].reshape(len(x_tr), -1),
                              torch.tensor((x_tr - mean) / std, dtype=torch.float32))
        assert torch.allclose(data.test.tensors[0].reshape(len(x_te), -1),
                              torch.tensor((x_te - mean) / std, dtype=torch.float32))
        assert torch.equal(data.train.tensors[1], torch.tensor(y_tr)) and torch.equal(data.test.tensors[1], torch.tensor(y_te))
    assert len(list(tmp_path.rglob("*.pt"))) == (1 if cache == "fresh" else 0)


def test_mnist_is_not_left_sorted_by_label():
    y = load_dataset("mnist5k").train.tensors[1]
    assert (y[1:] != y[:-1]).float().mean() > 0.5


def test_unknown_names_list_the_registered_ones():
    with pytest.raises(ValueError, match="digits"):
        load_dataset("cifar1000")
    with pytest.raises(ValueError, match="wrn16_4"):
        create_model("resnet9000", num_classes=10, input_shape=(1, 8, 8))


def test_unknown_names_list_every_registered_one_and_the_families():
    with pytest.raises(ValueError) as info:
        load_dataset("cifar1000")
    assert str(info.value) == f"dataset must be one of {', '.join(DATASETS)}; got 'cifar1000'"
    assert {"digits", "mnist5k", "cifar100", "bbc_news"} <= set(DATASETS)
    with pytest.raises(ValueError) as info:
        create_model("resnet9000", num_classes=10, input_shape=(1, 8, 8))
    assert str(info.value) == f"model must be one of {', '.join(MODELS)}, timm:<name>, hf:<name>; got 'resnet9000'"


def test_a_model_or_dataset_name_is_taken_once():
    with pytest.raises(ValueError, match="model 'cnn' is already registered"):
        MODELS.register("cnn", lambda **kw: None)
    with pytest.raises(ValueError, match="dataset 'digits' is already registered"):
        DATASETS.register("digits", lambda **kw: None)


@pytest.mark.parametrize("name", sorted(n for n in MODELS if n not in INPUT_SPECS and n not in CAUSAL_LMS))
# backbones: test_backbones; causal LMs: test_causal_lm, test_embedded_lm
def test_every_model_has_no_batchnorm_and_runs(name):
    model = create_model(name, num_classes=7, input_shape=(3, 16, 16))
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 7)


def test_wide_resnet_16_4_has_the_published_size():
    model = create_model("wrn16_4", num_classes=10, input_shape=(3, 32, 32))
    # WRN-16-4 on CIFAR-10: 2.75M parameters (Zagoruyko & Komodakis 2016, Table 1)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(2.75e6, rel=0.01)
