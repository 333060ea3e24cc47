"""Where an experiment's files live: the one storage layout, for local paths, NFS and URIs.

```
<storage>/                       the spec's ``storage`` (local path, NFS mount, s3://…, gs://…, file://…)
  <experiment>/                  the experiment root: Ray Tune's experiment state (``dptune resume`` takes it)
    dptune_settings.json         the run settings, so ``resume`` uses the same resources
    dptune_plan.json             the plan the sweep ran (pruning rules, each cell's batch sizes), for the report
    store/                       the Parquet results store (``dptune query --store`` takes it or the root)
    analysis/                    heatmaps and report of a local experiment
    audits/                      `dptune audit` results of its trials (<trial id>.json), for the report
    workers/                     Ray Train's runs of multi-worker trials (resources.workers > 1)
```

Every rule about these paths lives here: what a URI is, how the folders are named, which
filesystem reads them, and how a ``--store`` argument is resolved. Imports neither Ray nor torch
(the analysis side uses it).
"""
from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass, replace

import pyarrow.fs as pafs

from ...errors import NotFound
from .durable import read_file, read_json, write_json

#: The embedded default sweep: what `dptune sweep` runs and `dptune plan` plans without a SPEC.
DEFAULT_SPEC = os.path.join(os.path.dirname(os.path.dirname(__file__)), "specs", "default.yaml")
#: The spec's default ``storage`` and its default ``experiment`` name.
DEFAULT_STORAGE = "./dptune-results"
DEFAULT_EXPERIMENT = "default"
#: Folder and file names inside an experiment root.
STORE, ANALYSIS, SETTINGS_FILE, PLAN_FILE = "store", "analysis", "dptune_settings.json", "dptune_plan.json"
#: What the sweep's driver keeps as it runs, in a folder of its own: Ray Tune copies the experiment
#: root's .json and .pkl files to its staging folder when it restores an experiment and uploads them
#: back at every snapshot, so a file there written after a resume would be put back as it was before.
STATE = "dptune-state"
#: The running trials of a live sweep (``live_status.LiveStatus`` writes it, ``dptune status`` reads it).
LIVE_FILE = f"{STATE}/running.json"
#: Each cell's bracketing: what it added and whether its optimum ended inside (``sweep.bracket.Bracket``).
BRACKETING_FILE = f"{STATE}/bracketing.json"
#: The trials recorded as clip-equivalent, not trained (``sweep.equivalence.EquivalenceLog``); earlier
#: versions kept it at the root (read too).
EQUIVALENT_FILE, OLD_EQUIVALENT_FILE = f"{STATE}/equivalent.json", "dptune-equivalent.json"
AUDITS = "audits"
#: How Ray Tune names the searcher's saved state in the experiment folder (``searcher-state-<session>.pkl``).
SEARCHER_STATE = "searcher-state-"
#: Ray Train's runs of multi-worker trials (their checkpoints between worker restarts).
WORKER_RUNS = "workers"
#: Figures are written with local file APIs: those of a remote experiment go here.
REMOTE_ANALYSIS = "./dptune-analysis"


def added_trials(record: dict) -> int:
    """Trials a cell's bracketing record says the sweep added beyond its plan: bracketing's
    configurations once per seed, and racing's further seeds."""
    return int(record.get("added", 0)) * int(record.get("seeds", 1)) + int(record.get("racing", {}).get("added", 0))


def is_uri(path: str) -> bool:
    """True for ``s3://…``, ``gs://…``, ``file://…`` and other URIs; False for local and NFS paths."""
    return "://" in path


def absolute(path: str) -> str:
    """A local path made absolute (``~`` expanded), as Ray needs; a URI unchanged."""
    return path if is_uri(path) else os.path.abspath(os.path.expanduser(path))


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem that holds ``path`` and the path inside it.

    ``s3://…`` takes its credentials, region and endpoint from the standard AWS variables
    (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, and ``AWS_ENDPOINT_URL`` for
    MinIO and other on-prem stores: ``http://host:port`` selects plain HTTP), read by pyarrow's
    ``FileSystem.from_uri`` itself, the same call Ray Tune makes for its ``storage_path``: dptune,
    Ray's experiment state and the trial workers thus reach the same store."""
    if is_uri(path):
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), path


def _join(parent: str, name: str) -> str:
    return f"{parent.rstrip('/')}/{name}"


