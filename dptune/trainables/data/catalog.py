"""The dataset catalog: one interface for every source, ``load_dataset(name, seed=…, **options)``.

It returns a :class:`DatasetSplits`: train and test ``torch.utils.data.Dataset``s, the number of
classes, class names and the input shape. Loaders live in their own modules: the sets shipped in
wheels (``embedded``: digits, mnist5k) and the public sets of "On optimal hyperparameters for
DP deep transfer learning" through HF ``datasets`` plus the embedded BBC News (``hf``); their
names and size counters are registered lazily in :mod:`dptune.trainables.registries`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import UserError
from ...registry import check_options
from ..registries import DATASETS, TRAIN_SIZES

if TYPE_CHECKING:  # this module imports no torch: sizing a dataset for a plan does not need it
    from .splits import DatasetSplits

__all__ = ["DATASETS", "load_dataset", "train_size"]


def load_dataset(name: str, *, seed: int = 0, **options: object) -> DatasetSplits:
    """Load a registered dataset; unknown names raise ValueError listing the registered ones, unknown
    options one listing the options the dataset takes."""
    loader = DATASETS.get(name)
    check_options("dataset", name, loader, options, implicit=("seed",))
    return loader(seed=seed, **options)


def train_size(name: str, **options: object) -> int:
    """Training-set size N of a registered dataset (what the trainer sees), from metadata when the
    dataset can be counted without decoding it (a wheel's data file, Arrow/Parquet row counts,
    folder listings); otherwise the data is loaded. Options a dataset does not take are refused."""
    if name not in DATASETS:
        DATASETS.get(name)   # raises: one line listing the registered names
    if options:   # the loader's signature: imports it (a bare name needs no check)
        check_options("dataset", name, DATASETS.get(name), options, implicit=("seed",))
    n = TRAIN_SIZES.get(name)(**options) if name in TRAIN_SIZES else None
    n = int(n) if n is not None else len(DATASETS.get(name)(seed=0, **options).train)
    if n < 1:
        raise UserError(f"dataset {name!r} has no training examples{_given_data(options)}: it needs some to train on "
                        "(and a test split held out of them)")
    return n


def _given_data(options: dict) -> str:
    return f" (data_dir {options['data_dir']})" if options.get("data_dir") else ""
