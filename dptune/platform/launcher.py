"""Start or join Ray and run trial configs with Ray Tune (fresh or restored), writing the store."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

import ray
from ray import tune

from .callbacks import StoreCallback
from .layout import DEFAULT_STORAGE, ExperimentPaths, absolute
from .trainable import dp_trainable


@dataclass
class RunSettings:
    """Where and how trials run: experiment name, storage, per-trial resources, retries."""

    experiment: str = "dptune"
    storage: str = DEFAULT_STORAGE
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    max_failures: int = 2
    max_concurrent: int | None = None
    verbose: int = 1

    @property
    def paths(self) -> ExperimentPaths:
        """The experiment's folders: ``<storage>/<experiment>`` and its store, analysis, settings."""
        return ExperimentPaths.of(self.storage, self.experiment)


def start_ray(address: str | None = None, *, num_cpus: int | None = None, dashboard: bool = False) -> None:
    """Join ``address`` (e.g. "auto" on a cluster) or start embedded local Ray on 127.0.0.1."""
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard, _node_ip_address="127.0.0.1",
                 logging_level=logging.WARNING, configure_logging=True)


def resourced(settings: RunSettings, function: Callable[[dict], None] = dp_trainable):
    """The trainable with the per-trial resources of ``settings`` (fractional GPUs allowed)."""
    return tune.with_resources(function, {"cpu": settings.cpus_per_trial, "gpu": settings.gpus_per_trial})


def run_config(settings: RunSettings) -> tune.RunConfig:
    """Storage, retries, one kept checkpoint per trial and the store callback."""
    return tune.RunConfig(
        name=settings.experiment, storage_path=absolute(settings.storage),
        failure_config=tune.FailureConfig(max_failures=settings.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
        callbacks=[StoreCallback(settings.paths.absolute())],
        verbose=settings.verbose)


# Checkpointing every epoch of many short trials is the point; Ray's warning about it is noise.
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")


def run_trials(trials: list[dict], settings: RunSettings,
               trainable: Callable[[dict], None] = dp_trainable) -> tune.ResultGrid:
    """Run an explicit list of trial specs ({"train": …, "meta": …}), one Ray Tune trial each
    (``trainable`` replaces the DP trainable only to measure the platform's own overhead)."""
    tuner = tune.Tuner(resourced(settings, trainable), param_space={"trial": tune.grid_search(trials)},
                       tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=settings.max_concurrent),
                       run_config=run_config(settings))
    return tuner.fit()
