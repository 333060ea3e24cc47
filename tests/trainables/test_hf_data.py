"""HF-backed datasets: local fixtures in every supported layout (image folder, Parquet,
save_to_disk), the stratified CIFAR-100 10% subset, the embedded BBC News set, and the errors."""

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from dptune.trainables.data import hf as hf_data
from dptune.trainables.data.catalog import load_dataset
from dptune.trainables.data.splits import take
from dptune.trainables.hub import ResourceNotFound, hub_reachable
from dptune.trainables.models.catalog import data_options

COLOURS = {"beach": (255, 0, 0), "forest": (0, 255, 0), "kitchen": (0, 0, 255)}


@pytest.fixture(autouse=True)
def private_datasets_cache(monkeypatch, tmp_path):
    """Arrow files that `datasets` writes for local folders go to a temporary cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))


def image_folder(root, per_split=(("train", 4), ("test", 2)), size=(20, 12)):
    """<root>/<split>/<class>/<i>.png, every image one solid colour per class."""
    for split, n in per_split:
        for cls, colour in COLOURS.items():
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", size, colour).save(root / split / cls / f"{i}.png")
    return root


def cifar_like(n_per_class: int, classes: int = 5) -> datasets.Dataset:
    """CIFAR-100's layout (img, fine_label, coarse_label); the image's red value encodes its index."""
    n = n_per_class * classes
    features = datasets.Features({"img": datasets.Image(),
                                  "fine_label": datasets.ClassLabel(names=[f"fine{c}" for c in range(classes)]),
                                  "coarse_label": datasets.ClassLabel(names=["a", "b"])})
    return datasets.Dataset.from_dict({"img": [Image.new("RGB", (32, 32), (i, 0, 0)) for i in range(n)],
                                       "fine_label": [i % classes for i in range(n)],
                                       "coarse_label": [i % 2 for i in range(n)]}, features=features)


def red(split) -> list[int]:
    """The index of each image in a cifar_like set (its red value)."""
    return [int(np.asarray(img)[0, 0, 0]) for img in split.rows["img"]]


def test_image_folder_gives_labelled_normalised_images_at_the_requested_size(tmp_path):
    data = load_dataset("sun397", data_dir=str(image_folder(tmp_path / "sun")), image_size=16)
    assert (len(data.train), len(data.test), data.num_classes) == (12, 6, 3)
    assert data.class_names == sorted(COLOURS) and data.input_shape == (3, 16, 16)
    x, y = take(data.train, torch.arange(12))
    assert x.shape == (12, 3, 16, 16) and torch.equal(torch.bincount(y), torch.tensor([4, 4, 4]))
    for image, label in zip(x, y):  # mean = std = 0.5: 255 -> 1, 0 -> -1, per channel
        expected = torch.tensor(COLOURS[data.class_names[label]]) / 127.5 - 1
        torch.testing.assert_close(image[:, 8, 8], expected)


def test_images_are_prepared_for_the_backbone(tmp_path):
    options = data_options("vit_tiny_patch16_224.augreg_in21k")
    data = load_dataset("sun397", data_dir=str(image_folder(tmp_path / "sun", size=(40, 30))), **options)
    x, _ = take(data.test, torch.arange(2))
    assert data.input_shape == (3, 224, 224) and x.shape == (2, 3, 224, 224)
    with pytest.raises(ValueError, match="does not take option"):
        load_dataset("digits", **options)  # 8×8 digits cannot be prepared for a ViT


def test_parquet_files_with_train_and_test_splits(tmp_path):
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=["cbb", "cbsd", "healthy"])})
    for split, n in (("train", 9), ("test", 6)):
        datasets.Dataset.from_dict({"image": [Image.new("RGB", (10, 10), (0, 0, 0))] * n,
                                    "label": [i % 3 for i in range(n)]},
                                   features=features).to_parquet(str(tmp_path / f"{split}.parquet"))
    data = load_dataset("cassava", data_dir=str(tmp_path), image_size=8)
    assert (len(data.train), len(data.test), data.class_names) == (9, 6, ["cbb", "cbsd", "healthy"])
    assert take(data.train, torch.arange(3))[0].shape == (3, 3, 8, 8)


def test_a_single_split_is_split_stratified_and_seeded(tmp_path):
    cifar_like(10).to_parquet(str(tmp_path / "all.parquet"))
    path = str(tmp_path / "all.parquet")
    a, b, c = (load_dataset("cifar100", data_dir=path, seed=s) for s in (0, 0, 1))
    assert (len(a.train), len(a.test), a.input_shape) == (40, 10, (3, 32, 32))  # native CIFAR resolution
    assert torch.equal(torch.bincount(a.test.labels), torch.full((5,), 2))
    assert red(a.test) == red(b.test) != red(c.test)
    assert sorted(red(a.train) + red(a.test)) == list(range(50))


def test_cifar100_10pct_is_a_stratified_seeded_tenth_of_train_with_the_full_test_set(tmp_path):
    datasets.DatasetDict({"train": cifar_like(20), "test": cifar_like(4)}).save_to_disk(str(tmp_path / "c"))
    full = load_dataset("cifar100", data_dir=str(tmp_path / "c"))
    tenth = [load_dataset("cifar100_10pct", data_dir=str(tmp_path / "c"), seed=s) for s in (0, 0, 1)]
    assert (len(full.train), len(tenth[0].train), len(tenth[0].test)) == (100, 10, 20)
    assert torch.equal(torch.bincount(tenth[0].train.labels), torch.full((5,), 2))
    assert tenth[0].class_names == [f"fine{c}" for c in range(5)]  # fine labels, not the coarse ones
    assert red(tenth[0].train) == red(tenth[1].train) != red(tenth[2].train)
    x, y = take(tenth[0].train, torch.arange(10))
    assert [r % 5 for r in red(tenth[0].train)] == y.tolist()  # labels stay with their images


def test_text_saved_to_disk_is_tokenised_to_max_length_with_label_names(tmp_path):
    rows = {"train": 6, "test": 4}
    datasets.DatasetDict({
        split: datasets.Dataset.from_dict({"text": [f"space shuttle number {i}" for i in range(n)],
                                           "label": [i % 2 for i in range(n)],
                                           "label_text": [("alt.atheism", "sci.space")[i % 2] for i in range(n)]})
        for split, n in rows.items()}).save_to_disk(str(tmp_path / "ng"))
    data = load_dataset("20newsgroups", data_dir=str(tmp_path / "ng"), max_length=8)
    assert (len(data.train), len(data.test), data.class_names) == (6, 4, ["alt.atheism", "sci.space"])
    x, y = take(data.train, torch.arange(3))
    assert x["input_ids"].shape == x["attention_mask"].shape == (3, 8) and y.tolist() == [0, 1, 0]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(data_options("all-MiniLM-L6-v2")["tokenizer"])
    assert tokenizer.decode(x["input_ids"][1], skip_special_tokens=True) == "space shuttle number 1"
    assert x["attention_mask"][1].tolist() == [1] * 6 + [0] * 2  # [CLS] 4 words [SEP], then padding


def test_data_dir_root_from_the_environment(tmp_path, monkeypatch):
    (tmp_path / "cifar100").mkdir()
    cifar_like(10).to_parquet(str(tmp_path / "cifar100" / "train.parquet"))
    monkeypatch.setenv("DPTUNE_DATA_DIR", str(tmp_path))
    assert len(load_dataset("cifar100").train) == 40


def test_bbc_news_is_embedded_complete_and_split_stratified():
    data = load_dataset("bbc_news", max_length=16)
    assert (len(data.train), len(data.test)) == (1780, 445)
    assert data.class_names == ["business", "entertainment", "politics", "sports", "tech"]
    counts = torch.bincount(data.train.labels) + torch.bincount(data.test.labels)
    assert counts.tolist() == [510, 386, 417, 511, 401]
    assert torch.bincount(data.test.labels).tolist() == [102, 77, 84, 102, 80]
    assert data.train.input_ids.shape == (1780, 16) and data.input_shape == (16,)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(data_options("all-MiniLM-L6-v2")["tokenizer"])
    titles = {tokenizer.decode(ids, skip_special_tokens=True) for ids in data.train.input_ids[:, :8]}
    titles |= {tokenizer.decode(ids, skip_special_tokens=True) for ids in data.test.input_ids[:, :8]}
    assert any(t.startswith("ad sales boost time warner profit") for t in titles)  # business/001.txt
    other = load_dataset("bbc_news", max_length=16, seed=1)
    assert not torch.equal(other.test.input_ids, data.test.input_ids)


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_reachable.cache_clear()
    yield
    hub_reachable.cache_clear()


def test_missing_datasets_give_a_clear_one_line_error_without_trying_the_network(tmp_path, monkeypatch, offline):
    """Offline, a missing set is named at once: no connection is even attempted (so no retries or
    time-outs stand before the error, on any machine)."""
    import socket

    monkeypatch.setitem(hf_data.HF_SOURCES, "cifar100",
                        hf_data.HFSource("dptune-tests/no-such-dataset", "image", "fine_label", native_size=32))
    attempts = []

    def no_network(self, address, *args):
        attempts.append(address)
        raise OSError("the network is off in this test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    with pytest.raises(ResourceNotFound) as hub:
        load_dataset("cifar100")
    with pytest.raises(ResourceNotFound) as missing:
        load_dataset("sun397", data_dir=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResourceNotFound) as empty:
        load_dataset("cassava", data_dir=str(tmp_path / "empty"))
    assert attempts == []
    for err, name in ((hub, "cifar100"), (missing, "sun397"), (empty, "cassava")):
        assert "\n" not in str(err.value) and repr(name) in str(err.value)
    assert "dptune-tests/no-such-dataset" in str(hub.value) and "--data-dir" in str(hub.value)


def test_unknown_dataset_options_are_refused():
    with pytest.raises(ValueError, match="does not take option.*max_length.*it takes: test_size"):
        load_dataset("digits", max_length=12)