@dataclass(frozen=True)
class ExperimentPaths:
    """One experiment's folders. ``ExperimentPaths(root)`` for the experiment root,
    :meth:`of` from (storage, experiment name), :meth:`find` from what a user passes to ``--store``.

    ``store`` is ``<root>/store`` unless given (a store folder passed on its own)."""

    root: str
    store: str = ""

    def __post_init__(self) -> None:
        root = self.root.rstrip("/") or "/"
        object.__setattr__(self, "root", root)
        object.__setattr__(self, "store", self.store.rstrip("/") if self.store else _join(root, STORE))

    @classmethod
    def of(cls, storage: str, experiment: str) -> "ExperimentPaths":
        """The experiment ``experiment`` under ``storage``."""
        return cls(_join(storage, experiment))

    @classmethod
    def find(cls, path: str) -> "ExperimentPaths":
        """Resolve a ``--store`` argument: an experiment root (a folder holding ``store/``) or a
        store folder itself. A local path must hold a store; a URI is taken as given."""
        path = path.rstrip("/") or "/"
        fs, inner = filesystem(path)
        if fs.get_file_info(_join(inner, STORE)).type == pafs.FileType.Directory:
            return cls(path)
        if not is_uri(path) and not os.path.isdir(os.path.join(path, "trials")):
            raise NotFound(f"no results store at {path!r} (expected a folder with trials/, epochs/, "
                                    "gradnorms/; run `dptune sweep` first or pass --store)")
        parent = path.rsplit("/", 1)[0] if "/" in path else "."
        return cls(parent if not is_uri(path) or is_uri(parent) else path, store=path)

    @property
    def name(self) -> str:
        """The experiment name (the root's last folder)."""
        return self.root.rsplit("/", 1)[-1]

    @property
    def is_uri(self) -> bool:
        return is_uri(self.root)

    @property
    def analysis(self) -> str:
        return _join(self.root, ANALYSIS)

    @property
    def settings(self) -> str:
        """The run settings the sweep writes for ``resume``."""
        return _join(self.root, SETTINGS_FILE)

    @property
    def plan(self) -> str:
        """The plan the sweep ran (its pruning rules and each cell's batch sizes), for the report."""
        return _join(self.root, PLAN_FILE)

    @property
    def live(self) -> str:
        """The running trials of the sweep, while it runs (``live_status``)."""
        return _join(self.root, LIVE_FILE)

    @property
    def bracketing(self) -> str:
        """Each cell's bracketing (the searcher writes it as it goes; the closing lines and report read it)."""
        return _join(self.root, BRACKETING_FILE)

    def state_file(self, name: str) -> tuple[pafs.FileSystem, str]:
        """(filesystem, path) of a file of the driver's state (``name``: one of the ``*_FILE`` above), its
        folder created."""
        fs, path = filesystem(_join(self.root, name))
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        return fs, path

    def save_bracketing(self, cells: dict) -> None:
        """Keep each cell's bracketing record (cell key → record)."""
        write_json(*self.state_file(BRACKETING_FILE), cells, indent=1)

    def saved_bracketing(self) -> dict:
        """Each cell's bracketing record, by cell key (none: empty; a damaged file is refused in one line)."""
        fs, path = filesystem(self.bracketing)
        return read_json(fs, path, "the bracketing record") or {}

    def saved_plan(self) -> dict | None:
        """The plan :func:`dptune.platform.sweep.driver.run_sweep` saved, or None (a store without one);
        a damaged one is refused in one line."""
        fs, path = filesystem(self.plan)
        return read_json(fs, path, "the sweep's plan")

    def searcher_state(self) -> dict | None:
        """The state of the sweep's searcher as Ray Tune last saved it beside the experiment (its
        newest ``searcher-state-*.pkl``, as Ray Tune restores it), or None; a damaged one is refused in
        one line. Unpickling it imports the searcher's classes: call it from the sweep."""
        fs, root = filesystem(self.root)
        found = sorted(info.path for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
                       if info.base_name.startswith(SEARCHER_STATE) and info.base_name.endswith(".pkl"))
        return read_file(fs, found[-1], pickle.loads, "the searcher's state") if found else None

    def save_audit(self, trial_id: str, result: dict) -> str:
        """Keep ``dptune audit``'s result for a trial of this experiment; returns the file's path."""
        fs, folder = filesystem(_join(self.root, AUDITS))
        fs.create_dir(folder, recursive=True)
        path = _join(folder, f"{trial_id}.json")
        write_json(fs, path, {"trial_id": trial_id, **result}, indent=1)
        return path

    def saved_audits(self) -> list[dict]:
        """The audits kept for this experiment's trials, by trial id (none: empty)."""
        fs, folder = filesystem(_join(self.root, AUDITS))
        found = []
        for info in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)):
            if info.path.endswith(".json"):
                with fs.open_input_stream(info.path) as f:
                    found.append(json.loads(f.read()))
        return sorted(found, key=lambda a: a["trial_id"])

    @property
    def figures(self) -> str:
        """Where heatmaps and the report go by default: ``<root>/analysis`` (absolute) for a local
        experiment, ``./dptune-analysis`` for a remote one."""
        return REMOTE_ANALYSIS if self.is_uri else absolute(self.analysis)

    def absolute(self) -> "ExperimentPaths":
        """The same folders with local paths made absolute (Ray needs them so)."""
        return replace(self, root=absolute(self.root), store=absolute(self.store))

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """The pyarrow filesystem of the experiment and the root's path inside it."""
        return filesystem(self.root)

    def create(self, *, owner_only: bool = False) -> None:
        """Create the experiment root. ``owner_only`` (a private-selection sweep, whose store holds
        every noisy score and K and is as private as the training data): a local root is made
        readable by its owner only (mode 0700, also when it exists), so nothing under it can be
        read by others; an object store's access is the bucket's policy (see the README)."""
        fs, root = self.filesystem()
        fs.create_dir(root, recursive=True)
        if owner_only and not self.is_uri:
            os.chmod(root, 0o700)
