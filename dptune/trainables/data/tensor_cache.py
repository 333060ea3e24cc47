"""Named tensors kept on disk under ``$DPTUNE_CACHE_DIR/<folder>/<key>.pt``, shared by every process
of a machine (Ray workers included).

Work a trial would otherwise repeat in every fresh process (a frozen backbone's features, an embedded
data set's decoded and split tensors) is computed once per key: one process computes while the
others wait on a file lock, then read. A file is written whole (to a temporary name, fsync'd, then
renamed), so a reader sees all of it or nothing; a torn or unreadable file is computed again.
``DPTUNE_CACHE_DIR=off`` disables the disk level (everything is computed).
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Callable

import torch

from ...privacy.cache import cache_dir

Tensors = dict[str, torch.Tensor]


def _load(path: Path) -> Tensors | None:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError):   # absent, or a torn file from a crash: compute again
        return None


def _store(path: Path, tensors: Tensors) -> None:
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(buffer.getvalue())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)   # readers see the whole file or none


def cached_tensors(folder: str, key: str, compute: Callable[[], Tensors],
                   complete: Callable[[Tensors], bool] = lambda tensors: True) -> tuple[Tensors, str]:
    """The tensors stored under ``key`` ("disk"), or ``compute()``'s, stored for the next process
    ("computed"); a stored entry that is not ``complete`` is computed again."""
    directory = cache_dir()
    if directory is None:
        return compute(), "computed"
    from filelock import FileLock

    path = directory / folder / f"{key}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        tensors = _load(path)
        if tensors is not None and complete(tensors):
            return tensors, "disk"
        tensors = compute()
        _store(path, tensors)
    return tensors, "computed"
