"""The object store goes away: store writes wait for a restarted server (bounded, with backoff) or
fail with one line and publish nothing; a sweep whose S3 server restarts mid-sweep, resumed with
`dptune resume s3://…`, ends with every trial exactly once."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from types import SimpleNamespace

import pyarrow.fs as pafs
import pytest
import torch
import yaml
from ray import tune

from dptune.platform.callbacks import StoreCallback
from dptune.platform.layout import ExperimentPaths
from dptune.platform.tune_adapter import STATE_FILE

from dptune.platform.store import ResultsStore, StoreWriteError
from s3_server import serving, started
from test_driver_failure import SPEC, kill_tree

N_TRIALS = 8


@pytest.fixture
def server(tmp_path):
    """A SeaweedFS server of this test alone (it is stopped and restarted), AWS variables set."""
    with serving(started(tmp_path / "seaweedfs")) as server:
        yield server


def test_a_store_write_waits_for_the_server_to_come_back(server):
    store = ResultsStore(server.uri("restart", "store"))
    store.write_trial({"trial_id": "a", "accuracy": 0.5}, epochs=[{"epoch": 1, "accuracy": 0.5}])
    server.stop()
    restart = threading.Timer(3.0, server.start)
    restart.start()
    start = time.monotonic()
    store.write_trial({"trial_id": "b", "accuracy": 0.75}, epochs=[{"epoch": e, "accuracy": e / 10} for e in (1, 2)])
    waited = time.monotonic() - start
    restart.join()
    assert waited >= 3.0  # it really was written to the restarted server
    fresh = ResultsStore(server.uri("restart", "store"))
    assert fresh.query("SELECT trial_id, accuracy FROM trials ORDER BY trial_id").values.tolist() == [["a", 0.5], ["b", 0.75]]
    assert fresh.query("SELECT count(*) FROM epochs WHERE trial_id = 'b'").iloc[0, 0] == 2


def test_a_trial_ending_during_an_outage_keeps_its_curve(server, tmp_path):
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
    server.stop()
    restart = threading.Timer(3.0, server.start)
    restart.start()
    callback.on_trial_complete(0, [], trial)
    restart.join()
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


def dptune(args, ray_dir, log, cwd):
    env = {**os.environ, "RAY_TMPDIR": ray_dir}
    return subprocess.Popen([sys.executable, "-m", "dptune", *args], stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True, cwd=cwd)


def test_server_restarted_mid_sweep_then_resumed(server, tmp_path):
    """The server is down for 5 s mid-sweep: the driver's store writes wait for it, trials whose
    checkpoints could not be saved are retried or end errored; `dptune resume` then completes
    the sweep: every trial once, all finished, no torn row."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "experiment": "outage", "axes": {**SPEC["axes"], "epochs": [2]}}))
    storage = server.uri("outage")
    root, store = f"{storage}/outage", f"{storage}/outage/store"
    ray_dir = tempfile.mkdtemp(prefix="rt")
    log_path = tmp_path / "sweep.log"
    log = open(log_path, "w")
    try:
        sweep = dptune(["sweep", str(spec), "--storage", storage, "--quiet"], ray_dir, log, tmp_path)
        client = server.filesystem()
        deadline = time.time() + 100
        while time.time() < deadline and sweep.poll() is None:
            files = client.get_file_info(pafs.FileSelector(f"{server.bucket}/outage/outage/store/trials",
                                                           allow_not_found=True))
            if sum(f.base_name.startswith("trial-") for f in files) >= 1:
                break
            time.sleep(0.3)
        assert sweep.poll() is None, "the sweep ended before the outage: " + log_path.read_text()[-2000:]
        server.stop()
        time.sleep(5)
        server.start()
        try:
            sweep.wait(timeout=100)
        except subprocess.TimeoutExpired:
            os.killpg(sweep.pid, signal.SIGKILL)
            sweep.wait()
        kill_tree(ray_dir)
        before = ResultsStore(store).table("trials")
        assert before.trial_id.is_unique and len(before) <= N_TRIALS

        resume = dptune(["resume", root], ray_dir, log, tmp_path)
        assert resume.wait(timeout=100) == 0, log_path.read_text()[-3000:]
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
