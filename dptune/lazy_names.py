"""Public names of a package imported on first use (PEP 562), so that importing the package, or a
light module of it, does not import what implements them (torch, scipy, DuckDB)::

    __getattr__ = lazy_names(__name__, {"DPEngine": ".engine.dp_engine"})

Standard library only.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_names(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each of ``names`` (public name → the module that
    defines it, relative to ``package``) imported on first use and kept in the package; any other name
    an AttributeError (so ``from package import submodule`` still imports the submodule)."""
    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name], package), name)
        setattr(sys.modules[package], name, value)
        return value
    return __getattr__
