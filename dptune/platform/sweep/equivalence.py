"""Store rows of clip-equivalent trials (recorded, not trained).

The :class:`~dptune.platform.sweep.searcher.SweepSearcher` decides, from the ``fully_clipped`` flag of a finished trial,
that the smaller C of its (B, η, seed) would follow the same trajectory (see
``SweepSearcher.chained``). It hands the list of such trials to an :class:`EquivalenceLog`, which
keeps it beside the experiment; when the sweep (or its resume) ends, :func:`write_equivalent_rows`
stores each of them as a copy of its source trial's rows with its own C, status ``equivalent``,
``equivalent_to`` the source's trial id, and ``clip_equivalence_nonprivate`` true: the decision
read private per-sample gradient norms, so it is not differentially private.
"""
from __future__ import annotations

import pandas as pd

from ..store.durable import read_json, write_json
from .kept import config_id
from ..store.layout import EQUIVALENT_FILE, OLD_EQUIVALENT_FILE, ExperimentPaths
from ..store.results_store import ResultsStore, to_json
from .trial_config import resolved
from ...schema import CLIP_BOUND

class EquivalenceLog:
    """Keeps the searcher's equivalent trials (``{"source": Ray trial id, "config": trial config}``)
    in ``<experiment>/dptune-state/equivalent.json`` (picklable)."""

    def __init__(self, paths: ExperimentPaths) -> None:
        self.paths = paths

    def __call__(self, equivalents: list[dict]) -> None:
        write_json(*self.paths.state_file(EQUIVALENT_FILE), equivalents, default=str)

    def read(self) -> list[dict]:
        """The log (an experiment of an earlier version: its log at the root)."""
        fs, root = self.paths.filesystem()
        for name in (EQUIVALENT_FILE, OLD_EQUIVALENT_FILE):
            found = read_json(fs, f"{root}/{name}", "the clip-equivalence log")
            if found is not None:
                return found
        return []


def equivalent_id(source: str, clip_bound: float) -> str:
    return f"{source}-C{clip_bound:g}"


def write_equivalent_rows(paths: ExperimentPaths) -> int:
    """Store every logged equivalent trial whose source trial is in the store; returns how many."""
    equivalents = EquivalenceLog(paths).read()
    if not equivalents:
        return 0
    store = ResultsStore(paths.store)
    trials = store.table("trials").set_index("trial_id")
    epochs = store.table("epochs")
    written = 0
    for e in equivalents:
        source, config = e["source"], e["config"]
        if source not in trials.index or trials.loc[source, "status"] not in ("finished", "proxy"):
            continue
        c = float(config[CLIP_BOUND])
        row = {k: _plain(v) for k, v in trials.loc[source].items() if k != "written_at"}
        status = "equivalent" if row["status"] == "finished" else row["status"]   # a proxy's stays a proxy
        row.update(trial_id=equivalent_id(source, c), status=status, clip_bound=c, equivalent_to=source,
                   clip_equivalence_nonprivate=True, config_json=to_json(resolved(config)),
                   config_id=config_id(config))  # its own configuration, not its source's
        curve = [{k: _plain(v) for k, v in r.items() if k not in ("trial_id", "written_at")}
                 for r in epochs[epochs.trial_id == source].to_dict("records")]
        store.write_trial(row, curve)
        written += 1
    return written


def _plain(value: object) -> object:
    """numpy scalars and arrays from a frame back to Python values (NaN, NaT and pandas' NA of a
    nullable column, e.g. a full-scale run's ``proxy_divisor`` beside proxies → None)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and value != value:
        return None
    return None if value is pd.NaT or value is pd.NA else value
