"""`dptune audit` from a stored trial and on two workers: the two-worker run (local processes, one
gloo group) audits the multi-worker engine — below the accountant's ε as it is, above it with the
noise cut tenfold — and a stored trial's audit is kept beside the store and shown in the report."""
import io
import json

import pytest

from dptune.analysis.report import build_report
from dptune.cli import main
from dptune.platform.views.audit_command import audit
from dptune.platform.store.layout import ExperimentPaths
from dptune.platform.store.results_store import ResultsStore, to_json
from dptune.platform.sweep.trial_config import resolved

CONFIG = {"dataset": "digits", "model": "mlp", "model_options": {"hidden": 16}, "epsilon": 1.0, "epochs": 5,
          "batch_size": 128, "learning_rate": 0.5, "clip_bound": 1.0, "device": "cpu", "seed": 0}


@pytest.mark.parametrize("broken, packed", [(None, False), ("noise_div10", False), ("noise_div10", True)])
def test_two_workers_are_audited_as_one_engine(broken, packed):
    """Alone, or (the broken engine caught there too) as a member of a pack of two (issue 49: packs
    train on several workers too)."""
    mates = [{**CONFIG, "clip_bound": 2.0, "learning_rate": 0.1, "epsilon": 4.0}] if packed else []
    result = audit(CONFIG, workers=2, inputs=0, broken=broken, pack_with=mates)
    assert result["workers"] == 2 and result["epsilon"] == pytest.approx(1.0, rel=1e-3)
    assert result["violated"] is (broken is not None)


def test_a_stored_trial_is_audited_kept_and_reported(tmp_path):
    root = tmp_path / "exp"
    ResultsStore(str(root / "store")).write_trial(
        {"trial_id": "t1", "cell": "digits/mlp/eps=1", "status": "finished", "epsilon": 1.0, "private": True,
         "accuracy": 0.5, "clip_bound": 1.0, "batch_size": 128, "learning_rate": 0.5, "dataset": "digits",
         "backbone": "mlp", "epochs": 5.0, "config_json": to_json(resolved(CONFIG))})
    out = io.StringIO()
    code = main(["audit", "--store", str(root), "--trial", "t1", "--quiet", "--input-canaries", "50",
                 "--json", str(tmp_path / "a.json")], out=out)
    text = out.getvalue()
    assert code == 0 and "accountant: ε = 1.000" in text and "empirical lower bound" in text
    (kept,) = ExperimentPaths(str(root)).saved_audits()
    assert kept["trial_id"] == "t1" and kept == {**json.loads((tmp_path / "a.json").read_text()), **kept}
    assert kept["inputs"]["canaries"] == 50 and kept["gradient"]["canaries"] == 1000
    page = build_report(ResultsStore(str(root / "store")))
    assert "Privacy audit (one training run)" in page and f"{kept['lower_bound']:.3f}" in page


def test_audit_needs_one_source(capsys):
    assert main(["audit"], out=io.StringIO()) == 2
    assert "give either SPEC or --store and --trial" in capsys.readouterr().err


def test_a_pack_member_is_audited_in_its_pack(tmp_path):
    """Issue 47: a stored member (trial id <pack>-m<k>) is audited as a member of its pack, by the
    packed engine, with its pack-mates' configurations; the broken engine is caught there too."""
    root = tmp_path / "exp"
    store = ResultsStore(str(root / "store"))
    mates = {"p1-m0": dict(clip_bound=0.5, learning_rate=0.2, epsilon=4.0), "p1-m1": {},
             "p1-m2": dict(clip_bound=2.0, learning_rate=0.1, epsilon=2.0), "p2": {}}
    for trial_id, changes in mates.items():
        config = resolved({**CONFIG, **changes})
        store.write_trial({"trial_id": trial_id, "cell": "digits/mlp", "status": "finished", "epsilon": config["epsilon"],
                           "private": True, "config_json": to_json(config)})
    out = io.StringIO()
    code = main(["audit", "--store", str(root), "--trial", "p1-m1", "--quiet", "--input-canaries", "0",
                 "--broken", "noise_div10", "--json", str(tmp_path / "a.json")], out=out)
    assert code == 0 and "as a member of its pack of 3" in out.getvalue()
    result = json.loads((tmp_path / "a.json").read_text())
    assert result["violated"] and result["epsilon"] == pytest.approx(1.0, rel=1e-3)
