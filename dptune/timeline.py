"""Where a sweep's wall time goes: named moments of the driver and of every trial, for profiling.

Unless ``DPTUNE_TIMELINE`` names a file, :func:`mark` returns at once. With it, every process of a
sweep (the driver and each trial's worker) appends one JSON line per moment: the moment's name,
the wall-clock time, the process id and, the first time a process marks, when that process started
(so a worker's start-up shows). ``benchmarks/bench_timeline.py`` reads the file back into a
timeline: from `dptune sweep` to the first optimizer step, and each worker's first trial against its
training.
"""
from __future__ import annotations

import json
import os
import time

ENV = "DPTUNE_TIMELINE"
_started_marked = False


def mark(moment: str, **fields: object) -> None:
    """Append ``moment`` to the timeline file (a no-op unless ``DPTUNE_TIMELINE`` is set)."""
    path = os.environ.get(ENV)
    if not path:
        return
    global _started_marked
    record = {"moment": moment, "time": time.time(), "pid": os.getpid(), **fields}
    if not _started_marked:
        _started_marked = True
        try:
            import psutil   # a dependency of Ray

            record["process_started"] = psutil.Process().create_time()
        except ImportError:
            pass
    with open(path, "a") as f:   # one short line per write: appends from several processes stay whole
        f.write(json.dumps(record) + "\n")
