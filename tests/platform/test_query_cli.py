"""`dptune query` and `dptune compact` over a store: tables, csv/json/parquet output, clear errors."""
import io
import json

import pandas as pd

from dptune.cli import EXIT_USAGE, main
from dptune.platform.store.results_store import ResultsStore


def make_store(root):
    store = ResultsStore(str(root / "exp" / "store"))
    for i, (eps, acc) in enumerate([(1.0, 0.5), (1.0, 0.6), (8.0, 0.9)]):
        store.write_trial({"trial_id": f"t{i}", "epsilon": eps, "accuracy": acc, "dataset": "digits"})
    return store


def test_query_prints_and_writes_every_format(tmp_path):
    make_store(tmp_path)
    sql = "SELECT epsilon, max(accuracy) AS best FROM trials GROUP BY epsilon ORDER BY epsilon"
    buf = io.StringIO()
    assert main(["query", sql, "--store", str(tmp_path / "exp")], out=buf) == 0
    assert "best" in buf.getvalue() and "0.9" in buf.getvalue()
    buf = io.StringIO()
    main(["query", sql, "--store", str(tmp_path / "exp"), "--format", "json"], out=buf)
    assert json.loads(buf.getvalue()) == [{"epsilon": 1.0, "best": 0.6}, {"epsilon": 8.0, "best": 0.9}]
    target = tmp_path / "out.parquet"
    main(["query", sql, "--store", str(tmp_path / "exp"), "--format", "parquet", "--out", str(target)])
    assert pd.read_parquet(target)["best"].tolist() == [0.6, 0.9]


def test_compact_then_query_gives_the_same_answer(tmp_path):
    store = make_store(tmp_path)
    before = store.query("SELECT * FROM trials ORDER BY trial_id").drop(columns="written_at")
    assert main(["compact", "--store", str(tmp_path / "exp")], out=io.StringIO()) == 0
    after = store.query("SELECT * FROM trials ORDER BY trial_id").drop(columns="written_at")
    pd.testing.assert_frame_equal(before, after)


def test_bad_sql_and_missing_store_are_one_line_errors(tmp_path, capsys):
    make_store(tmp_path)
    assert main(["query", "SELEC nonsense", "--store", str(tmp_path / "exp")]) == EXIT_USAGE
    assert main(["query", "SELECT 1", "--store", str(tmp_path / "missing")]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "query failed" in err[0] and "no results store" in err[1]
