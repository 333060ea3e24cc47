"""Read-only queries (issue 17, item 2): the SQL of `dptune query` and ``ResultsStore.query`` reads
the store's views and nothing else; writing, attaching, loading, configuring, and reading any
file outside the store fail with one line, and nothing is written."""
from __future__ import annotations

import glob
import io
import os

import duckdb
import pyarrow.fs as pafs
import pytest

from dptune.cli import EXIT_USAGE, main
from dptune.platform.store import results_store as store_module
from dptune.platform.store.results_store import QueryRefused, ResultsStore


@pytest.fixture
def store(tmp_path) -> ResultsStore:
    s = ResultsStore(str(tmp_path / "exp" / "store"))
    s.write_trial({"trial_id": "a", "epsilon": 1.0, "accuracy": 0.5}, epochs=[{"epoch": 1, "accuracy": 0.5}])
    s.write_trial({"trial_id": "b", "epsilon": 2.0, "accuracy": 0.7})
    (tmp_path / "secret.csv").write_text("password\nhunter2\n")
    return s


def forbidden(tmp_path, store_dir: str) -> dict[str, str]:
    """Statement → a file it would create or read (None: nothing on disk to check)."""
    out, inside = tmp_path / "out.csv", os.path.join(store_dir, "trials", "x.csv")
    return {
        f"COPY (SELECT 42) TO '{out}'": str(out),
        f"COPY trials TO '{inside}'": inside,                       # not even into the store
        f"COPY (SELECT * FROM trials) TO '{tmp_path}/t.parquet' (FORMAT parquet)": str(tmp_path / "t.parquet"),
        f"ATTACH '{tmp_path}/x.db' AS x": str(tmp_path / "x.db"),
        f"EXPORT DATABASE '{tmp_path}/dump'": str(tmp_path / "dump"),
        "INSTALL httpfs": None,
        "LOAD httpfs": None,
        "SET enable_external_access = true": None,
        "PRAGMA enable_profiling": None,
        f"CREATE TABLE t AS SELECT * FROM trials": None,
        "SELECT 1; SELECT 2": None,
        # issue 23: EXPLAIN ANALYZE runs the statement it explains; a forged row in the store
        f"EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{store_dir}/trials/evil.parquet'": f"{store_dir}/trials/evil.parquet",
        f"explain analyze copy (select 1 as x) to '{store_dir}/trials/evil2.parquet'": f"{store_dir}/trials/evil2.parquet",
        f"EXPLAIN (FORMAT json) COPY (SELECT 1) TO '{store_dir}/trials/e3.parquet'": f"{store_dir}/trials/e3.parquet",
        f"/* hidden */ EXPLAIN ANALYZE COPY (SELECT 1) TO '{inside}'": inside,
        "EXPLAIN ANALYZE CREATE TABLE t AS SELECT * FROM trials": None,
        "EXPLAIN ANALYZE SELECT 1; SELECT 2": None,
        # a comment hiding a second statement
        f"SELECT 1 -- harmless\n; COPY (SELECT 1) TO '{tmp_path}/c1.csv'": str(tmp_path / "c1.csv"),
        f"SELECT 1 /* ; */; COPY (SELECT 1) TO '{tmp_path}/c2.csv'": str(tmp_path / "c2.csv"),
        "CALL pragma_version()": None, "CHECKPOINT": None, "VACUUM": None, "ANALYZE": None,
        "DETACH memory": None, "USE memory": None, "RESET threads": None, "SET VARIABLE x = 1": None,
        "BEGIN": None, "DROP VIEW trials": None, "ALTER VIEW trials RENAME TO x": None,
        "INSERT INTO trials VALUES (1)": None, "UPDATE trials SET accuracy = 1": None, "DELETE FROM trials": None,
        "CREATE MACRO m() AS 1": None, "PREPARE p AS SELECT 1": None, "CREATE SECRET s (TYPE s3)": None,
        "FORCE INSTALL httpfs": None, "UPDATE EXTENSIONS": None, f"LOAD '{tmp_path}/x.duckdb_extension'": None,
        f"IMPORT DATABASE '{tmp_path}/dump'": None, f"COPY FROM DATABASE memory TO x": None,
    }


def reads_outside(tmp_path, store_dir: str) -> list[str]:
    secret = tmp_path / "secret.csv"
    return [f"SELECT * FROM read_csv('{secret}')", f"SELECT * FROM read_text('{secret}')",
            f"SELECT * FROM read_blob('{secret}')", "SELECT * FROM read_text('/etc/hostname')",
            f"SELECT * FROM glob('{tmp_path}/*')",
            f"SELECT * FROM read_csv('{store_dir}/../../secret.csv')",   # a path that climbs out
            "SELECT * FROM read_parquet('s3://bucket/x.parquet')",
            f"SELECT * FROM '{secret}'",                                   # a replacement scan of a path
            f"FROM '{tmp_path}/*.csv'"]


def test_writes_attach_install_load_and_set_are_refused_in_one_line(store, tmp_path):
    files = sorted(glob.glob(f"{store.path}/**", recursive=True))
    for sql, path in forbidden(tmp_path, store.path).items():
        with pytest.raises(QueryRefused) as info:
            store.query(sql)
        assert "\n" not in str(info.value) and str(info.value).startswith("refused: "), sql
        assert path is None or not os.path.exists(path), sql
    assert sorted(glob.glob(f"{store.path}/**", recursive=True)) == files   # nothing written, nothing forged
    assert store.query("SELECT count(*) AS n FROM trials")["n"].tolist() == [2]
    with pytest.raises(duckdb.ParserException, match="single SELECT"):   # query(): it runs a SELECT only
        store.query(f"SELECT * FROM query('COPY (SELECT 1) TO ''{tmp_path}/q.csv''')")
    assert not (tmp_path / "q.csv").exists()


