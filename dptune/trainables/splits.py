"""What every dataset loader returns (:class:`DatasetSplits`), and reading a batch from a split."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset, TensorDataset, default_collate


@dataclass
class DatasetSplits:
    name: str
    train: Dataset
    test: Dataset
    num_classes: int
    class_names: list[str]
    input_shape: tuple[int, ...]


def take(dataset: Dataset, indices: torch.Tensor) -> tuple[object, torch.Tensor]:
    """(inputs, targets) of the examples at ``indices``; fast path for tensor datasets."""
    if isinstance(dataset, TensorDataset):
        x, y = dataset.tensors
        return x[indices], y[indices]
    return default_collate([dataset[i] for i in indices.tolist()])
