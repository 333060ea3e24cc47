"""A store no query can forge and no crash can lose, an experiment folder safe to open (issue 23):
query limits, quarantine of unreadable files, durable writes under SIGKILL at every point of the
write and compaction path, a full disk, damaged state files, pickles that do not run."""
from __future__ import annotations

import errno
import json
import multiprocessing
import os
import pickle
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dptune.errors import UserError
from dptune.platform.store import durable
from dptune.platform.store.durable import DamagedFile
from dptune.platform.store.layout import ExperimentPaths
from dptune.platform.store.query_limits import QueryLimits
from dptune.platform.store.results_store import QUARANTINE, TABLES, QueryRefused, ResultsStore, StoreWriteError

EPOCHS = 3


def rows(i: int) -> tuple[dict, list[dict]]:
    """Trial ``i``: its row (config_id c<i>) and its EPOCHS epoch rows."""
    return ({"trial_id": f"t{i}", "config_id": f"c{i}", "accuracy": i / 10, "status": "finished"},
            [{"epoch": e, "accuracy": i / 10 + e / 100} for e in range(1, EPOCHS + 1)])


def write(store: ResultsStore, i: int) -> None:
    trial, epochs = rows(i)
    store.write_trial(trial, epochs)


# -- limits --------------------------------------------------------------------------------------

def test_a_query_is_stopped_at_its_time_and_memory_limits(tmp_path):
    store = ResultsStore(str(tmp_path / "store"))
    write(store, 0)
    with pytest.raises(QueryRefused, match="stopped after 0.5 s"):   # hours of work: always past 0.5 s
        store.query("SELECT count(*) FROM range(10000000000000)", QueryLimits(timeout_s=0.5))
    with pytest.raises(QueryRefused, match="memory limit of 64MB"):
        store.query("SELECT list(range) FROM range(100000000)", QueryLimits(memory="64MB"))
    assert store.query("SELECT count(*) AS n FROM trials", QueryLimits(memory="64MB", threads=1))["n"].tolist() == [1]
    for bad in ({"memory": "lots"}, {"threads": 0}, {"timeout_s": 0}):
        with pytest.raises(UserError):
            QueryLimits(**bad)
    assert not list(tmp_path.glob("**/*.tmp")) and not (Path.cwd() / ".tmp").exists()   # nothing spilled


