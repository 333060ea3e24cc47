"""Ray processes that a killed local session left behind, stopped before a new embedded Ray starts.

When the driver of an embedded local Ray is SIGKILLed (out of memory, ``kill -9``, a closed
terminal's process group aside), its GCS and raylet go with it, but the raylet's agent processes
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) are reparented to init and live on until the
next Ray start on the machine. A Ray process is always started by a raylet, so one whose parent
is no longer a raylet belongs to a session that is gone: :func:`stop_orphans` stops those of the
current user (SIGTERM, then SIGKILL after a grace period). Live sessions, including clusters
started with ``ray start`` (their raylet is alive, their agents its children), are never touched.
Linux only (it reads ``/proc``); elsewhere it does nothing.
"""
from __future__ import annotations

import os
import signal
import time

PROC = "/proc"
#: What a Ray worker or agent process calls itself (its process title).
RAY_TITLE = "ray::"


def _argv0(pid: int) -> str:
    with open(f"{PROC}/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0", 1)[0].decode(errors="replace")


def _state_and_parent(pid: int) -> tuple[str, int]:
    with open(f"{PROC}/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()   # after "(comm)": state, ppid, …
    return fields[0], int(fields[1])


def orphaned_ray_processes() -> list[int]:
    """PIDs of the current user's Ray processes (``ray::…``) with no raylet above them: the first
    ancestor that is not itself a ``ray::`` process (a worker's forked children, e.g. data loaders,
    keep its title) is not a raylet."""
    if not os.path.isdir(PROC):
        return []
    uid, found = os.getuid(), []
    for name in os.listdir(PROC):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            if os.stat(f"{PROC}/{pid}").st_uid != uid or not _argv0(pid).startswith(RAY_TITLE):
                continue
            state, parent = _state_and_parent(pid)
            if state == "Z":   # already dead, waiting for its parent to reap it
                continue
            while parent > 1 and _argv0(parent).startswith(RAY_TITLE):   # a process a Ray worker forked
                parent = _state_and_parent(parent)[1]                     # (it keeps the worker's title)
            if os.path.basename(_argv0(parent)) == "raylet":
                continue
        except (OSError, ValueError, IndexError):   # gone meanwhile, or not ours to read
            continue
        found.append(pid)
    return found


def stop_orphans(grace_s: float = 5.0) -> list[int]:
    """Stop :func:`orphaned_ray_processes` (SIGTERM, then SIGKILL after ``grace_s``); their PIDs."""
    pids = orphaned_ray_processes()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in pids if _running(pid)]
        for pid in alive:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        while sig == signal.SIGTERM and alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [pid for pid in alive if _running(pid)]
    return pids


def _running(pid: int) -> bool:
    try:
        return _state_and_parent(pid)[0] != "Z"
    except (OSError, ValueError, IndexError):
        return False
