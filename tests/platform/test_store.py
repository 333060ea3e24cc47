"""Results store: idempotent by trial id, atomic, compaction keeps the newest version, concurrency."""
import os
import threading

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dptune.platform.store.results_store import MAX_PARTS, ResultsStore


def write(store, trial_id, acc, epochs=2):
    store.write_trial({"trial_id": trial_id, "accuracy": acc, "epsilon": 8.0, "status": "finished"},
                      [{"epoch": e, "accuracy": acc * e / epochs} for e in range(1, epochs + 1)],
                      [{"epoch": epochs, "label": c, "count": 3} for c in range(3)])


def test_rewriting_a_trial_replaces_its_rows(tmp_path):
    store = ResultsStore(str(tmp_path / "store"))
    write(store, "a", 0.5, epochs=3)
    write(store, "b", 0.7)
    write(store, "a", 0.9, epochs=2)  # resumed / re-run trial
    trials = store.table("trials").set_index("trial_id")
    assert sorted(trials.index) == ["a", "b"] and trials.loc["a", "accuracy"] == 0.9
    epochs = store.table("epochs")
    assert len(epochs[epochs.trial_id == "a"]) == 2
    assert store.table("gradnorms")["nonprivate"].all()


def test_compaction_keeps_one_newest_row_per_trial(tmp_path):
    store = ResultsStore(str(tmp_path / "store"))
    for i in range(20):
        write(store, f"t{i}", i / 20)
    assert store.compact()["trials"] == 20
    assert os.listdir(tmp_path / "store" / "trials") == [n for n in os.listdir(tmp_path / "store" / "trials")
                                                         if n.startswith("part-")]
    write(store, "t3", 0.99)  # a trial rewritten after compaction overrides the compacted row
    trials = store.table("trials").set_index("trial_id")
    assert len(trials) == 20 and trials.loc["t3", "accuracy"] == 0.99
    assert len(store.table("epochs")) == 40
    store.compact()
    assert store.table("trials").set_index("trial_id").loc["t3", "accuracy"] == 0.99
    assert len(store.table("epochs")) == 40 and len(store.table("gradnorms")) == 60


def files(tmp_path, table, prefix):
    return [n for n in os.listdir(tmp_path / "store" / table) if n.startswith(prefix)]


def test_compacting_per_trial_files_leaves_the_parts_and_keeps_the_newest_version(tmp_path):
    store = ResultsStore(str(tmp_path / "store"))
    for i in range(6):
        write(store, f"t{i}", i / 10, epochs=3)
    store.compact(loose_only=True)
    write(store, "t3", 0.99, epochs=2)   # a newer version of a trial already merged into a part
    write(store, "t6", 0.6)
    assert store.compact(loose_only=True)["trials"] == 2
    assert [len(files(tmp_path, "trials", p)) for p in ("part-", "trial-")] == [2, 0]
    trials = store.table("trials").set_index("trial_id")
    assert sorted(trials.index) == [f"t{i}" for i in range(7)] and trials.loc["t3", "accuracy"] == 0.99
    epochs = store.table("epochs")
    assert len(epochs[epochs.trial_id == "t3"]) == 2 and len(epochs) == 6 * 3 - 3 + 2 + 2


def test_the_sweep_policy_bounds_the_files_a_query_reads(tmp_path):
    store = ResultsStore(str(tmp_path / "store"))
    expected = {}
    for i in range(2 * 2 * MAX_PARTS + 3):   # more merges than MAX_PARTS: the parts are merged too
        trial = f"t{i % 12}"          # every trial rewritten, some after a merge
        expected[trial] = i / 1000
        write(store, trial, expected[trial])
        store.compact_every(2)
        assert len(files(tmp_path, "trials", "trial-")) < 2
        assert len(files(tmp_path, "trials", "part-")) <= MAX_PARTS
    trials = store.table("trials")
    assert dict(zip(trials.trial_id, trials.accuracy)) == expected
    assert len(store.table("epochs")) == 2 * len(expected) and len(store.table("gradnorms")) == 3 * len(expected)


def test_a_compaction_killed_before_it_deleted_leaves_no_duplicates(tmp_path):
    store = ResultsStore(str(tmp_path / "store"))
    for i in range(5):
        write(store, f"t{i}", i / 10)
    saved = {t: {n: (tmp_path / "store" / t / n).read_bytes() for n in os.listdir(tmp_path / "store" / t)}
             for t in ("trials", "epochs", "gradnorms")}
    store.compact()
    for table, files in saved.items():       # killed after writing its part: the merged files are still there
        for name, data in files.items():
            (tmp_path / "store" / table / name).write_bytes(data)
        part = next(n for n in os.listdir(tmp_path / "store" / table) if n.startswith("part-"))
        (tmp_path / "store" / table / ("part-0" + part[5:])).write_bytes((tmp_path / "store" / table / part).read_bytes())
    assert len(store.table("trials")) == 5 and store.table("trials").trial_id.is_unique
    assert len(store.table("epochs")) == 10 and len(store.table("gradnorms")) == 15
    store.compact()                           # and compacting again merges them into one copy
    assert [len(os.listdir(tmp_path / "store" / t)) for t in ("trials", "epochs", "gradnorms")] == [1, 1, 1]
    assert len(store.table("trials")) == 5 and len(store.table("epochs")) == 10