# -- unreadable files ----------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["truncated", "random bytes"])
def test_an_unreadable_file_is_quarantined_with_one_warning_and_queries_answer(tmp_path, capsys, damage):
    store = ResultsStore(str(tmp_path / "store"))
    for i in range(3):
        write(store, i)
    victim = next((tmp_path / "store" / "trials").glob("trial-t1.*.parquet"))
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2] if damage == "truncated" else os.urandom(len(data)))
    assert sorted(store.query("SELECT trial_id FROM trials").trial_id) == ["t0", "t2"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and victim.name in err[0] and "quarantine" in err[0]
    assert (tmp_path / "store" / QUARANTINE / "trials" / victim.name).read_bytes() != data
    assert not victim.exists()
    assert store.compact()["trials"] == 2 and capsys.readouterr().err == ""   # compaction goes on
    # a damaged file met by compaction first (remote stores and compaction read through pyarrow)
    write(store, 3)
    epochs = next((tmp_path / "store" / "epochs").glob("trial-t3.*.parquet"))
    epochs.write_bytes(b"not parquet")
    store.compact()
    assert epochs.name in capsys.readouterr().err
    assert sorted(store.query("SELECT DISTINCT trial_id FROM epochs").trial_id) == ["t0", "t1", "t2"]


# -- crashes: SIGKILL at every point of the write and compaction path ----------------------------

TRIALS, COMPACT_AFTER = 6, (2, 5)
POINTS = {"durable_written": 14, "durable_synced": 14, "durable_renamed": 14, "compact_deleted": 10}


def _run_and_die(root: str, fault: str, progress: str) -> None:
    """The child: write the trials (compacting twice), noting each trial once write_trial returned."""
    os.environ["DPTUNE_FAULTS"] = fault
    store = ResultsStore(root)
    for i in range(TRIALS):
        write(store, i)
        with open(progress, "a") as f:
            f.write(f"c{i}\n")
            f.flush()
            os.fsync(f.fileno())
        if i in COMPACT_AFTER:
            store.compact()


def _stored(store: ResultsStore) -> tuple[dict, dict]:
    trials = store.query("SELECT config_id, count(*) AS n FROM trials GROUP BY config_id")
    epochs = store.query("SELECT config_id, count(*) AS n FROM epochs GROUP BY config_id")
    return dict(zip(trials.config_id, trials.n)), dict(zip(epochs.config_id, epochs.n))


def test_a_crash_at_any_point_loses_no_written_row_and_resume_leaves_each_once(tmp_path):
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["dptune.platform.store.results_store"])
    survived, points = 0, 0
    for point, hits in POINTS.items():
        for k in range(1, hits + 1):
            root, progress = str(tmp_path / f"{point}{k}" / "store"), str(tmp_path / f"{point}{k}.done")
            Path(progress).touch()
            child = context.Process(target=_run_and_die, args=(root, f"{point}@{k}=kill", progress))
            child.start()
            child.join(60)
            assert child.exitcode is not None, f"{point}@{k}: the child hangs"
            points += child.exitcode == -9
            store = ResultsStore(root)
            trials, epochs = _stored(store)
            done = Path(progress).read_text().split()
            # every trial whose write had returned is readable right after the crash, once
            assert all(trials.get(c) == 1 and epochs.get(c) == EPOCHS for c in done), (point, k, trials, done)
            assert all(n == 1 for n in trials.values()), (point, k, trials)
            for table in TABLES:   # no file is unreadable
                for f in (Path(root) / table).glob("*.parquet"):
                    pq.read_table(f)
            # what `dptune resume` does: record every trial the store lacks, then the sweep compacts
            for i in range(TRIALS):
                if f"c{i}" not in trials:
                    write(store, i)
            store.compact()
            trials, epochs = _stored(store)
            assert trials == {f"c{i}": 1 for i in range(TRIALS)}, (point, k)
            assert epochs == {f"c{i}": EPOCHS for i in range(TRIALS)}, (point, k)
            survived += 1
    assert points >= 50 and survived == sum(POINTS.values())   # the kills happened, and each was survived


# -- a full disk ---------------------------------------------------------------------------------

def _small_filesystem(folder: Path) -> bool:
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(folder)], capture_output=True)
    return done.returncode == 0


def test_a_full_disk_loses_nothing_stored_and_the_row_arrives_once_space_is_back(tmp_path, monkeypatch):
    from dptune.platform.sweep.store_callback import StoreCallback

    folder = tmp_path / "small"
    mounted = _small_filesystem(folder)
    try:
        store = ResultsStore(str(folder / "store"))
        store.write_retry_s = 0.0
        write(store, 0)
        ballast = folder / "ballast"
        if mounted:   # fill the filesystem: a real ENOSPC
            with open(ballast, "wb", buffering=0) as f:
                with pytest.raises(OSError) as full:
                    while True:
                        f.write(b"\0" * 4096)
            assert full.value.errno == errno.ENOSPC
        else:         # mounting is not allowed here: the same error, injected at the write
            real = durable.write_bytes

            def full(fs, path, data):
                if ballast.exists():
                    raise OSError(errno.ENOSPC, "No space left on device")
                return real(fs, path, data)
            ballast.touch()
            monkeypatch.setattr("dptune.platform.store.results_store.write_bytes", full)
        with pytest.raises(StoreWriteError, match="No space left"):
            write(store, 1)
        assert not list(folder.glob("store/**/.*.tmp"))                  # nothing half-written left
        assert store.query("SELECT trial_id FROM trials").trial_id.tolist() == ["t0"]   # nothing lost

        # the store callback reports the failure once, goes on, and records the row once space is back
        callback = StoreCallback(ExperimentPaths(str(folder)))
        callback._store = store
        calls = []
        monkeypatch.setattr(callback, "_write", lambda trial, status, error=None: calls.append(trial) or
                            write(store, int(trial.trial_id[1:])))
        trial = type("T", (), {"trial_id": "t2", "last_result": {}, "config": {}})()
        callback._record(trial, "finished")
        assert "t2" in callback._unrecorded
        ballast.unlink()
        callback.on_experiment_end([trial])
        assert not callback._unrecorded
        assert sorted(store.query("SELECT trial_id FROM trials").trial_id) == ["t0", "t2"]
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=False)


