"""Two-level cache for accountant results: a dict in memory and a SQLite file on disk.

Calibrating σ costs a fraction of a second to seconds and a sweep asks for the same values again
and again (every trial, every epoch, every `dptune plan`), so results are kept keyed by their
exact inputs and the accounting version. The disk file is shared by all processes on a machine
(Ray workers included); SQLite makes concurrent writers safe. The location is
``$DPTUNE_CACHE_DIR`` or ``~/.cache/dptune``; set ``DPTUNE_CACHE_DIR=off`` to disable the disk level.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import warnings
from pathlib import Path
from typing import Callable

#: Bump when an accounting change alters results, so stale disk entries are never reused.
ACCOUNTING_VERSION = "prv-2"

_memory: dict[str, float] = {}
_lock = threading.Lock()
_warned = False


def cache_dir() -> Path | None:
    """The on-disk cache directory, or None when disabled."""
    value = os.environ.get("DPTUNE_CACHE_DIR", "")
    if value.lower() == "off":
        return None
    return Path(value) if value else Path.home() / ".cache" / "dptune"


def _connect() -> sqlite3.Connection | None:
    global _warned
    directory = cache_dir()
    if directory is None:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(directory / "accounting.sqlite", timeout=30)
        conn.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, value REAL NOT NULL)")
        return conn
    except (OSError, sqlite3.Error) as exc:  # read-only home, full disk: fall back to memory
        if not _warned:
            warnings.warn(f"dptune: accounting cache on disk disabled ({exc})", stacklevel=3)
            _warned = True
        return None


def make_key(kind: str, **inputs: object) -> str:
    """A canonical key: the kind, the accounting version and the inputs (floats as repr)."""
    return json.dumps({"kind": kind, "version": ACCOUNTING_VERSION, **inputs}, sort_keys=True)


def cached(key: str, compute: Callable[[], float]) -> float:
    """Return the cached value for ``key`` or compute, store and return it."""
    with _lock:
        if key in _memory:
            return _memory[key]
    conn = _connect()
    if conn is not None:
        with conn:
            row = conn.execute("SELECT value FROM results WHERE key = ?", (key,)).fetchone()
        if row is not None:
            conn.close()
            with _lock:
                _memory[key] = row[0]
            return row[0]
    value = float(compute())
    with _lock:
        _memory[key] = value
    if conn is not None:
        try:
            with conn:
                conn.execute("INSERT OR REPLACE INTO results VALUES (?, ?)", (key, value))
        except sqlite3.Error:
            pass  # another process holds the lock too long: the value is still correct in memory
        conn.close()
    return value


def clear_memory() -> None:
    """Forget the in-memory level (tests and benchmarks use it to measure the disk level)."""
    with _lock:
        _memory.clear()
