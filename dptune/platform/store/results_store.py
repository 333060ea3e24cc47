"""The results store: a Parquet dataset per experiment, queried through DuckDB views.

Layout under ``<storage>/<experiment>/store/`` (see :mod:`dptune.platform.store.layout`): one folder per table (``trials``, ``epochs``,
``gradnorms``). Each finished or errored trial writes one ``trial-<id>.<schema tag>.parquet`` file per
table — written to a hidden temporary name and renamed (on an object store: serialised in full, then
uploaded as one object, which appears only once complete), so a reader never sees half a file, and keyed by
trial id, so a resumed trial replaces its rows instead of duplicating them (a rewrite with another
schema leaves a second file, and the views keep the newer). The tag names the file's schema: files
of one schema are scanned together as they are, without unifying schemas file by file. ``compact`` merges the
small files into ``part-*.parquet`` files (keeping the newest version of each trial). The views
read every file and keep each configuration's rows from its newest file: a resumed trial's new
loose file over an older part, a trial Ray Tune restarted under a new id over the errored one, one
of two parts left holding the same trial by a compaction that was killed.

A file that cannot be read (truncated, overwritten, a disk error) does not stop the store: the
query or compaction that meets it moves it to ``quarantine/<table>/`` with one warning line naming
it and goes on; ``dptune resume`` records its trial again from the trial's checkpoint.

``gradnorms`` holds per-class gradient-norm statistics computed from private training examples:
they are **not** differentially private (column ``nonprivate`` is always true). The view ``figures``
says, for every figure a trial reports (the columns of ``trials`` and ``epochs`` named for them), whether
it is public, private or non-private, and why: the trial schema's declarations (:mod:`dptune.schema.figures`).

Queries are read-only and see the store and nothing else (a store is often shared: NFS, S3, a
team's dashboard): one SELECT statement per query, or an EXPLAIN [ANALYZE] of one (checked on the
statement it explains: ``EXPLAIN ANALYZE`` runs it); DuckDB runs with external access off, only the
store's folder reachable (a remote store's files are read by pyarrow and handed to DuckDB as Arrow
tables, so nothing is reachable), no spilling to disk, bounded memory, threads and time
(:class:`QueryLimits`), and its configuration locked, so COPY … TO, ATTACH, INSTALL/LOAD, SET and
reading any file outside the store fail with one line.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Sequence, TypeVar

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ...errors import UserError
from ...schema import FIGURES, METRICS, SCORE
from ..faults import fault_point
from .durable import write_bytes
from .layout import filesystem
from .query_limits import QueryLimits

TABLES = ("trials", "epochs", "gradnorms")
T = TypeVar("T")
LOOSE, PART = "trial-", "part-"
#: Where unreadable files are moved (``quarantine/<table>/<file>``): kept for inspection, out of every read.
QUARANTINE = "quarantine"
#: A file name in a reader's error message (DuckDB quotes the path it failed on).
NAMED_FILE = re.compile(r"['\"]([^'\"]+\.parquet)['\"]")
#: A per-trial file's name: ``trial-<trial id>.<schema tag>.parquet`` (see :func:`schema_tag`).
TAGGED = re.compile(r"^trial-.+\.(s[0-9a-f]{12})\.parquet$")
#: The statements a query may be: reading, never writing, attaching, loading or configuring.
READ_ONLY_STATEMENTS = frozenset({duckdb.StatementType.SELECT})
#: What may precede the statement an EXPLAIN shows: the keyword, ANALYZE, an option list.
EXPLAIN_PREFIX = re.compile(r"\s*EXPLAIN(\s+ANALY[SZ]E)?(\s*\([^()]*\))?\s", re.IGNORECASE)
#: Each configuration's rows from its newest file (ties: the last file name), over rows with a
#: ``filename``. A configuration is its ``config_id`` (rows without one: their trial id), so a trial
#: Ray Tune restarted under a new id, or ran twice, replaces the rows of the earlier one. A store
#: written before config ids existed (no file has the column) is read by trial id.
NEWEST_FILE = "QUALIFY dense_rank() OVER (PARTITION BY {key} ORDER BY written_at DESC, filename DESC) = 1"
KEYS = ("coalesce(config_id, trial_id)", "trial_id")


#: How many files of a remote store are fetched at once when it is queried or compacted.
READ_THREADS = 16

#: The most ``part-*`` files a table keeps: a compaction of the per-trial files that finds this many
#: merges them all into one.
MAX_PARTS = 8

#: How long a write to an object store is retried (with backoff) before :class:`StoreWriteError`.
WRITE_RETRY_S = 60.0


class StoreWriteError(UserError, OSError):
    """A store write that failed for good (one line: the store, the file, the reason); nothing of it
    was published."""


class QueryRefused(UserError):
    """A query that would do more than read the store (one line, naming what was refused)."""


def _sanitize(value: object) -> object:
    """Parquet-friendly scalars: ±inf floats become None (JSON and SQL have no infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class ResultsStore:
    """Read and write one experiment's results (local path, NFS, or ``s3://…``)."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self.fs, self.path = filesystem(self.root)
        self.write_retry_s = WRITE_RETRY_S
        for table in TABLES:
            self.fs.create_dir(f"{self.path}/{table}", recursive=True)

    # -- writing ---------------------------------------------------------------------------
    def write_trial(self, trial: dict, epochs: Sequence[dict] = (), gradnorms: Sequence[dict] = ()) -> None:
        """Write (or replace) one trial's rows in all three tables; the trials row goes last. Rows
        carry the trial's ``config_id`` (when it has one): the views show one trial per configuration."""
        trial_id, config = str(trial["trial_id"]), trial.get("config_id")
        keys = {"trial_id": trial_id, "config_id": None if config is None else str(config), "written_at": time.time()}
        for table, rows in (("epochs", epochs), ("gradnorms", gradnorms), ("trials", [trial])):
            rows = [{**{k: _sanitize(v) for k, v in r.items()}, **keys} for r in rows]
            if table == "gradnorms":
                rows = [{**r, "nonprivate": True} for r in rows]
            data = _arrow(rows)
            self._write_atomic(f"{self.path}/{table}/{LOOSE}{_safe(trial_id)}.{schema_tag(data.schema)}.parquet", data)

    def _write_atomic(self, final: str, table: pa.Table) -> None:
        """Publish a whole Parquet file atomically and durably (:func:`dptune.platform.store.durable.write_bytes`: a
        local file fsynced and renamed, an object uploaded in one PUT). The file is serialised
        completely in memory first: pyarrow's Parquet writer closes its sink when serialisation
        fails, and closing an object stream *publishes* what was written so far. A failed write
        (a store restarting, a network blip, a full disk) is retried with the same bytes, then
        raised as :class:`StoreWriteError`; nothing of it is published either way."""
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        data = sink.getvalue().to_pybytes()
        try:
            retrying(lambda: write_bytes(self.fs, final, data), self.write_retry_s)
        except OSError as exc:
            raise StoreWriteError(f"results store {self.root}: writing {final.rsplit('/', 1)[-1]} failed for "
                                  f"{self.write_retry_s:.0f} s ({first_line(exc)}); nothing of it was published: "
                                  "the sweep records it again once the store takes writes, and `dptune resume` "
                                  "records every ended trial the store lacks") from None

    def compact(self, *, loose_only: bool = False) -> dict[str, int]:
        """Merge every table's files into one part (newest version per configuration); returns the
        rows kept per table (-1: nothing to merge). ``loose_only`` merges only the per-trial files
        and leaves the parts as they are (the older versions they may hold stay hidden by the
        views), unless a table already holds ``MAX_PARTS`` parts: then all its files are merged.
        So a sweep's store never rewrites its whole history at every compaction, and a query
        reads at most ``MAX_PARTS`` parts plus the per-trial files written since the last one."""
        kept = {}
        for table in TABLES:
            files = self._files(table)
            loose = [f for f in files if f.base_name.startswith(LOOSE)]
            if loose_only and len(files) - len(loose) < MAX_PARTS:
                files = loose
            if len(files) <= 1:
                kept[table] = -1
                continue
            stamps = {f.path: (f.mtime_ns, f.size) for f in files}
            with duckdb.connect() as con:
                con.register("data", self._read_with_filename([f.path for f in files]))
                newest = _newest(con, "data", lambda sql: con.sql(sql).to_arrow_table())
            self._write_atomic(f"{self.path}/{table}/{PART}{uuid.uuid4().hex}.parquet", newest)
            for f in self.fs.get_file_info([f.path for f in files]):
                if (f.mtime_ns, f.size) == stamps[f.path]:  # rewritten meanwhile: keep the newer file
                    self.fs.delete_file(f.path)
                    fault_point("compact_deleted")
            kept[table] = newest.num_rows
        return kept

    def compact_every(self, loose: int) -> dict[str, int] | None:
        """The sweep's policy (the store callback calls it after each trial): once ``loose``
        per-trial files have accumulated, merge them (:meth:`compact` with ``loose_only``)."""
        return self.compact(loose_only=True) if self.loose_files("trials") >= loose else None

    # -- reading ---------------------------------------------------------------------------
    def _files(self, table: str, prefix: str | None = None) -> list[pafs.FileInfo]:
        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.path}/{table}", allow_not_found=True))
        return [i for i in infos if i.base_name.endswith(".parquet") and not i.base_name.startswith(".")
                and (prefix is None or i.base_name.startswith(prefix))]

    def loose_files(self, table: str) -> int:
        """How many per-trial files of ``table`` are waiting for compaction."""
        return len(self._files(table, LOOSE))

    def connect(self, limits: QueryLimits = QueryLimits()) -> duckdb.DuckDBPyConnection:
        """A locked-down DuckDB connection with the views ``trials``, ``epochs``, ``gradnorms`` and ``figures``:
        external access off, only the store's folder readable (a remote store: nothing, its data
        comes in as Arrow tables), extensions neither installed nor loaded, no temporary files,
        memory and threads bounded by ``limits``, configuration locked."""
        local = isinstance(self.fs, pafs.LocalFileSystem)
        con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
        con.execute("SET allowed_directories = ?", [[os.path.abspath(self.path) + os.sep] if local else []])
        con.execute("SET temp_directory = ''")
        con.execute(f"SET memory_limit = '{limits.memory}'")
        con.execute(f"SET threads = {int(limits.threads)}")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        for table in TABLES:
            paths = [self._reachable(f.path) for f in self._files(table)]
            source = (_parquet_sql(paths) if local else self._register(con, f"_{table}_files", paths))
            if source is None:
                con.execute(f"CREATE VIEW {table} AS SELECT NULL::VARCHAR AS trial_id, NULL::VARCHAR AS config_id, "
                            "NULL::DOUBLE AS written_at WHERE false")
                continue
            # each configuration's rows from its newest file: a rewritten or restarted trial's file over
            # an older one, one of two parts holding the same trial (a compaction killed before it
            # deleted what it merged)
            _newest(con, source, lambda sql, table=table: con.execute(f"CREATE VIEW {table} AS {sql}"))
        con.register("figures", pd.DataFrame([{"figure": f.name, "privacy": f.privacy, "reason": f.reason}
                                              for f in FIGURES]))
        return con

    def _reachable(self, path: str) -> str:
        """A local file's absolute path (what ``allowed_directories`` is checked against)."""
        return os.path.abspath(path) if isinstance(self.fs, pafs.LocalFileSystem) else path

    def query(self, sql: str, limits: QueryLimits = QueryLimits()) -> pd.DataFrame:
        """Run one read-only SQL statement over the views and return a pandas frame.

        Raises :class:`QueryRefused` (a ValueError with one line) for anything but a single
        SELECT (or EXPLAIN of one), for a statement that reaches outside the store, and for one
        that runs past ``limits`` (memory, time)."""
        check_read_only(sql)
        while True:
            try:
                return self._query(sql, limits)
            except (duckdb.InvalidInputException, duckdb.IOException) as exc:
                bad = self._unreadable(exc)
                if bad is None:
                    raise
                self.quarantine(bad, first_line(exc))

    def _query(self, sql: str, limits: QueryLimits) -> pd.DataFrame:
        with self.connect(limits) as con:
            timer = threading.Timer(limits.timeout_s, con.interrupt)
            timer.start()
            try:
                return con.execute(sql).df()
            except duckdb.InterruptException:
                raise QueryRefused(f"query stopped after {limits.timeout_s:g} s (its time limit; "
                                   "`dptune query --timeout` sets another)") from None
            except duckdb.OutOfMemoryException:
                raise QueryRefused(f"query needs more than its memory limit of {limits.memory} "
                                   "(`dptune query --memory` sets another)") from None
            except (duckdb.PermissionException, duckdb.InvalidInputException) as exc:
                first = str(exc).splitlines()[0]
                if isinstance(exc, duckdb.PermissionException) or "configuration has been locked" in first:
                    raise QueryRefused(f"refused: {first} (a query reads the views trials, epochs and gradnorms "
                                       f"of this store, and no other file)") from None
                raise
            finally:
                timer.cancel()

    def _unreadable(self, error: Exception) -> str | None:
        """The store file a reader's ``error`` is about, if it is one of this store's files and
        cannot be read; when the message names no file, each file is read to find it."""
        files = [f.path for table in TABLES for f in self._files(table)]
        named = NAMED_FILE.search(str(error))
        if named is not None:   # only that file, and only if pyarrow cannot read it either
            files = [f for f in files if f == named.group(1) or self._reachable(f) == os.path.abspath(named.group(1))]
        for path in files:
            try:
                pq.read_table(path, filesystem=self.fs)
            except (pa.ArrowException, OSError):
                return path
        return None

    def quarantine(self, path: str, reason: str) -> None:
        """Move an unreadable file out of its table to ``quarantine/<table>/``, with one warning line."""
        table, name = path.rsplit("/", 2)[-2:]
        folder = f"{self.path}/{QUARANTINE}/{table}"
        self.fs.create_dir(folder, recursive=True)
        try:
            self.fs.move(path, f"{folder}/{name}")
        except FileNotFoundError:  # another reader moved it first
            return
        print(f"dptune: warning: results-store file {table}/{name} is unreadable ({reason}); moved to "
              f"{QUARANTINE}/{table}/ (`dptune resume` records its trial again)", file=sys.stderr)

    def _register(self, con: duckdb.DuckDBPyConnection, name: str, paths: list[str]) -> str | None:
        if not paths:
            return None
        con.register(name, self._read_with_filename(paths))
        return name

    def _read_with_filename(self, paths: list[str]) -> pa.Table:
        """Files read by pyarrow as one table with a ``filename`` column (what read_parquet adds);
        an unreadable one is quarantined and left out. An object store answers each file in a round
        trip or two, so the files are fetched concurrently."""
        def read(path: str) -> pa.Table | None:
            try:
                return pq.read_table(path, filesystem=self.fs)
            except FileNotFoundError:
                raise
            except (pa.ArrowException, OSError) as exc:
                self.quarantine(path, first_line(exc))
                return None

        with ThreadPoolExecutor(max_workers=max(1, min(READ_THREADS, len(paths)))) as pool:
            tables = [(p, t) for p, t in zip(paths, pool.map(read, paths)) if t is not None]
        if not tables:
            return _arrow([]).append_column("filename", pa.array([], pa.string()))
        return pa.concat_tables([t.append_column("filename", pa.array([p] * t.num_rows, pa.string()))
                                 for p, t in tables], promote_options="permissive")

    def table(self, name: str) -> pd.DataFrame:
        """One whole view as a pandas frame (``trials``, ``epochs`` or ``gradnorms``)."""
        if name not in TABLES:
            raise UserError(f"table must be one of {', '.join(TABLES)}; got {name!r}")
        return self.query(f"SELECT * FROM {name}")