# -- damaged state files; files that must not run code -------------------------------------------

def test_damaged_settings_plan_and_state_are_refused_in_one_line(tmp_path):
    from dptune.platform.sweep.driver import load_settings

    paths = ExperimentPaths(str(tmp_path / "exp"))
    paths.create()
    Path(paths.settings).write_text('{"experiment": "exp", "stor')
    with pytest.raises(DamagedFile, match=r"^the run settings .*dptune_settings.json is damaged") as info:
        load_settings(paths)
    assert "\n" not in str(info.value)
    Path(paths.plan).write_bytes(b"\xff\xfe")
    with pytest.raises(DamagedFile, match="plan"):
        paths.saved_plan()
    state = tmp_path / "searcher.pkl"
    state.write_bytes(pickle.dumps({"a": 1})[:5])
    with pytest.raises(DamagedFile, match="searcher"):
        durable.read_file(durable.pafs.LocalFileSystem(), str(state), pickle.loads, "the searcher's state")


def test_durable_writes_leave_the_old_content_when_the_write_fails(tmp_path, monkeypatch):
    target = tmp_path / "settings.json"
    durable.write_json(durable.pafs.LocalFileSystem(), str(target), {"v": 1})
    monkeypatch.setattr(durable.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError):
        durable.write_json(durable.pafs.LocalFileSystem(), str(target), {"v": 2})
    assert json.loads(target.read_text()) == {"v": 1} and [p.name for p in tmp_path.iterdir()] == ["settings.json"]


class Planted:
    """A pickle that runs code when loaded."""

    def __reduce__(self):
        return (Path.touch, (Path(os.environ["PLANTED"]),))


def test_a_planted_checkpoint_does_not_run_code(tmp_path, monkeypatch):
    import torch

    from dptune.platform.views.checkpoint_gradients import checkpoint_gradients

    marker = tmp_path / "ran"
    monkeypatch.setenv("PLANTED", str(marker))
    torch.save({"trainer": Planted()}, tmp_path / "state.pt")
    with pytest.raises(pickle.UnpicklingError):
        checkpoint_gradients(str(tmp_path / "state.pt"))
    assert not marker.exists()


def test_model_options_are_config_settings_never_loading_options():
    from dptune.trainables.models.text import create_text_model

    with pytest.raises(UserError, match="trust_remote_code.* not settings of its distilbert config"):
        create_text_model("distilbert-base-uncased", num_classes=2, input_shape=(8,), weights="random",
                          n_layers=1, dim=32, hidden_dim=64, n_heads=2, trust_remote_code=True)
    model = create_text_model("distilbert-base-uncased", num_classes=2, input_shape=(8,), weights="random",
                              n_layers=1, dim=32, hidden_dim=64, n_heads=2)
    blocks = [n for n, _ in model.named_modules() if n.endswith("transformer.layer.0")]
    assert len(blocks) == 1 and not any(n.endswith("transformer.layer.1") for n, _ in model.named_modules())


def test_experiment_names_are_matched_whole():
    from dptune.platform.sweep.spec_sections import parse_experiment

    with pytest.raises(Exception, match="experiment: must be a name"):
        parse_experiment("exp\n", None)
    assert parse_experiment("exp-1.a_b", None) == "exp-1.a_b"


def test_storage_that_cannot_take_a_write_is_refused_in_one_line(tmp_path):
    from dptune.platform.store.storage_check import check_storage

    check_storage(str(tmp_path / "new" / "folder"))        # created, probed, left empty
    assert list((tmp_path / "new" / "folder").iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="^storage .* cannot take the sweep's files") as info:
        check_storage(str(tmp_path / "file" / "below"))
    assert "\n" not in str(info.value)
