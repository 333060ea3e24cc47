"""Session-wide test settings: a private, empty accounting cache (whatever ``DPTUNE_CACHE_DIR`` the
user has set), so tests never read a stale one nor write into a user's; Ray on the loopback address
only (multi-node test clusters included)."""
import atexit
import os
import shutil
import tempfile

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray is imported: nodes use 127.0.0.1

os.environ["DPTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="dptune-test-cache-")
# removed when this test process ends: each run (and each xdist worker) left ~0.5 GB in the temp folder
atexit.register(shutil.rmtree, os.environ["DPTUNE_CACHE_DIR"], ignore_errors=True)
