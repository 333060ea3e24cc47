"""Headless Chromium for the report tests: where it is, and one run of it on a page, in a profile and
home of the test's own (no network, no updates, no first-run pages)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def run_headless(folder: Path, page: Path, *flags: str) -> subprocess.CompletedProcess:
    """Chromium on ``page`` with ``flags`` (e.g. ``--screenshot=…``, ``--dump-dom``); its profile and
    home under ``folder``; fails if the browser does."""
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run",
                           f"--user-data-dir={folder / 'profile'}", *flags, page.as_uri()],
                          check=True, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(folder)})


NO_BROWSER = "no headless browser: install chromium (apt-get install chromium)"
