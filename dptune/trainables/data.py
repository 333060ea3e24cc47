"""The dataset catalog: one interface for every source, ``load_dataset(name, seed=…, **options)``.

It returns a :class:`DatasetSplits`: train and test ``torch.utils.data.Dataset``s, the number of
classes, class names and the input shape. Loaders live in their own modules and import nothing
from here: the sets shipped in wheels (``embedded_data``: digits, mnist5k) and the public sets
of "On optimal hyperparameters for DP deep transfer learning" through HF ``datasets`` plus the
embedded BBC News (``hf_data``). This module registers them by name.
"""
from __future__ import annotations

import functools
from typing import Callable

from ..registry import Registry, check_options
from . import embedded_data, hf_data
from .splits import DatasetSplits, take

__all__ = ["DATASETS", "DatasetSplits", "load_dataset", "take", "train_size"]

DATASETS: Registry[Callable[..., DatasetSplits]] = Registry("dataset")
#: How to count a dataset's training examples without decoding it: fn(**options) -> N, or None
#: when it cannot (then the data is loaded). Datasets without an entry are loaded to be counted.
TRAIN_SIZES: Registry[Callable[..., int | None]] = Registry("dataset size")


def load_dataset(name: str, *, seed: int = 0, **options: object) -> DatasetSplits:
    """Load a registered dataset; unknown names raise ValueError listing the registered ones, unknown
    options one listing the options the dataset takes."""
    loader = DATASETS.get(name)
    check_options("dataset", name, loader, options, implicit=("seed",))
    return loader(seed=seed, **options)


def train_size(name: str, **options: object) -> int:
    """Training-set size N of a registered dataset (what the trainer sees), from metadata when the
    dataset can be counted without decoding it (Arrow/Parquet row counts, folder listings); the
    embedded sets are loaded (cheap). Options a dataset does not take are refused."""
    loader = DATASETS.get(name)
    check_options("dataset", name, loader, options, implicit=("seed",))
    if name in TRAIN_SIZES:
        n = TRAIN_SIZES.get(name)(**options)
        if n is not None:
            return int(n)
    return len(loader(seed=0, **options).train)


# --- the catalog -----------------------------------------------------------------------------

DATASETS.register("digits", embedded_data.digits)
DATASETS.register("mnist5k", embedded_data.mnist5k)
for _name in hf_data.HF_SOURCES:
    DATASETS.register(_name, hf_data.loader(_name))
    TRAIN_SIZES.register(_name, functools.partial(hf_data.train_size, _name))
DATASETS.register("bbc_news", hf_data.bbc_news)
TRAIN_SIZES.register("bbc_news", hf_data.bbc_news_size)