def selected_values(rows: pd.DataFrame) -> pd.DataFrame:
    """Per stored row (``trials`` or ``epochs``): ``value``, the metric it selected on (in the column
    its ``metric`` names; a store written before the signed score, or a row without ``metric``, kept
    it in ``accuracy``), ``sign`` (−1 where lower is better), its ``score`` (stored, or sign × value)
    and whether it is an ``accuracy``."""
    index = rows.index
    value = pd.to_numeric(rows["accuracy"], errors="coerce").astype(float) if "accuracy" in rows \
        else pd.Series(np.nan, index=index)
    metric = rows["metric"] if "metric" in rows else pd.Series(None, index=index, dtype=object)
    for name in set(metric.dropna()) & set(rows.columns):
        value = value.where(metric != name, pd.to_numeric(rows[name], errors="coerce"))
    mode = rows["metric_mode"] if "metric_mode" in rows else pd.Series(None, index=index, dtype=object)
    mode = mode.where(mode.notna(), metric.map(lambda m: METRICS[m].mode if m in METRICS else None))
    sign = pd.Series(np.where(mode.eq("min"), -1.0, 1.0), index=index)
    score = pd.to_numeric(rows[SCORE], errors="coerce").astype(float) if SCORE in rows \
        else pd.Series(np.nan, index=index)
    accuracy = metric.map(lambda m: METRICS[m].accuracy if m in METRICS else True) & (sign > 0)
    return pd.DataFrame({"value": value, "score": score.fillna(sign * value), "sign": sign,
                         "accuracy": accuracy.astype(bool)}, index=index)


