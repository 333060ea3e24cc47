"""What every dataset loader returns (:class:`DatasetSplits`), and reading a batch from a split."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch.utils.data import Dataset, Subset, TensorDataset, default_collate

from ...errors import UserError


@dataclass
class Generations:
    """What greedy generation on the test split starts from and is scored against: each test
    example's prompt tokens (as trained on) and its reference completion, with the tokenizer."""

    prompts: list[list[int]]
    references: list[str]
    tokenizer: object


@dataclass
class DatasetSplits:
    """A dataset's splits and what its task needs: ``task`` ``classification`` (``num_classes``
    labels) or ``generation`` (prompt → completion: targets are token labels, see
    :mod:`.generation`; ``truncated`` counts over-long examples per split)."""

    name: str
    train: Dataset
    test: Dataset
    num_classes: int
    class_names: list[str]
    input_shape: tuple[int, ...]
    validation: Dataset | None = None   # held out of train for selection (see with_validation)
    task: str = "classification"
    truncated: dict[str, int] = field(default_factory=dict)
    generations: Generations | None = None


def labels_of(dataset: Dataset) -> torch.Tensor:
    """The class labels of a split, without reading its inputs."""
    if isinstance(dataset, TensorDataset):
        return dataset.tensors[1]
    if isinstance(dataset, Subset):
        return labels_of(dataset.dataset)[torch.as_tensor(dataset.indices)]
    labels = getattr(dataset, "labels", None)
    if labels is None:
        raise TypeError(f"cannot read the labels of a {type(dataset).__name__} without its inputs")
    return torch.as_tensor(labels)


def validation_size(n: int, fraction: float) -> int:
    """Examples :func:`with_validation` holds out of ``n``: ⌈fraction·n⌉ (as train_test_split does)."""
    return math.ceil(fraction * n) if fraction > 0 else 0


def with_validation(splits: DatasetSplits, fraction: float, seed: int) -> DatasetSplits:
    """Hold out a seeded ``fraction`` of the training split (stratified by class for a classification
    task) as a validation split.

    Model selection on it is not differentially private (the validation examples are private
    data and the selection is not accounted for); test data is left for reporting only.
    """
    if not 0 < fraction < 1:
        raise UserError(f"validation_fraction must be in (0, 1); got {fraction!r}")
    from sklearn.model_selection import train_test_split

    labels = labels_of(splits.train).numpy()
    stratify = labels if splits.task == "classification" else None   # token labels: no classes to stratify by
    train, val = train_test_split(np.arange(len(labels)), test_size=validation_size(len(labels), fraction),
                                  stratify=stratify, random_state=seed)
    train, val = np.sort(train), np.sort(val)

    def part(idx: np.ndarray) -> Dataset:
        if isinstance(splits.train, TensorDataset):
            x, y = splits.train.tensors
            return TensorDataset(x[idx], y[idx])
        return Subset(splits.train, idx.tolist())

    return replace(splits, train=part(train), validation=part(val))


def take(dataset: Dataset, indices: torch.Tensor) -> tuple[object, torch.Tensor]:
    """(inputs, targets) of the examples at ``indices``; fast path for tensor datasets."""
    if isinstance(dataset, TensorDataset):
        x, y = dataset.tensors
        return x[indices], y[indices]
    return default_collate([dataset[i] for i in indices.tolist()])
