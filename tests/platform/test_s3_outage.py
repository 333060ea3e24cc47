"""The object store goes away: store writes wait for a restarted server (bounded, with backoff) or
fail with one line and publish nothing; a sweep whose S3 server restarts mid-sweep, resumed with
`dptune resume s3://…`, ends with every trial exactly once."""
import os
import shutil
import tempfile
import threading

from types import SimpleNamespace

import pyarrow.fs as pafs
import pytest
import torch
import yaml
from ray import tune

from dptune.platform.sweep.store_callback import StoreCallback
from dptune.platform.store.layout import ExperimentPaths
from dptune.platform.sweep.tune_adapter import STATE_FILE

from dptune.platform.store.results_store import ResultsStore, StoreWriteError
from faulting import await_pause, faulted_env, resume_from_pause
from s3_server import serving, started
from test_driver_failure import SPEC, dptune, kill_tree

N_TRIALS = 8


@pytest.fixture
def server(tmp_path):
    """A SeaweedFS server of this test alone (it is stopped and restarted), AWS variables set."""
    with serving(started(tmp_path / "seaweedfs")) as server:
        yield server


@pytest.fixture
def paused_at_the_first_retry(monkeypatch, tmp_path):
    """This process pauses at its first storage retry (dptune/platform/faults.py) until the test says go."""
    from collections import Counter

    from dptune.platform import faults

    folder = tmp_path / "faults"
    for name, value in faulted_env("storage_retry@1=pause", folder).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(faults, "_passed", Counter())
    return folder


def during_the_outage(server, folder, action):
    """Run ``action`` with the server stopped; restart the server once ``action`` has failed against
    it and waits to retry (its first storage retry), then let it go on."""
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.setdefault("value", action()), daemon=True)
    server.stop()
    worker.start()
    await_pause(folder, "storage_retry@1", alive=worker.is_alive)
    server.start()
    resume_from_pause(folder, "storage_retry@1")
    worker.join(timeout=300)
    assert not worker.is_alive()
    return outcome


def test_a_store_write_waits_for_the_server_to_come_back(server, paused_at_the_first_retry):
    store = ResultsStore(server.uri("restart", "store"))
    store.write_trial({"trial_id": "a", "accuracy": 0.5}, epochs=[{"epoch": 1, "accuracy": 0.5}])
    during_the_outage(server, paused_at_the_first_retry, lambda: store.write_trial(
        {"trial_id": "b", "accuracy": 0.75}, epochs=[{"epoch": e, "accuracy": e / 10} for e in (1, 2)]))
    fresh = ResultsStore(server.uri("restart", "store"))
    assert fresh.query("SELECT trial_id, accuracy FROM trials ORDER BY trial_id").values.tolist() == [["a", 0.5], ["b", 0.75]]
    assert fresh.query("SELECT count(*) FROM epochs WHERE trial_id = 'b'").iloc[0, 0] == 2


def test_a_trial_ending_during_an_outage_keeps_its_curve(server, tmp_path, paused_at_the_first_retry):
    """A trial ends while the server is down: the store callback waits for its checkpoint as the
    store's writes wait, and records the whole curve (it was recorded without one: CI, stop 19)."""
    history = [{"epoch": e, "step": 4 * e, "test_accuracy": e / 10, "test_loss": 1.0 / e} for e in (1, 2)]
    with tempfile.TemporaryDirectory() as local:
        torch.save({"trainer": {}, "history": history}, os.path.join(local, STATE_FILE))
        remote = f"{server.bucket}/ckpt/checkpoint_000001"
        pafs.copy_files(local, remote, destination_filesystem=server.filesystem())
    trial = SimpleNamespace(trial_id="t1", config={"model": "mlp", "dataset": "digits", "epsilon": 1.0},
                            last_result={"test_accuracy": 0.2, "step": 8, "steps": 8},
                            checkpoint=tune.Checkpoint(remote, filesystem=server.filesystem()))
    callback = StoreCallback(ExperimentPaths.of(server.uri("runs"), "ended"), compact_every=10**6)
    callback.store  # the store's folders exist before the outage
    during_the_outage(server, paused_at_the_first_retry, lambda: callback.on_trial_complete(0, [], trial))
    store = ResultsStore(ExperimentPaths.of(server.uri("runs"), "ended").store)
    row = store.table("trials").iloc[0]
    assert row.status == "finished" and row.error is None and row.accuracy == 0.2
    assert store.query("SELECT epoch, accuracy FROM epochs ORDER BY epoch").values.tolist() == [[1, 0.1], [2, 0.2]]