def retrying(action: Callable[[], T], seconds: float) -> T:
    """``action()``, tried again with backoff (0.5 s, doubling up to 8 s) while it raises OSError,
    for at most ``seconds``; then its last error. What an object store's restart or a network
    blip needs: the same request, a little later. A missing file is not retried: gone is not
    unreachable."""
    delay, deadline = 0.5, time.monotonic() + seconds
    while True:
        try:
            return action()
        except FileNotFoundError:
            raise
        except OSError:
            if time.monotonic() + delay > deadline:
                raise
            fault_point("storage_retry")
            time.sleep(delay)
            delay = min(2 * delay, 8.0)


def first_line(error: BaseException) -> str:
    """An error's message in one line (its first), or its type when it has none."""
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _newest(con: duckdb.DuckDBPyConnection, source: str, run: Callable[[str], T]) -> T:
    """``run`` the SELECT of each configuration's newest rows of ``source``; by trial id when no
    file has a ``config_id`` column (the binder says so: no extra pass over the files)."""
    by_configuration, by_trial = (f"SELECT * EXCLUDE (filename) FROM {source} {NEWEST_FILE.format(key=key)}"
                                  for key in KEYS)
    try:
        return run(by_configuration)
    except duckdb.BinderException:
        return run(by_trial)


def check_read_only(sql: str) -> None:
    """Refuse, before anything runs, SQL that is not exactly one SELECT statement or an EXPLAIN
    [ANALYZE] of one (``EXPLAIN ANALYZE COPY …`` runs the COPY: the explained statement is checked)."""
    statement = _one_statement(sql)
    if statement.type == duckdb.StatementType.EXPLAIN:
        prefix = EXPLAIN_PREFIX.match(statement.query)
        if prefix is None:   # a comment before EXPLAIN, or options we do not read: not read as safe
            raise QueryRefused("refused: write EXPLAIN [ANALYZE] directly before the SELECT it explains "
                               "(no comment before it)")
        statement = _one_statement(statement.query[prefix.end():])
    kind = statement.type
    if kind not in READ_ONLY_STATEMENTS:
        name = "INSTALL/LOAD" if kind.name == "LOAD" else kind.name
        raise QueryRefused(f"refused: {name} statement: the results store is read-only; a query is one "
                           "SELECT (or EXPLAIN of one) over the views trials, epochs and gradnorms")


