"""Start or join Ray and run trial configs with Ray Tune (fresh or restored), writing the store."""
from __future__ import annotations

import functools
import logging
import os
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import ray
from ray import tune

from .store_callback import StoreCallback
from .live_status import LiveStatus
from .packs import PerMember
from .progress import TrialLines
from .ray_setup import configure_driver, console
from .ray_orphans import stop_orphans
from ..store.layout import DEFAULT_STORAGE, WORKER_RUNS, ExperimentPaths, absolute
from .spec_sections import Resources
from .trackers import Tracking, tracker_callbacks
from .trial_errors import StopOnRecurringError
from .trial_function import dp_trainable

if TYPE_CHECKING:
    from .searcher import SweepSearcher


@dataclass
class RunSettings:
    """Where and how trials run: experiment name, storage, the spec's per-trial ``resources``, retries
    (``max_failures``), Ray Tune's own output (``verbose``; 0: none, dptune prints one line per
    trial; 2 with ``dptune sweep --verbose``) and the experiment trackers (``tracking``)."""

    experiment: str = "dptune"
    storage: str = DEFAULT_STORAGE
    resources: Resources = field(default_factory=Resources)
    max_failures: int = 2
    verbose: int = 0
    tracking: Tracking = field(default_factory=Tracking)

    @classmethod
    def from_dict(cls, values: dict) -> "RunSettings":
        """Settings saved as JSON (``dataclasses.asdict``) back into their types."""
        return cls(**{**values, "resources": Resources(**values.get("resources", {})),
                      "tracking": Tracking(**values.get("tracking", {}))})

    @property
    def paths(self) -> ExperimentPaths:
        """The experiment's folders: ``<storage>/<experiment>`` and its store, analysis, settings."""
        return ExperimentPaths.of(self.storage, self.experiment)


def ray_token_file() -> Path:
    """Where Ray reads its authentication token: ``$RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``."""
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def private_ray_token() -> Path:
    """Ray's token file, created if missing, readable by its owner alone (file 0600, folder 0700).

    Ray 2.60 writes ``~/.ray/auth_token`` world-readable (0644) when it generates one, and anyone
    holding the token may run code in the sweep's processes, next to private training data. So
    the token is created here first, through ``os.open`` with mode 0600 (never readable by others,
    not even for an instant), and an existing one is made private."""
    path = ray_token_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    if not path.exists():
        try:
            from ray._private.authentication.authentication_token_generator import generate_new_authentication_token
            token = generate_new_authentication_token()
        except ImportError:  # the module is private to Ray: any long random token will do
            token = secrets.token_hex(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process created it meanwhile: use theirs
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(token)
    os.chmod(path, 0o600)
    return path


def _token_mode() -> None:
    """Token authentication on, set explicitly (so Ray does not warn that it turned it on)."""
    os.environ["RAY_AUTH_MODE"] = "token"
    try:  # Ray reads its configuration once: refresh it, as Ray's own default-on path does
        from ray._raylet import Config
        Config.initialize("")
    except (ImportError, AttributeError):
        pass


def start_ray(address: str | None = None, *, num_cpus: int | None = None, dashboard: bool = False,
              log_to_driver: bool = False) -> None:
    """Join ``address`` (e.g. "auto" on a cluster) or start embedded local Ray on 127.0.0.1: node
    address 127.0.0.1, no dashboard, token authentication on with a token only its owner can read
    (:func:`private_ray_token`). Ray's gRPC servers still listen on every interface (Ray 2.60 has
    no setting for their bind address; see the README's security note). Ray processes a killed
    earlier local session left running are stopped first (:mod:`dptune.platform.sweep.ray_orphans`). The driver's
    environment and log levels are set here too (:func:`dptune.platform.sweep.ray_setup.configure_driver`).
    ``log_to_driver``: what the trials' processes print reaches this console too (``--verbose``);
    otherwise it stays in each trial's log (``tune_adapter.TRIAL_LOG``) and Ray's worker logs."""
    configure_driver()
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=log_to_driver)
    else:
        if os.environ.get("RAY_AUTH_MODE", "token").lower() == "token":
            private_ray_token()
            _token_mode()
        stopped = stop_orphans()   # agents a killed earlier session left running
        if stopped:
            print(f"dptune: stopped {len(stopped)} Ray process(es) left by a killed local session", file=sys.stderr)
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard, _node_ip_address="127.0.0.1",
                 logging_level=logging.WARNING, configure_logging=True, log_to_driver=log_to_driver)