def test_a_configuration_restarted_under_a_new_trial_id_has_one_row(tmp_path):
    store = ResultsStore(str(tmp_path / "store"))
    store.write_trial({"trial_id": "ray-1", "config_id": "cfg-a", "status": "error", "error": "OOM"})
    store.write_trial({"trial_id": "ray-2", "config_id": "cfg-b", "status": "finished", "accuracy": 0.5})
    store.write_trial({"trial_id": "ray-3", "config_id": "cfg-a", "status": "finished", "accuracy": 0.8},
                      [{"epoch": 1, "accuracy": 0.8}])
    store.write_trial({"trial_id": "equiv-1", "status": "finished", "accuracy": 0.5})  # no config id: by trial
    trials = store.table("trials").set_index("trial_id")
    assert sorted(trials.index) == ["equiv-1", "ray-2", "ray-3"] and trials.loc["ray-3", "accuracy"] == 0.8
    assert list(store.table("epochs").trial_id) == ["ray-3"]


def test_a_store_written_before_config_ids_is_read_by_trial_id(tmp_path):
    for table, rows in (("trials", [{"trial_id": "a", "accuracy": 0.1, "written_at": 1.0},
                                    {"trial_id": "b", "accuracy": 0.2, "written_at": 1.0}]),
                        ("epochs", [{"trial_id": "a", "epoch": 1, "written_at": 1.0}])):
        (tmp_path / "store" / table).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "store" / table / "part-old.parquet")
    (tmp_path / "store" / "gradnorms").mkdir()
    pq.write_table(pa.Table.from_pylist([{"trial_id": "a", "accuracy": 0.5, "written_at": 2.0}]),
                   tmp_path / "store" / "trials" / "trial-a.parquet")   # a's newer version, no config id either
    store = ResultsStore(str(tmp_path / "store"))
    trials = store.table("trials").set_index("trial_id")
    assert sorted(trials.index) == ["a", "b"] and trials.loc["a", "accuracy"] == 0.5
    assert store.compact()["trials"] == 2 and len(store.table("epochs")) == 1


def test_many_trials_finishing_at_once_lose_nothing(tmp_path):
    store = ResultsStore(str(tmp_path / "store"))
    threads = [threading.Thread(target=lambda i=i: [write(store, f"w{i}-{j}", 0.5) for j in range(10)])
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.query("SELECT count(*) AS n, count(DISTINCT trial_id) AS d FROM trials").iloc[0].tolist() == [80, 80]


def test_readers_never_see_half_written_files(tmp_path):
    store = ResultsStore(str(tmp_path / "store"))
    write(store, "seed", 0.1)
    stop, all_written = threading.Event(), threading.Event()
    errors = []

    def writer():
        i = 0
        while not stop.is_set():
            write(store, f"x{i % 5}", 0.5, epochs=50)
            i += 1
            if i == 5:
                all_written.set()

    # Once x0…x4 exist, every read sees exactly these trials with all their epochs: rewrites replace
    # whole files, so no trial is ever missing, doubled or torn.
    expected = {"seed": 2, **{f"x{k}": 50 for k in range(5)}}
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert all_written.wait(timeout=60)
        for _ in range(40):
            try:
                counts = store.query("SELECT trial_id, count(*) AS n FROM epochs GROUP BY trial_id")
                assert dict(zip(counts.trial_id, counts.n)) == expected
            except Exception as exc:  # a torn file would surface as a Parquet read error
                errors.append(exc)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[:3]
    leftovers = [n for n in os.listdir(tmp_path / "store" / "epochs") if n.startswith(".")]
    assert not leftovers  # temporary files are always renamed away


def test_files_are_real_parquet_and_infinite_values_become_null(tmp_path):
    store = ResultsStore(str(tmp_path / "store"))
    store.write_trial({"trial_id": "np", "epsilon": float("inf"), "accuracy": 0.9})
    table = pq.read_table(next((tmp_path / "store" / "trials").glob("trial-np.s*.parquet")))
    assert table.column("epsilon").to_pylist() == [None]
    with pytest.raises(ValueError, match="table must be one of"):
        store.table("nope")


def test_loose_files_of_different_schemas_read_as_one_table(tmp_path):
    """Per-trial files carry their schema's tag and each tag is scanned as it is: files that differ
    in a column's type (int against double, null against text) or in their columns still read as
    pyarrow reads them one by one."""
    store = ResultsStore(str(tmp_path / "store"))
    rows = [{"trial_id": "a", "accuracy": 0.5, "error": None}, {"trial_id": "b", "accuracy": 1, "error": "boom"},
            {"trial_id": "c", "accuracy": 0.25, "error": None, "extra": 3},
            {"trial_id": "d", "accuracy": 0.75, "error": None}, {"trial_id": "e", "accuracy": 2, "error": None}]
    for row in rows:
        store.write_trial(row)
    files = sorted(os.listdir(tmp_path / "store" / "trials"))
    assert len({name.rsplit(".", 2)[1] for name in files}) == 4   # a and d share a schema
    got = store.query("SELECT trial_id, accuracy, error, extra FROM trials ORDER BY trial_id")
    assert got.accuracy.tolist() == [0.5, 1.0, 0.25, 0.75, 2.0]
    assert [None if pd.isna(v) else v for v in got.error] == [None, "boom", None, None, None]
    assert [None if pd.isna(v) else v for v in got.extra] == [None, None, 3, None, None]
    by_pyarrow = pa.concat_tables([pq.read_table(tmp_path / "store" / "trials" / f) for f in files],
                                  promote_options="permissive").to_pandas().sort_values("trial_id")
    assert by_pyarrow.accuracy.tolist() == got.accuracy.tolist()
