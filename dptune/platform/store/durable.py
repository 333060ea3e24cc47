"""Writes that survive a crash or a power loss, and reads that refuse a damaged file in one line.

A local file is written to a temporary name in its folder, flushed and fsynced, renamed over the
final name and the folder fsynced: after a crash at any point the final name holds the old
content or the new, complete and on disk, never part of either. An object store's PUT is already
all-or-nothing (an object appears only once its upload completes), so a remote file is one
upload of the complete bytes. Every file of an experiment that a later run reads (the results
store's Parquet files, the run settings, the plan, the scheduler's state) is written here.
"""
from __future__ import annotations

import json
import os
import uuid
from typing import Callable, TypeVar

import pyarrow.fs as pafs

from ...errors import UserError
from ..faults import fault_point

T = TypeVar("T")


class DamagedFile(UserError):
    """A file of an experiment that exists but cannot be read (truncated, overwritten): one line,
    naming it."""


def write_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Publish ``data`` at ``path`` atomically and durably (see the module docstring)."""
    if not isinstance(fs, pafs.LocalFileSystem):
        with fs.open_output_stream(path) as out:
            out.write(data)
        return
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            fault_point("durable_written")
            f.flush()
            os.fsync(f.fileno())
        fault_point("durable_synced")
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    fault_point("durable_renamed")
    sync_folder(directory)


def sync_folder(directory: str) -> None:
    """fsync a local folder, so the renames and deletions in it are on disk."""
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(fs: pafs.FileSystem, path: str, value: object, **dumps: object) -> None:
    """:func:`write_bytes` of ``value`` as JSON."""
    write_bytes(fs, path, json.dumps(value, **dumps).encode())


def read_file(fs: pafs.FileSystem, path: str, parse: Callable[[bytes], T], what: str) -> T | None:
    """``parse`` of the file at ``path``; None when there is none; :class:`DamagedFile` (one line
    naming ``what`` and the file) when it cannot be parsed."""
    try:
        with fs.open_input_stream(path) as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        return parse(data)
    except Exception as exc:  # any parse failure of damaged bytes: json, pickle, unicode
        raise DamagedFile(f"{what} {path} is damaged and cannot be read ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}; {len(data)} bytes)") from None


def read_json(fs: pafs.FileSystem, path: str, what: str) -> object | None:
    """:func:`read_file` of a JSON file."""
    return read_file(fs, path, json.loads, what)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
