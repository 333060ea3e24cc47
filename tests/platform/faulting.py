"""Driving the sweep driver's fault points (dptune/platform/faults.py) from a test: kill or pause it
at a named point of its cycle, an explicit synchronisation point instead of a sleep."""
from __future__ import annotations

import os
import time
from pathlib import Path


def faulted_env(faults: str, folder: Path) -> dict:
    """The environment of a driver that stops at the named fault points (dptune/platform/faults.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "DPTUNE_FAULTS": faults, "DPTUNE_FAULT_DIR": str(folder)}


def await_pause(folder: Path, name: str, alive=lambda: True, timeout: float = 300) -> None:
    """Wait until a driver paused at ``name`` (``<point>@<k>``): an explicit synchronisation point
    (the timeout only bounds a hang); fails when ``alive()`` says the driver ended first."""
    deadline = time.monotonic() + timeout
    while not (folder / f"{name}.paused").exists():
        assert alive(), f"the driver ended before it reached {name}"
        assert time.monotonic() < deadline, f"the driver never reached {name}"
        time.sleep(0.05)


def resume_from_pause(folder: Path, name: str) -> None:
    (folder / f"{name}.go").touch()
