"""Session-wide test settings: a private, empty accounting cache (whatever ``DPTUNE_CACHE_DIR`` the
user has set), so tests never read a stale one nor write into a user's; Ray on the loopback address
only (multi-node test clusters included)."""
import os
import tempfile

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray is imported: nodes use 127.0.0.1

os.environ["DPTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="dptune-test-cache-")


def pytest_collection_modifyitems(config, items):
    """Test files of end-to-end runs (marked ``slow``) first, every file's tests in their own order:
    the README runs the suite in two workers, a file whole in one (``--dist loadfile
    --no-loadscope-reorder`` keeps this order), so the long files start first and the short ones
    fill in at the end, instead of one worker running a long file alone while the other waits."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)   # stable: files stay whole and in order
