"""The results store on a real S3 server (SeaweedFS on 127.0.0.1): writes, replacement by trial id,
compaction without rename, and no half-written object ever readable."""
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from dptune.platform.store.layout import ExperimentPaths, filesystem
from dptune.platform.store.results_store import ResultsStore


def trial(i: int, accuracy: float) -> dict:
    return {"trial_id": f"t{i}", "status": "finished", "accuracy": accuracy, "clip_bound": 0.5 * (i + 1)}


def test_the_aws_variables_reach_pyarrow_and_dptune(s3):
    """layout.filesystem (pyarrow's from_uri) finds the server through AWS_ENDPOINT_URL alone."""
    fs, path = filesystem(s3.uri("probe", "x.txt"))
    with fs.open_output_stream(path) as f:
        f.write(b"hello")
    # read back with an explicitly configured client: the object really is on this server
    with s3.filesystem().open_input_stream(f"{s3.bucket}/probe/x.txt") as f:
        assert f.read() == b"hello"


def test_store_round_trip_replace_and_compact(s3):
    root = ExperimentPaths.of(s3.uri("store-test"), "exp").store
    store = ResultsStore(root)
    for i in range(3):
        store.write_trial(trial(i, 0.1 * i), epochs=[{"epoch": e, "accuracy": 0.1 * i + e} for e in (1, 2)])
    store.write_trial(trial(1, 0.9), epochs=[{"epoch": 1, "accuracy": 7.0}])  # a resumed trial replaces its rows
    trials = ResultsStore(root).table("trials").set_index("trial_id").sort_index()
    assert list(trials.index) == ["t0", "t1", "t2"] and trials.loc["t1", "accuracy"] == 0.9
    epochs = ResultsStore(root).query("SELECT trial_id, epoch, accuracy FROM epochs ORDER BY trial_id, epoch")
    assert epochs.values.tolist() == [["t0", 1, 1.0], ["t0", 2, 2.0], ["t1", 1, 7.0],
                                      ["t2", 1, 1.2], ["t2", 2, 2.2]]

    kept = store.compact()
    assert kept == {"trials": 3, "epochs": 5, "gradnorms": 0}
    # compaction left one part per table and no loose objects, read back over S3 by an independent client
    listing = s3.filesystem().get_file_info(pafs.FileSelector(root.removeprefix("s3://"), recursive=True))
    names = sorted(i.path.rsplit("/", 2)[-2] + "/" + i.base_name[:5] for i in listing if i.base_name.endswith(".parquet"))
    assert names == ["epochs/part-", "gradnorms/part-", "trials/part-"]
    after = ResultsStore(root).table("trials").set_index("trial_id").sort_index()
    assert after["accuracy"].tolist() == trials["accuracy"].tolist()

    store.write_trial(trial(2, 0.5))  # a loose object newer than the part wins
    assert ResultsStore(root).query("SELECT accuracy FROM trials WHERE trial_id = 't2'").accuracy.tolist() == [0.5]


def test_a_failed_write_never_publishes_part_of_a_file(s3, monkeypatch):
    """Serialisation fails after half the rows were written (a worker out of memory, say): the
    object keeps its previous version. Writing straight to the S3 stream would publish the
    half-written file, because pyarrow's writer closes (= uploads) its sink on the error."""
    root = s3.uri("half-written", "exp", "store")
    store = ResultsStore(root)
    old = [{"epoch": e, "accuracy": float(e)} for e in range(100)]
    store.write_trial(trial(0, 0.3), epochs=old)

    original = pq.ParquetWriter.write_table

    def fail_halfway(self, table, row_group_size=None):
        original(self, table.slice(0, table.num_rows // 2), row_group_size=row_group_size)
        raise MemoryError("injected failure halfway through the file")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", fail_halfway)
    with pytest.raises(MemoryError):
        store.write_trial(trial(0, 0.99), epochs=[{"epoch": e, "accuracy": -1.0} for e in range(100)])
    with pytest.raises(MemoryError):
        store.write_trial(trial(5, 0.99), epochs=[{"epoch": e, "accuracy": -1.0} for e in range(100)])
    monkeypatch.undo()

    fresh = ResultsStore(root)
    assert fresh.query("SELECT count(*) AS n, sum(accuracy) AS s FROM epochs").values.tolist() == [[100, 4950.0]]
    assert fresh.query("SELECT trial_id, accuracy FROM trials").values.tolist() == [["t0", 0.3]]


def test_the_escape_table_on_s3_and_a_damaged_object_is_quarantined(s3, tmp_path, capsys):
    """Issue 23 on the real S3 server: every statement of the escape table is refused and forges no
    row; an unreadable object is moved to quarantine/ with one warning and the queries answer."""
    from test_query_readonly import forbidden, reads_outside

    from dptune.platform.store.results_store import QUARANTINE, QueryRefused
    from dptune.platform.store.storage_check import check_storage

    store = ResultsStore(ExperimentPaths.of(s3.uri("escape"), "exp").store)
    for i in range(3):
        store.write_trial({"trial_id": f"t{i}", "config_id": f"c{i}", "accuracy": i / 10})
    (tmp_path / "secret.csv").write_text("password\nhunter2\n")
    for sql in [*forbidden(tmp_path, store.path), *reads_outside(tmp_path, store.path)]:
        with pytest.raises(QueryRefused):
            store.query(sql)
    assert store.query("SELECT count(*) AS n FROM trials")["n"].tolist() == [3]
    fs = s3.filesystem()
    victim = next(i.path for i in fs.get_file_info(pafs.FileSelector(f"{store.path}/trials"))
                  if "trial-t1." in i.path)
    with fs.open_output_stream(victim) as f:
        f.write(b"PAR1 not really")
    assert sorted(store.query("SELECT trial_id FROM trials").trial_id) == ["t0", "t2"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and victim.rsplit("/", 1)[-1] in err[0]
    moved = fs.get_file_info(f"{store.path}/{QUARANTINE}/trials/{victim.rsplit('/', 1)[-1]}")
    assert moved.type == pafs.FileType.File
    with pytest.raises(Exception, match="^storage s3://missing-bucket-x/y cannot take the sweep's files"):
        check_storage("s3://missing-bucket-x/y")
