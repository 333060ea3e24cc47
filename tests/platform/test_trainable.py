"""The trainable refuses a precomputed σ that was planned for another q or T."""
import pytest

from dptune.platform.trainable import check_plan
from dptune.trainables.config import TrainConfig
from dptune.trainables.training import Trainer


def test_plan_mismatch_is_refused():
    trainer = Trainer(TrainConfig(dataset="digits", model="mlp", epsilon=2.0, epochs=1, batch_size=100,
                                  noise_multiplier=1.0, model_options={"hidden": 8}))
    good = {"sample_rate": 100 / 1437, "steps": 15}
    check_plan(good, trainer)
    with pytest.raises(ValueError, match="noise multiplier does not give the stated"):
        check_plan({**good, "steps": 30}, trainer)  # planned for twice the data
    with pytest.raises(ValueError, match="q="):
        check_plan({**good, "sample_rate": 0.05}, trainer)
