"""Sweep plans for tests, built the way `dptune sweep` builds them (spec → catalog → plan_sweep)."""
from __future__ import annotations

from dptune.platform.sweep import spec_sections  # noqa: F401  (registers the platform's spec sections)
from dptune.platform.sweep.catalog import trainables_catalog
from dptune.search_spaces import Catalog, SweepPlan, load_spec, plan_sweep


#: Every lever named off (dptune turns unnamed ones on where they are safe: search_spaces/levers.py):
#: tests of other parts of a sweep run exactly the trials they list; the levers' own tests name what
#: they test, and tests/search_spaces/test_levers.py checks the defaults.
LEVERS_OFF = {"scheduler": "none", "proxy": "off", "transfer": "off", "pack": "off", "bracket": "off",
              "racing": "off"}


def levers_off(search: dict | None = None) -> dict:
    """A ``search`` section with every lever it does not name turned off."""
    return {**LEVERS_OFF, **(search or {})}


def plan_of(spec: dict, catalog: Catalog | None = None) -> SweepPlan:
    """The plan of a spec mapping, validated and planned by the production path (σ calibrated in
    this process, cached)."""
    catalog = catalog or trainables_catalog()
    return plan_sweep(load_spec(spec, catalog), catalog, workers=1)


def digits_spec(*, epsilon, batch_size, clip_bound=(1.0,), multipliers=(1.0,), epochs=1, model="mlp",
                model_options=None, seeds=(0,), trial=None, reference_lr=1.0, **sections) -> dict:
    """A spec over digits: one backbone (with its options), the given axes and grid, no pruning by
    steps (min_steps 1) and a wide plateau, so every listed batch size is searched."""
    backbone = {"name": model, **(model_options or {})}
    sizes = list(batch_size) if isinstance(batch_size, (list, tuple)) else [batch_size]
    return {"axes": {"epsilon": list(epsilon) if isinstance(epsilon, (list, tuple)) else [epsilon],
                     "backbone": [backbone], "dataset": ["digits"],
                     "epochs": list(epochs) if isinstance(epochs, (list, tuple)) else [epochs]},
            "clip_bound": list(clip_bound), "batch_size": sizes,
            "learning_rate": {"reference": reference_lr, "reference_batch_size": sizes[0],
                              "multipliers": list(multipliers)},
            "pruning": {"min_steps": 1, "plateau_tol": 100.0}, "seeds": list(seeds), "trial": dict(trial or {}),
            **sections, "search": levers_off(sections.get("search"))}
