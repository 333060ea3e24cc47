"""Store rows of a trial selected on a validation split: validation and test accuracy side by side,
labelled not private (issue 12, item 4); backbone and dataset columns carry their options."""
from dptune.platform.store.records import trial_row
from dptune.trainables.config import TrainConfig
from dptune.trainables.training import Trainer


def test_a_validation_trial_row_keeps_both_accuracies_and_the_label():
    cfg = TrainConfig(dataset="digits", model="mlp", epsilon=4.0, epochs=1, batch_size=64, learning_rate=1.0,
                      validation_fraction=0.1, model_options={"hidden": 8})
    metrics = Trainer(cfg).run_epoch()
    spec = {**cfg.to_dict(), "cell": "c", "metric": "validation_accuracy", "backbone_label": "mlp[hidden=8]",
            "dataset_label": "digits"}
    row = trial_row("t1", spec, {"history": [metrics]}, status="finished")
    assert row["accuracy"] == row["validation_accuracy"] == metrics["validation_accuracy"]
    assert row["test_accuracy"] == metrics["test_accuracy"] is not None
    assert row["validation_nonprivate"] is True
    assert (row["backbone"], row["model"], row["dataset"]) == ("mlp[hidden=8]", "mlp", "digits")
    plain = trial_row("t2", {**cfg.to_dict(), "validation_fraction": 0.0, "metric": "test_accuracy"},
                      {"history": [{"test_accuracy": 0.5}]}, status="finished")
    assert plain["validation_nonprivate"] is False and plain["accuracy"] == plain["test_accuracy"] == 0.5
    assert plain["validation_accuracy"] is None and plain["backbone"] == "mlp" and plain["metric"] == "test_accuracy"
