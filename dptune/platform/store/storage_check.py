"""Refuse, in one line and before σ calibration or Ray start, a storage that cannot take the sweep:
an unreachable endpoint, a missing bucket, a folder without write permission."""
from __future__ import annotations

import uuid

import pyarrow as pa

from ...errors import UserError
from .durable import write_bytes
from .layout import filesystem
from .results_store import first_line


def check_storage(storage: str) -> None:
    """Write and delete a small probe file under ``storage`` (created if missing); a
    :class:`UserError` naming the storage and the reason when that fails."""
    try:
        fs, root = filesystem(storage)
        fs.create_dir(root, recursive=True)
        probe = f"{root.rstrip('/')}/.dptune-write-check-{uuid.uuid4().hex}"
        write_bytes(fs, probe, b"dptune")
        fs.delete_file(probe)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise UserError(f"storage {storage} cannot take the sweep's files ({first_line(exc)}): check the path, "
                        "bucket, endpoint (AWS_ENDPOINT_URL) and credentials, or pass --storage") from None

