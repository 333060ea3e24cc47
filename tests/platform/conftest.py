"""Fixtures of the platform tests: ``s3``, a real S3 server (SeaweedFS on 127.0.0.1; see s3_server.py)."""
from s3_server import s3  # noqa: F401  (pytest finds fixtures in a conftest's namespace)
