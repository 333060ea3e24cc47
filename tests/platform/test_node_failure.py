"""Node failure: a worker dies mid-trial; the trial resumes from its checkpoint on another node."""
import threading
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from dptune.platform.launcher import RunSettings
from dptune.platform.store import ResultsStore
from dptune.platform.sweep import run_sweep
from dptune.platform.trial_config import train_config
from dptune.trainables.training import train
from sweep_plans import digits_spec, plan_of


EPOCHS = 150


def checkpointed(experiment: Path) -> bool:
    """A checkpoint after the second epoch or later exists (older ones are rotated away)."""
    return any(int(p.name.rsplit("_", 1)[1]) >= 1 for p in experiment.glob("*/checkpoint_*"))


def test_trial_survives_the_loss_of_its_node(tmp_path):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    doomed = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, logging_level="ERROR")
    try:
        # Long enough (in epochs) that the node dies mid-trial however fast the DP step is.
        plan = plan_of(digits_spec(epsilon=4.0, batch_size=100, epochs=EPOCHS, seeds=(5,),
                                   model_options={"hidden": 64}))
        [config] = plan.trials()
        settings = RunSettings(experiment="nodefail", storage=str(tmp_path), max_failures=3, verbose=0)
        runner = threading.Thread(target=run_sweep, args=(plan, settings))
        runner.start()
        experiment = Path(tmp_path) / "nodefail"
        deadline = time.time() + 240
        while not checkpointed(experiment) and time.time() < deadline:
            time.sleep(0.05)  # wait until two epochs are checkpointed on the doomed node
        assert checkpointed(experiment), "the trial never checkpointed"
        cluster.add_node(num_cpus=1)
        cluster.remove_node(doomed)  # kills the node with the running trial
        runner.join(timeout=300)
        assert not runner.is_alive()
        trial_dir = next(p for p in experiment.iterdir() if p.is_dir() and p.name.startswith("dp_trainable"))
        failures = (trial_dir / "error.txt").read_text() if (trial_dir / "error.txt").exists() else ""
    finally:
        ray.shutdown()
        cluster.shutdown()

    store = ResultsStore(settings.paths.store)
    rows = store.table("trials")
    assert "node" in failures.lower() or "actor" in failures.lower(), "the node was not lost mid-trial"
    assert len(rows) == 1 and rows.status.iloc[0] == "finished"
    epochs = store.table("epochs").sort_values("epoch")
    assert epochs.epoch.tolist() == list(range(1, EPOCHS + 1))  # none lost, none duplicated
    # Resumed from the checkpoint (RNG states included): same result as a run never interrupted.
    reference = train(train_config(config), progress=False)
    assert rows.accuracy.iloc[0] == pytest.approx(reference[-1]["test_accuracy"], abs=1e-12)
    assert epochs.accuracy.tolist() == pytest.approx([m["test_accuracy"] for m in reference], abs=1e-12)
