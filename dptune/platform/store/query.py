"""`dptune query` and `dptune compact`: SQL over a results store, printed or written to a file."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from ...errors import UserError
from .layout import DEFAULT_EXPERIMENT, DEFAULT_STORAGE, ExperimentPaths
from .query_limits import QueryLimits

if TYPE_CHECKING:  # imported when a query runs: `dptune --help` needs only the names below
    import pandas as pd

    from .results_store import ResultsStore

FORMATS = ("table", "csv", "json", "parquet")
#: From this many per-trial files on, `dptune query` suggests `dptune compact`.
LOOSE_HINT = 1000
#: What ``--store`` means when not given: the store of the spec's default storage and experiment.
DEFAULT_STORE = ExperimentPaths.of(DEFAULT_STORAGE, DEFAULT_EXPERIMENT).store


def open_store(path: str) -> "ResultsStore":
    """A store from its folder, or from an experiment folder that contains ``store/``."""
    from .results_store import ResultsStore

    return ResultsStore(ExperimentPaths.find(path).store)


def run_query(store_path: str, sql: str, *, fmt: str = "table", out_file: str | None = None,
              out: TextIO, limits: QueryLimits = QueryLimits()) -> "pd.DataFrame":
    """Run ``sql`` over the views trials/epochs/gradnorms within ``limits``; print a table or write
    csv/json/parquet."""
    import pandas as pd

    if fmt not in FORMATS:
        raise UserError(f"format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    if fmt == "parquet" and not out_file:
        raise UserError("format parquet needs --out FILE")
    store = open_store(store_path)
    try:
        frame = store.query(sql, limits)
    except Exception as exc:  # DuckDB parser/binder errors: one line for the user
        if type(exc).__module__.startswith("duckdb") or exc.__class__.__name__.endswith("Exception"):
            raise UserError(f"query failed: {str(exc).splitlines()[0]}") from exc
        raise
    loose = store.loose_files("trials")
    if loose >= LOOSE_HINT:  # every query reads each small file: merging them is the cure
        print(f"dptune query: note: {loose} uncompacted trial files make queries slow; "
              f"`dptune compact --store {store_path}` merges them (safe while a sweep runs)", file=sys.stderr)
    if fmt == "table":
        with pd.option_context("display.max_rows", 200, "display.max_columns", 50, "display.width", 200):
            print(_readable(frame).to_string(index=False), file=out)
    elif fmt == "csv":
        text = frame.to_csv(index=False)
        _emit(text, out_file, out)
    elif fmt == "json":
        _emit(frame.to_json(orient="records", indent=1) + "\n", out_file, out)
    else:
        frame.to_parquet(out_file, index=False)
    return frame


def _readable(frame: "pd.DataFrame") -> "pd.DataFrame":
    """For the table format: ``written_at`` (Unix seconds) as a UTC time, not ``1.796038e+09``."""
    import pandas as pd

    if "written_at" in frame.columns and pd.api.types.is_numeric_dtype(frame["written_at"]):
        frame = frame.assign(written_at=pd.to_datetime(frame["written_at"], unit="s", utc=True)
                             .dt.strftime("%Y-%m-%d %H:%M:%S"))
    return frame


def _emit(text: str, out_file: str | None, out: TextIO) -> None:
    if out_file:
        with open(out_file, "w") as f:
            f.write(text)
    else:
        out.write(text)
