"""Driver failure: `dptune sweep` SIGKILLed mid-sweep (at a named point of its cycle: right after it
recorded its second trial); `dptune resume` completes it exactly once."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
import yaml

from dptune.platform.store.results_store import ResultsStore
from faulting import await_pause, faulted_env
from sweep_plans import levers_off

SPEC = {
    "experiment": "drv", "axes": {"epsilon": [2, 8], "backbone": ["mlp"], "dataset": ["digits"], "epochs": [2]},
    "clip_bound": [0.5, 2], "batch_size": [128, 256], "learning_rate": {"reference": 1.0, "reference_batch_size": 128, "multipliers": [1]},
    "pruning": {"min_steps": 5, "plateau_tol": 0.5, "max_batch_sizes": 2}, 
    "search": levers_off({"algorithm": "grid"}),
    "resources": {"cpu": 1}, "failure": {"max_failures": 1},
}
N_TRIALS = 2 * 2 * 2  # ε × C × kept B


def dptune(args, ray_dir, log, cwd=None, env=None):
    """`dptune ARGS` in its own session with its own Ray folder, output to ``log``."""
    env = {**(env or os.environ), "RAY_TMPDIR": ray_dir}
    return subprocess.Popen([sys.executable, "-m", "dptune", *args], stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True, cwd=cwd)


def killed_at(sweep: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    """Wait for a driver that kills itself at its fault point (and its process group)."""
    code = sweep.wait(timeout=timeout)
    assert code == -signal.SIGKILL, f"the sweep was not killed at its fault point (exit {code}): " + \
        log.read_text()[-2000:]
    try:
        os.killpg(sweep.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_tree(ray_dir):
    """Kill every process of the sweep's Ray instance (they all name its temporary folder)."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if ray_dir in " ".join(proc.info["cmdline"] or []):
                proc.kill()
        except psutil.Error:
            pass


def killed_then_resumed(tmp_path: Path, spec: dict, fault: str, between) -> Path:
    """Run `dptune sweep` on ``spec`` until it kills itself at ``fault``, kill its Ray, call
    ``between(experiment folder)``, then `dptune resume` it to its end; returns the experiment folder."""
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump({**spec, "storage": str(tmp_path / "results")}))
    ray_dir = tempfile.mkdtemp(prefix="rt")  # short: Ray's socket paths must fit 107 characters
    experiment = tmp_path / "results" / spec["experiment"]
    log = open(tmp_path / "sweep.log", "w")
    try:
        sweep = dptune(["sweep", str(spec_file), "--quiet"], ray_dir, log,
                       env={**os.environ, "DPTUNE_FAULTS": fault})
        killed_at(sweep, tmp_path / "sweep.log")
        kill_tree(ray_dir)
        between(experiment)
        resume = dptune(["resume", str(experiment)], ray_dir, log)
        assert resume.wait(timeout=600) == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    finally:
        log.close()
        kill_tree(ray_dir)
        shutil.rmtree(ray_dir, ignore_errors=True)
    return experiment


def test_resume_after_the_driver_is_killed(tmp_path):
    stored = {}

    def two_recorded(experiment: Path) -> None:
        stored["before"] = ResultsStore(str(experiment / "store")).table("trials").set_index("trial_id")
        assert len(stored["before"]) == 2

    experiment = killed_then_resumed(tmp_path, SPEC, "trial_recorded@2=kill", two_recorded)
    before = stored["before"]
    after = ResultsStore(str(experiment / "store")).table("trials").set_index("trial_id")
    assert len(after) == N_TRIALS and after.index.is_unique and (after.status == "finished").all()
    assert after.cell.nunique() == 2 and len(after.groupby(["epsilon", "clip_bound", "batch_size"])) == N_TRIALS
    # trials that had finished before the kill were not trained again: same results, same training time
    finished_before = before[before.status == "finished"]
    for column in ("accuracy", "train_time_s", "epsilon_spent"):
        assert (after.loc[finished_before.index, column] == finished_before[column]).all(), column


def drop_unended_trials(experiment: Path) -> int:
    """Make Ray Tune's trial snapshot lag the searcher's, as an S3 upload cut by a kill leaves it:
    the trials after the first that had not ended are removed from the trial list (the searcher's
    state, written just after it, still has them handed out; Ray Tune cannot restore an empty
    list). Returns how many were removed."""
    dropped = 0
    for path in experiment.glob("experiment_state-*.json"):
        state = json.loads(path.read_text())
        first, *rest = state["trial_data"]
        kept = [first, *(t for t in rest if json.loads(t[0])["status"] in ("TERMINATED", "ERROR"))]
        dropped += len(state["trial_data"]) - len(kept)
        path.write_text(json.dumps({**state, "trial_data": kept}))
    return dropped


