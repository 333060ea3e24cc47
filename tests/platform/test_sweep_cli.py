"""`dptune sweep` refuses to run an experiment again into the same folder (issue 17, friction #1):
a store must never mix two runs of one configuration unknowingly."""
from __future__ import annotations

import io

import pytest
import ray

from dptune.cli import EXIT_USAGE, _refuse_earlier_run, main
from dptune.errors import UserError
from dptune.platform.store.layout import SETTINGS_FILE, ExperimentPaths
from dptune.platform.store.results_store import ResultsStore

TINY_SPEC = """
axes: {epsilon: [2], delta: 1.0e-5, backbone: [mlp], dataset: [digits], epochs: [1]}
clip_bound: [1]
batch_size: [64]
learning_rate: {reference: 1.0, reference_batch_size: 64}
pruning: {min_steps: 5}
search: {scheduler: none, proxy: off, transfer: off}
experiment: again
"""


def test_an_experiment_that_ran_is_refused_before_anything_launches(tmp_path, capsys):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY_SPEC)
    paths = ExperimentPaths.of(str(tmp_path / "results"), "again")
    ResultsStore(paths.store).write_trial({"trial_id": "t0", "accuracy": 0.5})  # an earlier run's row
    code = main(["sweep", str(spec), "--storage", str(tmp_path / "results"), "--quiet"], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and err.count("\n") == 1, err
    assert f"experiment folder {paths.root} already holds a run" in err
    assert f"dptune resume {paths.root}" in err and "--overwrite" in err
    assert not ray.is_initialized()  # refused before Ray started
    assert ResultsStore(paths.store).query("SELECT count(*) AS n FROM trials")["n"].item() == 1  # untouched


def test_overwrite_deletes_the_earlier_run_and_an_empty_folder_is_fine(tmp_path):
    paths = ExperimentPaths.of(str(tmp_path), "exp")
    (tmp_path / "exp").mkdir()
    _refuse_earlier_run(paths, overwrite=False, out=io.StringIO())  # empty: nothing to mix with
    ResultsStore(paths.store).write_trial({"trial_id": "t0"})
    (tmp_path / "exp" / SETTINGS_FILE).write_text("{}")
    out = io.StringIO()
    _refuse_earlier_run(paths, overwrite=True, out=out)
    assert not (tmp_path / "exp").exists() and "deleting the earlier run" in out.getvalue()


def test_overwrite_deletes_nothing_but_a_dptune_run(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("print('mine')")
    with pytest.raises(UserError, match="deletes only an earlier dptune run"):
        _refuse_earlier_run(ExperimentPaths.of(str(tmp_path), "src"), overwrite=True, out=io.StringIO())
    assert (tmp_path / "src" / "main.py").read_text() == "print('mine')"
