"""Session-wide test settings: a private accounting cache, so tests never read a stale one, and
Ray on the loopback address only (multi-node test clusters included)."""
import os
import tempfile

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray is imported: nodes use 127.0.0.1

os.environ.setdefault("DPTUNE_CACHE_DIR", tempfile.mkdtemp(prefix="dptune-test-cache-"))
