"""The dptune command line: help, a short run, and one-line errors with exit code 2."""
import io
import json
import subprocess
import sys

from dptune.cli import EXIT_USAGE, main


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "dptune", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "train" in out.stdout


def test_train_prints_epochs_and_writes_json(tmp_path):
    buf = io.StringIO()
    target = tmp_path / "run.json"
    code = main(["train", "--epochs", "2", "--epsilon", "2", "--quiet", "--json", str(target)], out=buf)
    text = buf.getvalue()
    assert code == 0 and "epoch   2/2" in text and "σ=" in text
    record = json.loads(target.read_text())
    assert len(record["history"]) == 2 and record["history"][-1]["epsilon_spent"] <= 2.0


def test_bad_argument_is_one_line_not_a_traceback():
    out = subprocess.run([sys.executable, "-m", "dptune", "train", "--dataset", "nope"], capture_output=True,
                         text=True)
    assert out.returncode == EXIT_USAGE
    assert out.stderr.strip().count("\n") == 0 and "dataset must be one of" in out.stderr
    assert "Traceback" not in out.stderr
