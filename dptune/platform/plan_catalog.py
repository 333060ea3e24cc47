"""The trainables catalog for ``dptune plan``, from a snapshot on disk when one matches this build.

Building the catalog (:func:`.catalog.trainables_catalog`) imports torch, timm and transformers
(the registries of models and datasets live with their code) and loads every dataset whose size
N the plan needs. A plan needs only names and sizes, so the first plan writes them to
``<cache dir>/catalog-<fingerprint>.json`` and later plans of the same build read them back
without importing torch. The fingerprint covers dptune's version, the size and modification time
of every trainables source file and of the catalog module, and the environment variables that
say where datasets are read from (``DPTUNE_DATA_DIR``, ``HF_HOME``, ``HF_DATASETS_CACHE``); a
dataset whose size is not in the snapshot is loaded (with torch) and added.

Only planning uses this: ``dptune sweep`` always builds the real catalog and reads N from the
data, so a stale size could change what ``dptune plan`` prints, never what a trial runs.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Collection

import dptune

from ..privacy.cache import cache_dir
from ..registry import Registry
from ..search_spaces.spec import Catalog

#: Environment variables that change where (and so which) data a dataset loader reads.
DATA_ENV = ("DPTUNE_DATA_DIR", "HF_HOME", "HF_DATASETS_CACHE")
SNAPSHOT_VERSION = 1


def fingerprint() -> str:
    """A hash of what the catalog's content depends on (source files, version, data locations)."""
    package = Path(dptune.__file__).parent
    sources = sorted((package / "trainables").glob("*.py")) + [package / "platform" / "catalog.py"]
    h = hashlib.sha256(f"{SNAPSHOT_VERSION}:{dptune.__version__}".encode())
    for path in sources:
        st = path.stat()
        h.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    for name in DATA_ENV:
        h.update(f"{name}={os.environ.get(name, '')};".encode())
    return h.hexdigest()[:24]


def _names(values: Collection[object]) -> dict:
    families = list(values.families()) if isinstance(values, Registry) else []
    return {"names": list(values), "families": families, "kind": getattr(values, "kind", None)}


def _collection(entry: dict) -> Collection[object]:
    """Names back as a tuple, or as a names-only Registry when the original had families
    (``timm:<name>``) so that membership of a family member still holds."""
    if not entry["families"]:
        return tuple(entry["names"])
    registry: Registry[object] = Registry(entry["kind"] or "name")
    for name in entry["names"]:
        registry.register(name, name)
    for prefix in entry["families"]:
        registry.register_family(prefix, _family_member)
    return registry


def _family_member(rest: str, *args: object, **kwargs: object) -> str:
    return rest


class _SnapshotSizes:
    """``dataset_size`` of a snapshot: known sizes from it, the others loaded once and saved."""

    def __init__(self, sizes: dict[str, int], save: Callable[[dict[str, int]], None]) -> None:
        self.sizes, self._save = dict(sizes), save

    def __call__(self, name: str, **options: object) -> int:
        # a dataset's axis options (data_dir, max_length) are part of the key: data_dir changes N
        key = f"{name}{json.dumps(options, sort_keys=True, default=str)}" if options else name
        if key not in self.sizes:
            from .catalog import dataset_size  # loads the data (torch)

            self.sizes[key] = int(dataset_size(name, **options))
            self._save(self.sizes)
        return self.sizes[key]


def _snapshot_file() -> Path | None:
    directory = cache_dir()
    return None if directory is None else directory / f"catalog-{fingerprint()}.json"


def _write(path: Path, content: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".catalog-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(content, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache folder: the next plan builds the catalog again


class _RealCheck:
    """A backbone/dataset option check of the real catalog, imported (with torch) only when a spec
    gives an axis value options: bare names need no builder signatures."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, entry: str, options: dict) -> None:
        from . import catalog

        getattr(catalog, self.name)(entry, options)


def _from_snapshot(content: dict[str, Any], save: Callable[[dict[str, int]], None]) -> Catalog:
    return Catalog(datasets=_collection(content["datasets"]), backbones=_collection(content["backbones"]),
                   dataset_size=_SnapshotSizes(content["sizes"], save),
                   options={k: _collection(v) for k, v in content["options"].items()},
                   train_fields=tuple(content["train_fields"]) if content["train_fields"] is not None else None,
                   check_backbone=_RealCheck("check_backbone"), check_dataset=_RealCheck("check_dataset"))


def planning_catalog() -> Catalog:
    """The catalog ``dptune plan`` validates and plans with: the snapshot of this build when there
    is one (no torch), else the real catalog, snapshotted for the next plan."""
    path = _snapshot_file()
    content: dict[str, Any] | None = None
    if path is not None and path.is_file():
        try:
            content = json.loads(path.read_text())
        except (OSError, ValueError):
            content = None
    if content is None:
        from .catalog import trainables_catalog

        real = trainables_catalog()
        content = {"datasets": _names(real.datasets), "backbones": _names(real.backbones),
                   "options": {k: _names(v) for k, v in real.options.items()},
                   "train_fields": None if real.train_fields is None else list(real.train_fields), "sizes": {}}
        if path is not None:
            _write(path, content)

    def save(sizes: dict[str, int]) -> None:
        if path is not None:
            _write(path, {**content, "sizes": sizes})

    return _from_snapshot(content, save)
