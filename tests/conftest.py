"""Session-wide test settings: a private accounting cache, so tests never read a stale one."""
import os
import tempfile

os.environ.setdefault("DPTUNE_CACHE_DIR", tempfile.mkdtemp(prefix="dptune-test-cache-"))