def test_reading_outside_the_store_is_refused(store, tmp_path):
    for sql in reads_outside(tmp_path, store.path):
        with pytest.raises(QueryRefused, match="^refused: .*disabled by configuration") as info:
            store.query(sql)
        assert "\n" not in str(info.value) and "hunter2" not in str(info.value), sql


def test_the_connection_itself_is_locked(store, tmp_path):
    """Second line of defence, below the statement check: DuckDB's own configuration."""
    with store.connect() as con:
        with pytest.raises(duckdb.PermissionException):
            con.execute(f"COPY (SELECT 1) TO '{tmp_path}/y.csv'")
        with pytest.raises(duckdb.PermissionException):
            con.execute(f"SELECT * FROM read_csv('{tmp_path}/secret.csv')")
        with pytest.raises(duckdb.InvalidInputException, match="locked"):
            con.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.InvalidInputException, match="locked"):
            con.execute("SET allowed_directories = ['/']")
    assert not (tmp_path / "y.csv").exists()


def test_normal_queries_still_work(store):
    frame = store.query("SELECT trial_id, accuracy FROM trials ORDER BY trial_id")
    assert frame.to_dict("records") == [{"trial_id": "a", "accuracy": 0.5}, {"trial_id": "b", "accuracy": 0.7}]
    assert store.query("WITH best AS (SELECT max(accuracy) AS m FROM trials) FROM best")["m"].tolist() == [0.7]
    assert "accuracy" in store.query("DESCRIBE trials")["column_name"].tolist()
    assert len(store.query("EXPLAIN SELECT * FROM epochs")) >= 1
    assert store.query("SELECT count(*) AS n FROM epochs")["n"].tolist() == [1]
    assert store.query("SELECT count(*) AS n FROM gradnorms")["n"].tolist() == [0]
    # the store's own files stay readable by path
    own = next(iter(glob.glob(f"{store.path}/trials/trial-a.s*.parquet")))
    assert store.query(f"SELECT accuracy FROM read_parquet('{own}')")["accuracy"].tolist() == [0.5]


def test_cli_refuses_in_one_line_and_writes_nothing(store, tmp_path, capsys):
    target = tmp_path / "x.csv"
    assert main(["query", f"COPY (SELECT 42) TO '{target}'", "--store", store.path], out=io.StringIO()) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("dptune query: error: refused: COPY statement") and err.count("\n") == 1
    assert not target.exists()
    assert main(["query", f"SELECT * FROM read_text('{tmp_path}/secret.csv')", "--store", store.path],
                out=io.StringIO()) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("dptune query: error: refused: ") and err.count("\n") == 1 and "hunter2" not in err
    buf = io.StringIO()
    assert main(["query", "SELECT count(*) AS n FROM trials", "--store", store.path, "--format", "csv"], out=buf) == 0
    assert buf.getvalue().split() == ["n", "2"]


def test_a_remote_store_is_read_through_pyarrow_with_no_file_reachable(store, tmp_path, monkeypatch):
    """A store on a non-local pyarrow filesystem (as s3:// is): its data reaches DuckDB as Arrow
    tables, and DuckDB itself may open no file at all, not even the store's."""
    remote_fs = pafs.SubTreeFileSystem(str(tmp_path / "exp"), pafs.LocalFileSystem())
    monkeypatch.setattr(store_module, "filesystem", lambda root: (remote_fs, "store"))
    remote = ResultsStore("s3://bucket/exp/store")
    assert not isinstance(remote.fs, pafs.LocalFileSystem)
    assert remote.query("SELECT trial_id FROM trials ORDER BY trial_id")["trial_id"].tolist() == ["a", "b"]
    assert remote.query("SELECT count(*) AS n FROM epochs")["n"].tolist() == [1]
    with pytest.raises(QueryRefused):
        remote.query(f"SELECT * FROM read_parquet('{store.path}/trials/trial-a.parquet')")
    for sql in [*forbidden(tmp_path, store.path), *reads_outside(tmp_path, store.path)]:
        with pytest.raises(QueryRefused):
            remote.query(sql)


def test_json_ends_with_a_newline_and_tables_show_written_at_as_a_time(store):
    import datetime as dt

    buf = io.StringIO()
    assert main(["query", "SELECT trial_id FROM trials ORDER BY 1", "--store", store.path, "--format", "json"],
                out=buf) == 0
    assert buf.getvalue().endswith("]\n")
    stamp = store.query("SELECT written_at FROM trials WHERE trial_id = 'a'")["written_at"].item()
    buf = io.StringIO()
    assert main(["query", "SELECT written_at FROM trials WHERE trial_id = 'a'", "--store", store.path], out=buf) == 0
    expected = dt.datetime.fromtimestamp(stamp, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    assert expected in buf.getvalue() and "e+09" not in buf.getvalue()


def test_many_loose_files_bring_a_hint_to_compact(store, monkeypatch, capsys):
    from dptune.platform.store import query

    assert main(["query", "SELECT 1 AS x", "--store", store.path], out=io.StringIO()) == 0
    assert "dptune compact" not in capsys.readouterr().err  # 2 files: no hint
    monkeypatch.setattr(query, "LOOSE_HINT", 2)
    assert main(["query", "SELECT 1 AS x", "--store", store.path], out=io.StringIO()) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"`dptune compact --store {store.path}`" in err and "2 uncompacted" in err
