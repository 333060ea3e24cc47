"""The fault points tests stop the driver at: parsed strictly, counted per point, a no-op unset."""
from collections import Counter

import pytest

from dptune.platform import faults


def test_faults_are_parsed_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.setenv("DPTUNE_FAULTS", "trial_recorded@2=kill, storage_retry@1=pause")
    assert faults.faults() == {("trial_recorded", 2): "kill", ("storage_retry", 1): "pause"}
    for bad in ("trial_recorded=kill", "trial_recorded@x=kill", "trial_recorded@1=explode"):
        monkeypatch.setenv("DPTUNE_FAULTS", bad)
        with pytest.raises(ValueError, match="DPTUNE_FAULTS"):
            faults.faults()


def test_a_point_pauses_on_its_kth_pass_only(monkeypatch, tmp_path):
    monkeypatch.setattr(faults, "_passed", Counter())
    monkeypatch.delenv("DPTUNE_FAULTS", raising=False)
    faults.fault_point("trial_recorded")            # unset: nothing counted, nothing done
    assert faults._passed == Counter()
    monkeypatch.setenv("DPTUNE_FAULTS", "trial_recorded@2=pause")
    monkeypatch.setenv("DPTUNE_FAULT_DIR", str(tmp_path))
    (tmp_path / "trial_recorded@2.go").touch()      # the test has already said go: it does not block
    faults.fault_point("trial_recorded")
    assert not (tmp_path / "trial_recorded@1.paused").exists()
    faults.fault_point("trial_recorded")
    assert (tmp_path / "trial_recorded@2.paused").exists() and faults._passed["trial_recorded"] == 2