def test_resume_trains_what_the_searcher_handed_out_and_the_trial_snapshot_lost(tmp_path):
    """Issue 23: `dptune resume` after a kill once trials were handed out, with Ray Tune's trial list
    older than the searcher's state: every planned configuration ends exactly once (before the fix,
    the lost ones were never trained and resume exited 0). The kill is at the searcher's third
    snapshot: Ray Tune adds one trial per step and snapshots each step, so two trials are out."""
    def lagging(experiment: Path) -> None:
        assert drop_unended_trials(experiment) >= 1

    small = {**SPEC, "experiment": "lag", "axes": {**SPEC["axes"], "epsilon": [2]}}
    experiment = killed_then_resumed(tmp_path, small, "searcher_saved@3=kill", lagging)
    after = ResultsStore(str(experiment / "store")).table("trials")
    assert len(after) == 4 and (after.status == "finished").all()
    assert len(after.groupby(["clip_bound", "batch_size"])) == 4


def test_a_pack_killed_mid_run_and_resumed_records_each_member_once(tmp_path):
    """Issue 36: the driver is killed while a pack of four (two ε × two η) is paused after its first
    epoch's checkpoint; `dptune resume` ends it. Every member has its row once, its curve's three
    epochs once, and the results of the same configurations run apart, uninterrupted."""
    spec = {**SPEC, "experiment": "packed", "axes": {**SPEC["axes"], "epochs": [3]}, "clip_bound": [2],
            "batch_size": [128], "learning_rate": {"reference": 1.0, "reference_batch_size": 128, "multipliers": [1, 4]},
            "pruning": {"min_steps": 1, "plateau_tol": 100, "max_batch_sizes": 1},
            "search": levers_off({"algorithm": "grid", "pack": "on"}),
            "resources": {**SPEC["resources"], "max_concurrent": 1}}   # one slot: the four in one pack, not split over two
    apart = {**spec, "experiment": "apart", "search": levers_off({"algorithm": "grid"}),
             "resources": SPEC["resources"]}
    ray_dir = tempfile.mkdtemp(prefix="rt")
    faults = tmp_path / "faults"
    log = open(tmp_path / "sweep.log", "w")
    try:
        for s in (spec, apart):
            (tmp_path / f"{s['experiment']}.yaml").write_text(yaml.safe_dump({**s, "storage": str(tmp_path / "results")}))
        reference = dptune(["sweep", str(tmp_path / "apart.yaml"), "--quiet"], ray_dir, log)
        assert reference.wait(timeout=600) == 0, (tmp_path / "sweep.log").read_text()[-3000:]
        kill_tree(ray_dir)
        sweep = dptune(["sweep", str(tmp_path / "packed.yaml"), "--quiet"], ray_dir, log,
                       env=faulted_env("trial_checkpointed@1=pause", faults))
        await_pause(faults, "trial_checkpointed@1", alive=lambda: sweep.poll() is None)
        os.killpg(sweep.pid, signal.SIGKILL)   # the driver, mid-pack
        sweep.wait()
        kill_tree(ray_dir)                     # and its Ray, the paused pack with it
        resume = dptune(["resume", str(tmp_path / "results" / "packed")], ray_dir, log)
        assert resume.wait(timeout=600) == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    finally:
        log.close()
        kill_tree(ray_dir)
        shutil.rmtree(ray_dir, ignore_errors=True)
    packed = ResultsStore(str(tmp_path / "results" / "packed" / "store"))
    rows, epochs = packed.table("trials"), packed.table("epochs")
    alone = ResultsStore(str(tmp_path / "results" / "apart" / "store")).table("trials").set_index("config_id")
    assert len(rows) == 4 and rows.trial_id.is_unique and (rows.status == "finished").all()
    assert rows.trial_id.str.fullmatch(r".+-m[0-3]").all() and rows.trial_id.str[:-3].nunique() == 1   # one pack
    assert sorted(rows.config_id) == sorted(alone.index)
    for _, row in rows.iterrows():
        curve = epochs[epochs.trial_id == row.trial_id]
        assert sorted(curve.epoch) == [1, 2, 3]
        theirs = alone.loc[row.config_id]
        assert row.accuracy == pytest.approx(theirs.accuracy, abs=1 / 360)
        assert row.loss == pytest.approx(theirs.loss, rel=1e-4)
        assert row.epsilon_spent == theirs.epsilon_spent