def test_a_store_write_fails_in_one_line_and_publishes_nothing(server):
    store = ResultsStore(server.uri("down", "store"))
    store.write_trial({"trial_id": "a", "accuracy": 0.5})
    store.write_retry_s = 1.5
    server.stop()
    with pytest.raises(StoreWriteError) as failure:
        store.write_trial({"trial_id": "b", "accuracy": 0.75}, epochs=[{"epoch": 1, "accuracy": 0.1}])
    message = str(failure.value)
    assert "\n" not in message and server.uri("down", "store") in message and "trial-b.s" in message
    server.start()
    fresh = ResultsStore(server.uri("down", "store"))
    assert fresh.query("SELECT trial_id FROM trials UNION ALL SELECT trial_id FROM epochs").trial_id.tolist() == ["a"]


def test_server_restarted_mid_sweep_then_resumed(server, tmp_path):
    """The server goes down mid-sweep, right after the driver recorded its first trial, and comes back
    once the driver is waiting on it (its first storage retry): the driver's store writes wait for
    it, trials whose checkpoints could not be saved end errored; `dptune resume` then
    completes the sweep: every trial once, all finished, no torn row."""
    spec = tmp_path / "spec.yaml"
    # a trial whose checkpoint cannot be saved ends errored at once (no retry: Ray Tune's retries of it
    # would keep the server down for a minute before the driver's first store write waits on it)
    spec.write_text(yaml.safe_dump({**SPEC, "experiment": "outage", "axes": {**SPEC["axes"], "epochs": [2]},
                                    "failure": {"max_failures": 0}}))
    storage = server.uri("outage")
    root, store = f"{storage}/outage", f"{storage}/outage/store"
    ray_dir = tempfile.mkdtemp(prefix="rt")
    log_path = tmp_path / "sweep.log"
    log = open(log_path, "w")
    folder = tmp_path / "faults"
    try:
        sweep = dptune(["sweep", str(spec), "--storage", storage, "--quiet"], ray_dir, log, tmp_path,
                       env=faulted_env("trial_recorded@1=pause,storage_retry@1=pause", folder))
        alive = lambda: sweep.poll() is None  # noqa: E731
        await_pause(folder, "trial_recorded@1", alive)
        first = ResultsStore(store).table("trials")   # the trial recorded before the outage
        server.stop()
        resume_from_pause(folder, "trial_recorded@1")
        await_pause(folder, "storage_retry@1", alive)   # the driver waits for the server …
        server.start()                                  # … which comes back
        resume_from_pause(folder, "storage_retry@1")
        sweep.wait(timeout=600)   # it ends (exit 1 when a trial errored); the timeout only bounds a hang
        kill_tree(ray_dir)
        before = ResultsStore(store).table("trials")
        assert before.trial_id.is_unique and len(before) <= N_TRIALS
        # … and stays recorded as it ended: the outage errs no trial that ended before it (its progress
        # line, which reads the bracketing record from the storage, raised in Ray Tune's callback)
        assert first.status.tolist() == ["finished"]
        assert before.set_index("trial_id").loc[first.trial_id[0], "status"] == "finished", before[["trial_id", "status", "error"]].to_string()

        resume = dptune(["resume", root], ray_dir, log, tmp_path)
        assert resume.wait(timeout=600) == 0, log_path.read_text()[-3000:]
    finally:
        log.close()
        kill_tree(ray_dir)
        shutil.rmtree(ray_dir, ignore_errors=True)
    after = ResultsStore(store).table("trials").set_index("trial_id")
    assert len(after) == N_TRIALS and after.index.is_unique and (after.status == "finished").all(), \
        after[["status", "error"]].to_string()
    assert len(after.groupby(["epsilon", "clip_bound", "batch_size"])) == N_TRIALS
    epochs = ResultsStore(store).query("SELECT trial_id, count(*) AS n FROM epochs GROUP BY trial_id")
    assert len(epochs) == N_TRIALS and (epochs.n == 2).all()  # every trial's whole curve, once
