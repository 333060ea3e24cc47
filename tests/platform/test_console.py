"""What a user watching `dptune sweep` sees (issue 50): an errored trial's line says why, Ray Tune's
tracebacks stay in the trial's error file (whose path `dptune status` shows) unless --verbose, and
what a trial prints goes to its own log in its folder."""
from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

from ray import tune

from dptune.platform.sweep.tune_adapter import TRIAL_LOG, trial_output
from faulting import faulted_env

SPEC = """
axes: {epsilon: [2], delta: 1.0e-5, backbone: [mlp], dataset: [digits], epochs: [1]}
clip_bound: [1]
batch_size: [64]
learning_rate: {reference: 1.0, reference_batch_size: 64}
pruning: {min_steps: 5}
search: {scheduler: none, proxy: off, transfer: off, bracket: off, pack: off}
experiment: bad
"""
#: The injected error every attempt of the trial raises (its process's first pass of the point).
MESSAGE = "FaultInjected: fault injected at trial_entered@1"


def sweep(tmp_path: Path, *flags: str) -> tuple[int, str]:
    """`dptune sweep` in its own process, each trial raising an unexpected error: exit code, console."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    done = subprocess.run([sys.executable, "-m", "dptune", "sweep", str(spec), "--quiet", "--storage",
                           str(tmp_path / "results"), *flags], capture_output=True, text=True, timeout=600,
                          env=faulted_env("trial_entered@1=raise", tmp_path))
    return done.returncode, done.stdout + done.stderr


def test_an_errored_trial_says_why_in_one_line_and_its_traceback_stays_in_its_error_file(tmp_path):
    code, console = sweep(tmp_path)
    assert code == 1, console[-3000:]
    errored = [line for line in console.splitlines() if " ERRORED " in line]
    assert len(errored) == 1 and errored[0].endswith(MESSAGE), console[-3000:]
    assert "Traceback" not in console and "Trial task failed" not in console and "did not complete" not in console
    experiment = tmp_path / "results" / "bad"
    (error_file,) = experiment.glob("dp_trainable_*/error.txt")
    text = error_file.read_text()
    assert text.count("Failure #") == 3 and text.count("in fault_point") == 3   # each attempt's stack (two retries)
    assert (error_file.parent / TRIAL_LOG).is_file()
    assert f"dptune status {experiment}" in console
    status = subprocess.run([sys.executable, "-m", "dptune", "status", str(experiment)], capture_output=True,
                            text=True, timeout=300)
    assert status.returncode == 0, status.stderr
    assert "errored trials (1):" in status.stdout and MESSAGE in status.stdout
    assert f"traceback: {error_file}" in status.stdout


def test_verbose_shows_ray_tunes_tracebacks(tmp_path):
    code, console = sweep(tmp_path, "--verbose")
    assert code == 1 and console.count("Trial task failed") == 3 and "Traceback" in console


def test_what_a_trial_prints_goes_to_its_log(local_ray, tmp_path):
    def noisy(config: dict) -> None:
        with trial_output():
            print("Converting and de-quantizing GGUF tensors: 50%", file=sys.stderr)
            print("step 1 of 2")
            warnings.warn("a library's warning")
            tune.report({"done": 1})

    tune.Tuner(noisy, run_config=tune.RunConfig(name="noisy", storage_path=str(tmp_path))).fit()
    (log,) = (tmp_path / "noisy").glob(f"noisy_*/{TRIAL_LOG}")
    text = log.read_text()
    assert "de-quantizing GGUF tensors: 50%" in text and "step 1 of 2" in text and "a library's warning" in text
    with trial_output() as path:   # outside a trial: nothing captured, nowhere written
        assert path is None
