"""`dptune audit`: which configuration to audit, on how many workers, and where the result goes.

The configuration is a finished trial's (its ``config_json`` row in the store, and the experiment's
worker count) or a spec cell's (a grid entry of the planned cell). The run itself is
:func:`dptune.trainables.audit.run.run_audit`; on W > 1 workers it runs in W local processes joined
by a gloo process group (one machine). An audit of a store's trial is kept beside its store
(:meth:`~dptune.platform.store.layout.ExperimentPaths.save_audit`), where the report finds it.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
from typing import Callable

from ...errors import NotFound, UserError
from ..store.layout import ExperimentPaths
from ..store.results_store import ResultsStore
from ..sweep.trial_config import train_config

def stored_trial(paths: ExperimentPaths, trial_id: str) -> tuple[dict, int]:
    """(flat config, workers) of a trial in an experiment's store."""
    from ..sweep.driver import load_settings

    trials = ResultsStore(paths.store).table("trials")
    rows = trials[trials.trial_id == trial_id]
    if rows.empty:
        raise NotFound(f"--trial: no trial {trial_id!r} in {paths.store}")
    config = json.loads(rows.config_json.iloc[0])
    try:
        workers = load_settings(paths).resources.workers_for(config)
    except UserError:
        workers = 1   # a store without the sweep's settings: one worker
    return config, workers


def pack_mates(paths: ExperimentPaths, trial_id: str) -> list[dict]:
    """The flat configs of the other members of ``trial_id``'s pack (none for a trial trained alone):
    a pack member is audited in its pack, by the packed engine that trained it."""
    pack, _, k = trial_id.rpartition("-m")
    if not pack or not k.isdigit():
        return []
    trials = ResultsStore(paths.store).table("trials")
    mates = trials[trials.trial_id.str.startswith(f"{pack}-m") & (trials.trial_id != trial_id)]
    return [json.loads(c) for c in mates.sort_values("trial_id").config_json]


def cell_trial(spec_path: str, cell_key: str | None, index: int) -> tuple[dict, int]:
    """(flat config, workers) of grid entry ``index`` of a spec's cell (default: the first private cell)."""
    from ...search_spaces import load_spec, plan_sweep
    from ..sweep import spec_sections  # noqa: F401  (registers the platform's spec sections)
    from ..sweep.catalog import trainables_catalog

    spec = load_spec(spec_path, trainables_catalog())
    plan = plan_sweep(spec, trainables_catalog(), progress=False)
    cells = [c for c in plan if c.cell.private and c.grid]
    keys = [c.cell.key for c in cells]
    if not cells:
        raise UserError(f"{spec_path}: no private cell with a configuration to audit")
    if cell_key is not None and cell_key not in keys:
        raise UserError(f"--cell must be one of {', '.join(keys)}; got {cell_key!r}")
    cell = cells[keys.index(cell_key)] if cell_key else cells[0]
    if not 0 <= index < len(cell.grid):
        raise UserError(f"--config must be in 0 … {len(cell.grid) - 1} (the cell's (C, B, η) grid); got {index}")
    config = cell.trial_config(*cell.grid[index], cell.space.seeds[0])
    return config, spec["resources"].workers_for(config)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, size: int, port: int, config: dict, pack_with: list[dict], options: dict, out: str) -> None:
    import torch.distributed as dist

    from ...trainables.audit.run import run_audit
    from ...trainables.engine.distributed import ProcessGroupWorkers

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        result = run_audit(train_config(config), workers=ProcessGroupWorkers(),
                           pack_with=[train_config(c) for c in pack_with], **options)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(result.to_dict(), f)
    finally:
        dist.destroy_process_group()


def audit(config: dict, *, workers: int = 1, progress: Callable[[int], None] | None = None,
          pack_with: list[dict] = (), **options: object) -> dict:
    """Audit a flat trial config on ``workers`` local processes, alone or in its pack (with the flat
    configs of ``pack_with``); the result as a dict (:meth:`~dptune.trainables.audit.run.AuditResult.to_dict`).
    ``options``: :func:`run_audit`'s."""
    from ...trainables.audit.run import run_audit

    if workers <= 1:
        return {**run_audit(train_config(config), progress=progress, pack_with=[train_config(c) for c in pack_with],
                            **options).to_dict(), "workers": 1}
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "audit.json")
        mp.spawn(_worker, args=(workers, _free_port(), config, list(pack_with), options, out), nprocs=workers)
        with open(out) as f:
            return {**json.load(f), "workers": workers}

