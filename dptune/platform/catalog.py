"""What this build can train, for validating sweep specs (the bridge from trainables to search_spaces)."""
from __future__ import annotations

import dataclasses
import functools

from ..search_spaces import Catalog
from ..trainables.clip_factors import CLIP_FNS
from ..trainables.config import TrainConfig
from ..trainables.data import DATASETS, load_dataset
from ..trainables.engine import DENOISERS, NORM_ENGINES
from ..trainables.models import MODELS
from ..trainables.optimizers import OPTIMIZERS


@functools.lru_cache(maxsize=None)
def dataset_size(name: str) -> int:
    """Training-set size N of a registered dataset (what the trainer will see)."""
    return len(load_dataset(name).train)


def trainables_catalog() -> Catalog:
    """The registered datasets (with their sizes) and backbones, the trainer's config fields and
    its option values."""
    return Catalog(datasets=tuple(DATASETS), backbones=tuple(MODELS), dataset_size=dataset_size,
                   options={"optimizer": OPTIMIZERS, "clip_fn": tuple(CLIP_FNS),
                            "norm_estimator": tuple(NORM_ENGINES), "denoise": (None, *DENOISERS)},
                   train_fields=tuple(f.name for f in dataclasses.fields(TrainConfig)))