def _one_statement(sql: str) -> "duckdb.Statement":
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise UserError(f"query failed: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise QueryRefused(f"refused: give one SQL statement; got {len(statements)}")
    try:
        statements[0].type
    except ValueError:  # a statement type this DuckDB binding cannot name (e.g. UPDATE EXTENSIONS)
        raise QueryRefused("refused: not a SELECT statement (a query is one SELECT, or EXPLAIN of one, over "
                           "the views trials, epochs and gradnorms)") from None
    return statements[0]


def _arrow(rows: list[dict]) -> pa.Table:
    if rows:
        return pa.Table.from_pylist(rows)
    return pa.table({"trial_id": pa.array([], pa.string()), "config_id": pa.array([], pa.string()),
                     "written_at": pa.array([], pa.float64())})


def schema_tag(schema: pa.Schema) -> str:
    """``s`` and 12 hex digits naming a per-trial file's Arrow schema (its file name carries it): the
    files of one tag are read together without DuckDB's ``union_by_name``, which opens every file
    once more to unify schemas (a query over 10,000 loose files: ~1 s of footers)."""
    text = schema.remove_metadata().to_string(show_field_metadata=False)
    return "s" + hashlib.sha256(text.encode()).hexdigest()[:12]


def tag_of(name: str) -> str | None:
    """The schema tag of a per-trial file's name; None for parts and files written before tags."""
    match = TAGGED.match(name)
    return match.group(1) if match else None


def _safe(trial_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in trial_id)


def _parquet_sql(paths: Iterable[str]) -> str | None:
    """One scan over local files: the files of each schema tag read as they are, the others (parts,
    untagged files) with ``union_by_name``, all unioned by column name."""
    groups: dict[str | None, list[str]] = defaultdict(list)
    for path in paths:
        groups[tag_of(path.rsplit("/", 1)[-1])].append(path)
    if not groups:
        return None
    scans = []
    for tag, files in groups.items():
        quoted = ", ".join("'" + p.replace("'", "''") + "'" for p in files)
        scans.append(f"read_parquet([{quoted}], {'union_by_name=true, ' if tag is None else ''}filename=true)")
    if len(scans) == 1:
        return scans[0]
    return "(" + " UNION ALL BY NAME ".join(f"SELECT * FROM {scan}" for scan in scans) + ") AS files"


def to_json(value: object) -> str:
    """Serialise nested results (per-class lists, configs) for a Parquet string column."""
    return json.dumps(value, default=lambda v: None if isinstance(v, float) and not math.isfinite(v) else str(v))
