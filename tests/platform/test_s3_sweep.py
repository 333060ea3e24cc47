"""The whole experiment on object storage: `dptune sweep --storage s3://…` on a real S3 server
(SeaweedFS, 127.0.0.1) writes Ray Tune's experiment state and the results store there; the driver
is SIGKILLed mid-sweep (right after it recorded its first trial); `dptune resume s3://…` completes it with every trial once; `dptune query`,
`heatmap` and `report` read the store from S3. Local caches (σ, datasets) stay local."""
import os
import shutil
import subprocess
import sys
import tempfile

import pyarrow.fs as pafs
import yaml

from dptune.platform.store.results_store import ResultsStore
from test_driver_failure import SPEC, dptune, kill_tree, killed_at

#: the driver-failure spec made smaller (one ε, two epochs): 2 C × 2 B = 4 trials
SMALL = {**SPEC, "experiment": "drv", "axes": {**SPEC["axes"], "epsilon": [8], "epochs": [2]}}
N_TRIALS = 4


def test_sweep_kill_resume_query_on_s3(s3, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**SMALL, "storage": str(tmp_path / "unused-local")}))
    storage = s3.uri("sweeps")
    root, store = f"{storage}/drv", f"{storage}/drv/store"
    client = s3.filesystem()  # an independent client: what is really on the server
    trials_prefix = f"{s3.bucket}/sweeps/drv/store/trials"
    ray_dir = tempfile.mkdtemp(prefix="rt")
    log_path = tmp_path / "sweep.log"
    log = open(log_path, "w")
    try:
        sweep = dptune(["sweep", str(spec), "--storage", storage, "--quiet"], ray_dir, log, tmp_path,
                       env={**os.environ, "DPTUNE_FAULTS": "trial_recorded@1=kill"})
        killed_at(sweep, log_path)
        kill_tree(ray_dir)
        files = client.get_file_info(pafs.FileSelector(trials_prefix, allow_not_found=True))
        assert sum(f.base_name.startswith("trial-") for f in files) == 1   # what the server holds
        before = ResultsStore(store).table("trials").set_index("trial_id")
        assert len(before) == 1

        resume = dptune(["resume", root], ray_dir, log, tmp_path)
        assert resume.wait(timeout=600) == 0, log_path.read_text()[-3000:]
    finally:
        log.close()
        kill_tree(ray_dir)
        shutil.rmtree(ray_dir, ignore_errors=True)

    # Ray Tune's experiment state, dptune's settings and the store are on the server; nothing went local
    names = {f.path.removeprefix(f"{s3.bucket}/sweeps/drv/") for f in
             client.get_file_info(pafs.FileSelector(f"{s3.bucket}/sweeps/drv", recursive=True))}
    assert "dptune_settings.json" in names and any(n.startswith("experiment_state-") for n in names), sorted(names)
    assert not (tmp_path / "unused-local").exists() and not (tmp_path / "s3:").exists()

    after = ResultsStore(store).table("trials").set_index("trial_id")
    shown = after[["status", "clip_bound", "batch_size", "written_at"]].to_string()
    assert len(after) == N_TRIALS and after.index.is_unique and (after.status == "finished").all(), \
        shown + "\nbefore:\n" + before[["status", "clip_bound", "batch_size"]].to_string() + "\n" + \
        log_path.read_text()[-4000:]
    assert len(after.groupby(["epsilon", "clip_bound", "batch_size"])) == N_TRIALS
    finished_before = before[before.status == "finished"]
    for column in ("accuracy", "train_time_s", "epsilon_spent"):  # kept, not trained again
        assert (after.loc[finished_before.index, column] == finished_before[column]).all(), column

    run = lambda *args: subprocess.run([sys.executable, "-m", "dptune", *args], capture_output=True, text=True,
                                       cwd=tmp_path, timeout=600)
    query = run("query", "SELECT count(*) AS n, count(DISTINCT trial_id) AS d FROM trials", "--store", root,
                "--format", "csv")
    assert query.returncode == 0, query.stderr
    assert query.stdout.split() == ["n,d", f"{N_TRIALS},{N_TRIALS}"]
    heatmap = run("heatmap", "--store", root, "--out", str(tmp_path / "hm"))
    assert heatmap.returncode == 0, heatmap.stderr
    assert list((tmp_path / "hm").glob("*.png"))
    report = run("report", "--store", store, "--out", str(tmp_path / "rep"))
    assert report.returncode == 0, report.stderr
    assert "<html" in (tmp_path / "rep" / "report.html").read_text().lower()
