"""Fixtures of the search-space tests: a small catalog (N = 200) whose calibrations are quick.

Tests share the session's accounting cache (tests/conftest.py points it at a temporary folder), so
the few (ε, q, T) used here are calibrated once per session.
"""
import pytest

from sweep_plans import levers_off

from dptune.trainables.config import check_option
from dptune.search_spaces import Catalog

TOY_N = 200


@pytest.fixture
def catalog() -> Catalog:
    return Catalog(datasets=("toy",), backbones=("mlp", "cnn"), dataset_size=lambda name: TOY_N,
                   check_trial_option=check_option, packable=("mlp", "cnn"))


def _toy_spec(**overrides) -> dict:
    """A valid spec mapping over the toy dataset; keyword arguments replace whole sections
    (None removes one)."""
    spec = {
        "axes": {"epsilon": [1, 4], "delta": 1e-5, "backbone": ["mlp"], "dataset": ["toy"], "epochs": [2]},
        "clip_bound": [0.1, 1, 10],
        "batch_size": [5, 10, 20, 40, 100, 400],       # T = 80, 40, 20, 10, 4; 400 > N
        "learning_rate": {"reference": 1.0, "reference_batch_size": 20, "multipliers": [0.5, 1, 2]},
        "pruning": {"min_steps": 5, "plateau_tol": 10.0},
        "search": levers_off(),
    }
    if overrides.get("search") is not None:
        overrides = {**overrides, "search": levers_off(overrides["search"])}
    spec.update(overrides)
    return {k: v for k, v in spec.items() if v is not None}


@pytest.fixture
def toy_spec():
    return _toy_spec
