"""Node failure: a worker dies mid-trial; the trial resumes from its checkpoint on another node."""
import threading
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from dptune.platform.sweep.launcher import RunSettings
from dptune.platform.store.results_store import ResultsStore
from dptune.platform.sweep.driver import run_sweep
from dptune.platform.sweep.trial_config import train_config
from dptune.trainables.training import train
from faulting import await_pause, faulted_env, resume_from_pause
from sweep_plans import digits_spec, plan_of


EPOCHS = 6


def test_trial_survives_the_loss_of_its_node(tmp_path, monkeypatch):
    """The trial pauses after its second epoch's checkpoint (a fault point, so the node certainly
    dies mid-trial, however fast or slow the machine), the node is removed, the trial goes on."""
    faults = tmp_path / "faults"
    for name, value in faulted_env("trial_checkpointed@2=pause", faults).items():
        monkeypatch.setenv(name, value)   # the nodes' processes inherit it
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    doomed = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, logging_level="ERROR")
    try:
        plan = plan_of(digits_spec(epsilon=4.0, batch_size=100, epochs=EPOCHS, seeds=(5,),
                                   model_options={"hidden": 64}))
        [config] = plan.trials()
        settings = RunSettings(experiment="nodefail", storage=str(tmp_path), max_failures=3, verbose=0)
        runner = threading.Thread(target=run_sweep, args=(plan, settings))
        runner.start()
        experiment = Path(tmp_path) / "nodefail"
        await_pause(faults, "trial_checkpointed@2", alive=runner.is_alive)   # the trial waits there for us
        cluster.add_node(num_cpus=1)
        cluster.remove_node(doomed)  # kills the node with the paused trial
        resume_from_pause(faults, "trial_checkpointed@2")   # the restored trial passes the point at once
        runner.join()
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
