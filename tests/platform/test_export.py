"""`dptune export` refuses what is not a private release before it reads any checkpoint: a trial
run with reproducible randomness (or stored before the mode existed), a non-private baseline, an
unfinished trial, a store with no released model."""
import pytest

from dptune.errors import NotFound, UserError
from dptune.platform.views.export import export_release
from dptune.platform.store.results_store import ResultsStore


def stored(tmp_path, **row) -> str:
    store = tmp_path / "exp" / "store"
    ResultsStore(str(store)).write_trial({"trial_id": "t1", "cell": "digits/mlp/eps=2", "status": "finished",
                                          "epsilon": 2.0, "private": True, "randomness": "secure", **row})
    return str(tmp_path / "exp")


@pytest.mark.parametrize("row,refusal", [
    ({"randomness": "reproducible"}, "reproducible randomness"),
    ({"randomness": None}, "reproducible randomness"),
    ({"epsilon": float("inf"), "private": False}, "non-private baseline"),
    ({"status": "error"}, "not finished"),
    ({"selection_k": 3, "selected": False}, "was not selected")])
def test_export_refuses_what_is_not_a_private_release(tmp_path, row, refusal):
    with pytest.raises(UserError, match=refusal):
        export_release(stored(tmp_path, **row), str(tmp_path / "out"), trial_id="t1")
    assert not (tmp_path / "out").exists()


def test_export_without_a_release_or_with_an_unknown_trial_says_so(tmp_path):
    root = stored(tmp_path)
    with pytest.raises(UserError, match="no released model"):
        export_release(root, str(tmp_path / "out"))
    with pytest.raises(NotFound, match="no trial 'nope'"):
        export_release(root, str(tmp_path / "out"), trial_id="nope")