def resourced(settings: RunSettings, function: Callable[..., None] = dp_trainable):
    """The trainable with the per-trial resources of ``settings`` (fractional GPUs allowed).

    With ``resources.workers`` W > 1, a trial whose W is above one (:meth:`Resources.workers_for`)
    gets ``on_workers``: its Tune function reserves nothing and runs the trial on W Ray Train
    workers of (cpu, gpu) each (:mod:`dptune.platform.sweep.multi_worker`)."""
    resources = settings.resources
    if resources.workers <= 1:
        return tune.with_resources(function, {"cpu": resources.cpu, "gpu": resources.gpu})
    from .multi_worker import run_on_workers   # Ray Train and the trainer: only for multi-worker sweeps

    on_workers = functools.partial(run_on_workers, resources=resources, max_failures=settings.max_failures,
                                   storage=f"{settings.paths.absolute().root}/{WORKER_RUNS}")

    @functools.wraps(function)
    def trial(config: dict) -> None:
        if resources.workers_for(config) == 1:
            function(config)
        else:
            function(config, on_workers=on_workers)

    return tune.with_resources(trial, resources.placement)


def max_concurrent(settings: RunSettings) -> int | None:
    """Tune's bound on running trials: the spec's ``max_concurrent``; with ``workers`` > 1 and none
    given, as many trials as the cluster's CPUs (and GPUs) would hold if each ran on one worker, at
    least one. Multi-worker trials' Tune functions reserve next to nothing, so without a bound Tune
    would start every trial's function and Train controller at once, all waiting for workers."""
    resources = settings.resources
    if resources.max_concurrent is not None or resources.workers <= 1 or not ray.is_initialized():
        return resources.max_concurrent
    return _cluster_fits(resources)


def trial_slots(settings: RunSettings) -> int:
    """How many trials run at once (packs are split over them): as many as the cluster's CPUs (and
    GPUs) hold at the spec's resources (per worker, ``workers`` each), at most its ``max_concurrent``;
    1 without Ray."""
    resources = settings.resources
    fits = max(1, _cluster_fits(resources) // resources.workers) if ray.is_initialized() else 1
    return fits if resources.max_concurrent is None else max(1, min(fits, resources.max_concurrent))


def _cluster_fits(resources: Resources) -> int:
    """Trials of ``resources`` (per worker) the cluster's CPUs and GPUs hold at once, at least one."""
    available = ray.cluster_resources()
    fits = [available.get("CPU", 0.0) // resources.cpu]
    if resources.gpu:
        fits.append(available.get("GPU", 0.0) // resources.gpu)
    return max(1, int(min(fits)))


def run_config(settings: RunSettings, total: int | None = None, searcher: "SweepSearcher | None" = None) -> tune.RunConfig:
    """Storage, retries, two kept checkpoints per trial, the store callback (holding ``searcher``, which
    it tells on resume which trials Ray Tune's snapshot holds), the spec's trackers and,
    unless Ray Tune's own verbose output is on, one progress line per ended trial (of ``total``) and
    no traceback per failed attempt (:func:`~dptune.platform.sweep.ray_setup.console`).

    Two, not one: Ray Tune snapshots the experiment state on a timer, so after a driver kill the
    snapshot can name the checkpoint before the newest; with one kept it would already be gone."""
    paths = settings.paths.absolute()
    # the live file first: a trial that ends leaves it before the store records it (no double count)
    # each pack member is a trial of its own to all but Ray Tune (the store callback writes its rows itself)
    callbacks: list[tune.Callback] = [PerMember(LiveStatus(paths)), StoreCallback(paths, searcher=searcher)]
    callbacks += map(PerMember, tracker_callbacks(settings.tracking, settings.experiment, str(paths.root)))
    console(bool(settings.verbose))
    if settings.verbose == 0:
        callbacks.append(PerMember(TrialLines(total, paths)))
    return tune.RunConfig(
        name=settings.experiment, storage_path=absolute(settings.storage),
        failure_config=tune.FailureConfig(max_failures=settings.max_failures),
        stop=StopOnRecurringError(),   # an error of the input or environment would recur in every trial
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        callbacks=callbacks,
        verbose=settings.verbose)

