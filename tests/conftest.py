"""Session-wide test settings: a private, empty accounting cache (whatever ``DPTUNE_CACHE_DIR`` the
user has set), so tests never read a stale one nor write into a user's; Ray on the loopback address
only (multi-node test clusters included)."""
import os
import tempfile

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray is imported: nodes use 127.0.0.1

os.environ["DPTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="dptune-test-cache-")
