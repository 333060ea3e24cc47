"""Backbone and dataset options on the axes (issue 12, item 1): validated against the builders
before Ray starts, shown in the cell label, passed to the trainer; sizes from metadata."""
import re

import numpy as np
import pytest

from dptune.platform.sweep.catalog import trainables_catalog
from dptune.platform.sweep.trial_config import train_options
from dptune.search_spaces import SearchSpace, SpecError, load_spec, plan_sweep
from dptune.search_spaces.search_sections import AxisValue
from dptune.trainables.config import TrainConfig
from dptune.trainables.data.catalog import load_dataset, train_size
from sweep_plans import levers_off


def spec(backbone, dataset="digits", **extra):
    return {"axes": {"epsilon": 1, "backbone": backbone, "dataset": dataset, "epochs": 1},
            "clip_bound": [1], "batch_size": [64], "pruning": {"min_steps": 1},
            "learning_rate": {"reference": 1.0, "reference_batch_size": 64}, "search": levers_off(), **extra}


def test_options_reach_the_cell_label_and_the_trainer_config():
    s = load_spec(spec(["cnn", {"name": "hf:all-MiniLM-L6-v2", "peft": "lora", "lora_rank": 4, "weights": "random"}],
                       [{"name": "bbc_news", "max_length": 32}]), trainables_catalog())
    axes = SearchSpace.from_spec(s).axes
    assert axes.backbone[1] == AxisValue("hf:all-MiniLM-L6-v2", (("lora_rank", 4), ("peft", "lora"),
                                                                 ("weights", "random")))
    plan = plan_sweep(s, trainables_catalog(), workers=1)
    keys = [c.cell.key for c in plan]
    assert keys[1] == "bbc_news[max_length=32]/hf:all-MiniLM-L6-v2[lora_rank=4,peft=lora,weights=random]/E=1/delta=1e-05/eps=1"
    assert plan.cells[0].dataset_size == len(load_dataset("bbc_news", max_length=8).train)
    trial = plan.cells[1].trials()[0]
    train = train_options(trial)
    assert (train["model"], train["peft"], train["weights"], train["model_options"], train["max_length"]) == \
        ("hf:all-MiniLM-L6-v2", "lora", "random", {"lora_rank": 4}, 32)
    assert trial["backbone_label"] == "hf:all-MiniLM-L6-v2[lora_rank=4,peft=lora,weights=random]"
    TrainConfig.from_dict(train).validate()   # the trainer takes every field


@pytest.mark.parametrize("backbone, dataset, message", [
    ({"name": "timm:vit_tiny_patch16_224.augreg_in21k", "peft": "film", "lora_rank": 8}, "digits",
     "axes.backbone[0]: model 'timm:vit_tiny_patch16_224.augreg_in21k': option(s) lora_rank apply only with peft: lora"),
    ({"name": "vit_tiny_patch16_224.augreg_in21k", "lora_rank": 8}, "digits", "peft is film"),
    ({"name": "cnn", "peft": "film"}, "digits", "axes.backbone[0]: model 'cnn' does not take option(s) peft; it takes: width"),
    ({"name": "cnn", "widht": 8}, "digits", "does not take option(s) widht; it takes: width"),
    ({"name": "hf:all-MiniLM-L6-v2", "peft": "adapter"}, "digits", "peft must be None or one of film, lora, head, full"),
    ({"peft": "lora"}, "digits", "axes.backbone[0].name: required"),
    ({"name": "vit_huge"}, "digits", "unknown backbone 'vit_huge'; registered: mlp, cnn"),
    ("cnn", {"name": "digits", "max_length": 32}, "axes.dataset: dataset 'digits' does not take option(s) max_length; "
                                                  "it takes: test_size"),
    ("cnn", {"name": "bbc_news", "data_dir": "/d"}, "dataset 'bbc_news' does not take option(s) data_dir; "
                                                    "it takes: max_length"),
    ("cnn", {"name": "bbc_news", "tokenizer": "x"}, "axes.dataset.tokenizer: unknown dataset option; "
                                                    "allowed: data_dir, max_length"),
    ("cnn", {"name": "bbc_news", "max_length": 1}, "axes.dataset.max_length: must be a whole number >= 2"),
])
def test_bad_options_are_named_with_what_is_allowed(backbone, dataset, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        load_spec(spec([backbone] if isinstance(backbone, dict) else backbone, dataset), trainables_catalog())


def test_bad_options_are_refused_before_ray_starts(tmp_path):
    import ray
    import yaml

    from dptune.platform.sweep.driver import prepare

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec([{"name": "cnn", "peft": "lora"}])))
    with pytest.raises(SpecError, match="does not take option"):
        prepare(str(path), progress=False)
    assert not ray.is_initialized()


# --- sizes from metadata -------------------------------------------------------------------------

def _text_table(n: int, seed: int = 0):
    import datasets

    rng = np.random.default_rng(seed)
    labels = np.repeat([0, 1, 2], n // 3 + 1)[:n]
    rng.shuffle(labels)
    return datasets.Dataset.from_dict({"text": [f"article {i} about {lab}" for i, lab in enumerate(labels)],
                                       "label": labels.tolist()})


@pytest.mark.parametrize("layout", ["save_to_disk_one_split", "save_to_disk_train_test", "parquet_file",
                                    "parquet_folder"])
def test_text_sizes_from_metadata_match_the_loader(tmp_path, layout, monkeypatch):
    import datasets

    path = tmp_path / "data"
    if layout == "save_to_disk_one_split":
        _text_table(103).save_to_disk(str(path))
    elif layout == "save_to_disk_train_test":
        datasets.DatasetDict({"train": _text_table(61), "test": _text_table(20, 1)}).save_to_disk(str(path))
    elif layout == "parquet_file":
        path = tmp_path / "data.parquet"
        _text_table(77).to_parquet(str(path))
    else:
        path.mkdir()
        _text_table(50).to_parquet(str(path / "train-00000-of-00002.parquet"))
        _text_table(41, 2).to_parquet(str(path / "train-00001-of-00002.parquet"))
        _text_table(30, 3).to_parquet(str(path / "test-00000-of-00001.parquet"))
    from dptune.trainables.data import catalog as data

    def refuse(*_, **__):
        raise AssertionError("counting must not load the data")

    monkeypatch.setitem(data.DATASETS._entries, "20newsgroups", refuse)   # counting must not call the loader
    counted = data.TRAIN_SIZES.get("20newsgroups")(data_dir=str(path))
    monkeypatch.undo()
    loaded = len(load_dataset("20newsgroups", data_dir=str(path), max_length=8).train)
    assert counted == loaded


def test_image_folder_size_from_the_listing(tmp_path):
    from PIL import Image

    for split, n in (("train", 7), ("test", 3)):
        for cls in ("cat", "dog"):
            folder = tmp_path / "imgs" / split / cls
            folder.mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (4, 4), (i * 20, 0, 0)).save(folder / f"{i}.png")
    counted = train_size("cifar100", data_dir=str(tmp_path / "imgs"))
    assert counted == 14 == len(load_dataset("cifar100", data_dir=str(tmp_path / "imgs")).train)


def test_a_missing_data_dir_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train_size("cifar100", data_dir=str(tmp_path / "nope"))
