"""The trainable refuses a precomputed σ that was planned for another q or T, and starts a trial
again when the checkpoint it would restore from is incomplete."""
import os

import pytest
import torch
from ray import tune

from dptune.platform.sweep.tune_adapter import STATE_FILE, restorable_state

from dptune.platform.sweep.dp_trial import check_plan
from dptune.trainables.config import TrainConfig
from dptune.trainables.training import Trainer


def test_plan_mismatch_is_refused():
    trainer = Trainer(TrainConfig(dataset="digits", model="mlp", epsilon=2.0, epochs=1, batch_size=100,
                                  noise_multiplier=1.0, model_options={"hidden": 8}))
    good = {"sample_rate": 100 / 1437, "steps": 15}
    check_plan(good, trainer.plan)
    with pytest.raises(ValueError, match="noise multiplier does not give the stated"):
        check_plan({**good, "steps": 30}, trainer.plan)  # planned for twice the data
    with pytest.raises(ValueError, match="q="):
        check_plan({**good, "sample_rate": 0.05}, trainer.plan)


def test_an_incomplete_checkpoint_restores_nothing(tmp_path, capsys):
    """Ray Tune registered the checkpoint but its upload was cut (CI, an S3 outage): no state file.
    The trial starts again instead of failing at every restore."""
    (tmp_path / "cut").mkdir()
    assert restorable_state(tune.Checkpoint.from_directory(str(tmp_path / "cut"))) is None
    assert "is incomplete" in capsys.readouterr().err
    (tmp_path / "whole").mkdir()
    torch.save({"history": [{"epoch": 1}]}, os.path.join(tmp_path / "whole", STATE_FILE))
    assert restorable_state(tune.Checkpoint.from_directory(str(tmp_path / "whole"))) == {"history": [{"epoch": 1}]}
    assert restorable_state(None) is None
