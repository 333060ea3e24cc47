"""Issue 27: `dptune status` during a real local sweep (its driver paused at a named point just after
the first trial's rows are written, so trials are still running or pending) and after it."""
import io
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

from dptune.cli import main
from dptune.platform.store.results_store import ResultsStore
from dptune.platform.views.status import best_setting
from faulting import await_pause, faulted_env, resume_from_pause
from sweep_plans import levers_off

SPEC = {
    "experiment": "watched", "axes": {"epsilon": [2, 8], "backbone": [{"name": "mlp", "hidden": 16}],
                                      "dataset": ["digits"], "epochs": [2]},
    "clip_bound": [0.5, 2], "batch_size": [256], "learning_rate": {"reference": 1.0, "reference_batch_size": 256,
                                                                    "multipliers": [1]},
    "pruning": {"min_steps": 1, "plateau_tol": 100.0}, "search": levers_off({"algorithm": "grid"}),
    "resources": {"cpu": 1},
}
PLANNED = 4   # 2 ε × 2 C, one B, one η
EPOCHS = 2


def status_of(experiment) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["status", str(experiment)], out=out)
    return code, out.getvalue()


def rows_of(text: str) -> dict[str, dict]:
    """{cell: {column: value}} of the printed table (the cell names hold no spaces)."""
    lines = text.splitlines()
    header = lines[0].split()
    rows = {}
    for line in lines[1:]:
        if not line.startswith("digits"):
            break
        parts = line.split()
        rows[parts[0]] = dict(zip(header[1:6], map(int, parts[1:6])))
    return rows


def test_status_during_a_running_sweep_and_after(tmp_path):
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump({**SPEC, "storage": str(tmp_path / "results")}))
    experiment = tmp_path / "results" / "watched"
    faults = tmp_path / "faults"
    ray_dir = tempfile.mkdtemp(prefix="rt")
    log = open(tmp_path / "sweep.log", "w")
    env = {**faulted_env("trial_recorded@1=pause", faults), "RAY_TMPDIR": ray_dir}
    sweep = subprocess.Popen([sys.executable, "-m", "dptune", "sweep", str(spec_file), "--quiet"], stdout=log,
                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        await_pause(faults, "trial_recorded@1", alive=lambda: sweep.poll() is None)
        code, text = status_of(experiment)
        assert code == 0, text
        rows = rows_of(text)
        assert len(rows) == 2  # the two ε cells
        total = {k: sum(r[k] for r in rows.values()) for k in ("finished", "running", "pending", "stopped", "errored")}
        assert total["finished"] == len(ResultsStore(str(experiment / "store")).table("trials")) == 1
        assert sum(total.values()) == PLANNED
        assert total["running"] + total["pending"] == PLANNED - 1
        assert "of at most 8 planned" in text  # 4 trials × 2 epochs
        assert "ETA" in text or total["running"] + total["pending"] == 0
        resume_from_pause(faults, "trial_recorded@1")
        assert sweep.wait(timeout=600) == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, 9)
        log.close()
        shutil.rmtree(ray_dir, ignore_errors=True)
    code, text = status_of(experiment)
    rows = rows_of(text)
    assert sum(r["finished"] for r in rows.values()) == PLANNED
    assert all(r["running"] == r["pending"] == 0 for r in rows.values())
    trials = ResultsStore(str(experiment / "store")).table("trials")
    for cell, best in trials.groupby("cell").accuracy.max().items():
        line = next(line for line in text.splitlines() if line.split()[0] == cell)
        assert f"{best:.3f} (C=" in line and f"{2 * EPOCHS}/{2 * EPOCHS}" in line
    assert "nothing running or pending" in text


def test_status_of_a_folder_without_a_sweep_is_a_clear_error(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 2
    assert "no sweep here" in capsys.readouterr().err


def test_best_is_the_mean_over_seeds_the_closing_lines_give():
    """Issue 33, item 7: status names the setting with the best mean over seeds of complete runs, not the
    best single draw (a lucky seed), and leaves stopped runs out."""
    import pandas as pd

    rows = [  # (C, B, η, seed, status, accuracy): A has the best draw (0.9), B the best mean (0.8)
        (1.0, 64, 0.5, 0, "finished", 0.9), (1.0, 64, 0.5, 1, "finished", 0.5), (1.0, 64, 0.5, 2, "finished", 0.55),
        (3.0, 64, 0.5, 0, "finished", 0.8), (3.0, 64, 0.5, 1, "equivalent", 0.82), (3.0, 64, 0.5, 2, "finished", 0.78),
        (0.3, 64, 0.5, 0, "stopped", 0.95)]
    frame = pd.DataFrame(rows, columns=["clip_bound", "batch_size", "learning_rate", "seed", "status", "accuracy"])
    assert best_setting(frame) == "0.800 (C=3, B=64, η=0.5; 3 seeds)"
    assert best_setting(frame.iloc[-1:]) == "—"
