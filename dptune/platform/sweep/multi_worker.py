"""One trial on W workers: a Ray Train ``TorchTrainer`` nested in the trial's Ray Tune function.

With ``resources: {workers: W}`` (W > 1) a trial's Tune function reserves no resources itself and
starts a ``TorchTrainer`` with W workers of ``cpu``/``gpu`` each (one process group per trial: gloo
on CPU, NCCL on GPU), Ray's supported way to nest Train in Tune. Every worker runs the same trial body
(:func:`dptune.platform.sweep.dp_trial.train_trial`: a single trial's run or a pack's) with
:class:`~dptune.trainables.engine.distributed.ProcessGroupWorkers`: the same global Poisson batch split into
shards, the clipped sums (a pack's: each member's) all-reduced, the noise drawn once (identically on every
worker), identical optimizer steps (see :mod:`dptune.trainables.engine.distributed`); a pack's members
the scheduler stopped are read by rank 0 once this trial's Tune function has relayed the epoch's
report (the scheduler decides while Tune's report blocks; a queue tells rank 0 it returned) and
retired on every worker.

Checkpoints: after every epoch rank 0 reports the run's state (weights, optimizer, the generators,
which are in the same state on every worker, step, history) as a Ray Train checkpoint; the Tune
function relays each report to Ray Tune with the same state, so the store callback, schedulers
and ``dptune resume`` see a multi-worker trial exactly as a one-worker one. A worker failure
restarts the trial's worker group from Train's latest checkpoint (Ray Train's ``FailureConfig``);
a trial restored by Tune resumes from Tune's checkpoint. A checkpoint resumes only on as many
workers as wrote it (the shards depend on W): another W is refused before any worker starts.

A scheduler that stops a multi-worker trial early (after one of its reports) aborts its Train run.
"""
from __future__ import annotations

import queue as std_queue
import threading

import ray
import ray.train
from ray import tune

from ...trainables.epoch_loop import TrialDiverged, divergence
from ...trainables.training import check_workers
from . import tune_adapter
from .spec_sections import Resources
from .dp_trial import stopped_members, train_trial
from .trial_config import PACK



def run_on_workers(config: dict, resources: Resources, *, max_failures: int, storage: str) -> None:
    """The Tune side of a multi-worker trial: start its Train run on ``resources.workers`` workers
    (Ray Train keeps it under ``storage``; ``max_failures`` worker-group restarts), relay every
    epoch's report (metrics and state) to Tune, and raise what the run raised."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.queue import Empty, Queue

    restored = tune.get_checkpoint()
    state = tune_adapter.restorable_state(restored)
    if state is None:
        restored = None   # none, or incomplete: every worker starts the trial again
    else:
        check_workers(state.get("trainer") or state["pack"], resources.workers)   # before any worker starts
    reports = Queue(actor_options={"num_cpus": 0})
    relayed = Queue(actor_options={"num_cpus": 0}) if PACK in config else None   # a pack's stops wait for it
    per_worker = {"CPU": resources.cpu, **({"GPU": resources.gpu} if resources.gpu else {})}
    trainer = TorchTrainer(
        _worker_loop, train_loop_config={"config": config, "restore": restored, "relayed": relayed,
                                         "trial_id": tune.get_context().get_trial_id()},
        torch_config=TorchConfig(backend="nccl" if resources.gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=resources.workers, use_gpu=resources.gpu > 0,
                                     resources_per_worker=per_worker),
        run_config=RunConfig(name=f"trial-{tune.get_context().get_trial_id()}", storage_path=storage,
                             failure_config=FailureConfig(max_failures=max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2), callbacks=[_Relay(reports)],
                             logging_config=LoggingConfig(log_level="WARNING")))  # no line per report
    outcome: dict = {}

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as error:  # re-raised in the Tune function below
            outcome["error"] = error

    thread = threading.Thread(target=fit, name="dptune-train-run", daemon=True)
    thread.start()
    controller = None
    try:
        while True:
            try:
                metrics, checkpoint, controller = reports.get(timeout=1.0)
            except (Empty, std_queue.Empty):
                if not thread.is_alive() and reports.empty():
                    break
                continue
            tune_adapter.report(metrics, state=tune_adapter.checkpoint_state(checkpoint))
            if relayed is not None:   # the scheduler has decided on this report: rank 0 may read its stops
                relayed.put(True)
            why = divergence(metrics)
            if why is not None:   # the workers reported it and ended (a divergence is no worker failure)
                thread.join()
                raise TrialDiverged(why)
    finally:  # stopped by Tune (a scheduler) while the run goes on: abort it, freeing its workers
        if thread.is_alive() and controller is not None:
            try:
                ray.get(controller.abort.remote(), timeout=60)
            except Exception:  # the run ended meanwhile
                pass
    thread.join()
    if "error" in outcome:
        raise outcome["error"]


def _worker_loop(loop_config: dict) -> None:
    """One Train worker: the trial's body (:func:`train_trial`) on this worker's shard, reporting after
    every epoch (rank 0 with the state as a checkpoint). A diverged run has reported its epoch and
    ends: the Tune side raises :class:`TrialDiverged` from that report, and Ray Train does not restart
    the workers for it."""
    import torch

    from ...trainables.engine.distributed import ProcessGroupWorkers

    config = loop_config["config"]
    workers = ProcessGroupWorkers()
    if config.get("device", "auto") in ("auto", "cuda") and torch.cuda.is_available():
        device = ray.train.torch.get_device()
        torch.cuda.set_device(device)
        config = {**config, "device": str(device)}
    # Train's latest checkpoint (after a worker restart), else the one Tune restored the trial from
    state = tune_adapter.restorable_state(ray.train.get_checkpoint() or loop_config.get("restore"))
    relayed = loop_config.get("relayed")

    def stops(reported: bool) -> list[int]:   # rank 0 only (ProcessGroupWorkers.shared)
        if reported and relayed is not None:
            relayed.get()
        return stopped_members(loop_config["trial_id"])

    train_trial(config, tune_adapter.train_report, state=state, workers=workers, stops=stops)


class _Relay(ray.train.UserCallback):
    """Ray Train callback (on the run's controller): hands rank 0's metrics, the persisted
    checkpoint of every report and the controller's handle to the trial's Tune function."""

    def __init__(self, reports: object) -> None:
        self.reports = reports

    def after_report(self, run_context: object, metrics: list[dict], checkpoint: object) -> None:
        controller = ray.get_runtime_context().current_actor  # so that a stopped trial can abort its run
        self.reports.put((dict(metrics[0]), checkpoint, controller))
