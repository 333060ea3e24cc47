"""The dataset catalog: one interface for every source, ``load_dataset(name, seed=…, **options)``.

It returns a :class:`DatasetSplits`: train and test ``torch.utils.data.Dataset``s, the number of
classes, class names and the input shape. Loaders live in their own modules and import nothing
from here: the sets shipped in wheels (``embedded_data``: digits, mnist5k) and the public sets
of "On optimal hyperparameters for DP deep transfer learning" through HF ``datasets`` plus the
embedded BBC News (``hf_data``). This module registers them by name.
"""
from __future__ import annotations

from typing import Callable

from ..registry import Registry, check_options
from . import embedded_data, hf_data
from .splits import DatasetSplits, take

__all__ = ["DATASETS", "DatasetSplits", "load_dataset", "take"]

DATASETS: Registry[Callable[..., DatasetSplits]] = Registry("dataset")


def load_dataset(name: str, *, seed: int = 0, **options: object) -> DatasetSplits:
    """Load a registered dataset; unknown names raise ValueError listing the registered ones, unknown
    options one listing the options the dataset takes."""
    loader = DATASETS.get(name)
    check_options("dataset", name, loader, options, implicit=("seed",))
    return loader(seed=seed, **options)


# --- the catalog -----------------------------------------------------------------------------

DATASETS.register("digits", embedded_data.digits)
DATASETS.register("mnist5k", embedded_data.mnist5k)
for _name in hf_data.HF_SOURCES:
    DATASETS.register(_name, hf_data.loader(_name))
DATASETS.register("bbc_news", hf_data.bbc_news)
