"""How dptune runs Ray Tune: the environment and log levels, set in one place, when Ray starts.

Nothing here runs at import: :func:`configure_driver` is called by ``launcher.start_ray`` (every
sweep and resume goes through it, also when Ray is already up), and :func:`quiet_trial_logs` by
the trainables' reporting adapter (``tune_adapter``) in each trial's process. Each setting is a
default the user can override with the same environment variable.
"""
from __future__ import annotations

import logging
import os

#: Environment defaults of the sweep's driver (each overridable by setting it first):
DRIVER_ENV = {
    # The results store is the sweep's record: Ray Tune's own per-trial CSV, JSON and TensorBoard
    # loggers (a TensorBoard writer and three files per trial, about a third of the driver's time per
    # trial in a sweep of short trials) are off unless the user sets it to 0.
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    # Ray Tune's console output: its new engine prints a configuration box ("Number of trials
    # 9223372036854775807" for a searcher's open-ended run) and a results path whatever the
    # verbosity; the classic engine prints nothing at verbose 0 (dptune's own lines, progress.py)
    # and its progress tables under `dptune sweep --verbose`.
    "RAY_AIR_NEW_OUTPUT": "0",
    # Checkpointing every epoch of many short trials is the point; Ray's warning about it is noise.
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
}


def configure_driver() -> None:
    """The driver's environment defaults (:data:`DRIVER_ENV`) and log levels. `dptune resume`:
    Ray Tune's ResultGrid reads each trial's progress file and warns "Failed to fetch metrics for N
    trial(s) … FileNotFoundError" for trials that never wrote one (e.g. not started when the driver
    stopped); dptune never reads those frames (its store is the record), so that warning says
    nothing; errors still show."""
    for name, value in DRIVER_ENV.items():
        os.environ.setdefault(name, value)
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    quiet_trial_logs()


def console(verbose: bool) -> None:
    """What reaches the sweep's console from Ray Tune's driver: without ``verbose`` no traceback per
    failed attempt (Ray Tune's "Trial task failed" block, three per trial with two retries): the
    ERRORED line carries the error's last line and the traceback stays in the trial's ``error.txt``.
    Ray Tune reads this when a run starts (fresh or restored)."""
    os.environ["TUNE_PRINT_ALL_TRIAL_ERRORS"] = "1" if verbose else "0"
    # and its closing "Trials did not complete: [ids]": the closing lines count the errored trials
    logging.getLogger("ray.tune.tune").setLevel(logging.NOTSET if verbose else logging.CRITICAL)


def quiet_trial_logs() -> None:
    """No INFO line per report and checkpoint from a trial's process or a Train worker (Ray 2.60
    logs Train's under a logger named by its module's file path)."""
    for name in ("ray.train", "ray.tune"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        from ray.train.v2._internal.execution import context

        logging.getLogger(context.__file__).setLevel(logging.WARNING)
    except ImportError:  # another Ray release: its lines stay
        pass
