"""Experiment trackers from the spec's ``tracking`` section, through Ray Tune's own logger callbacks:
each trial a run in MLflow, Weights & Biases or TensorBoard (several at once), with its trial config
as parameters — cell, C, B, η, σ (``noise_multiplier``), q (``sample_rate``), T (``steps``), the norm
estimator and the denoiser among them — and per epoch its reported metrics (accuracy, loss, ε
spent, clipped fraction, …).

```yaml
tracking:
  mlflow: {tracking_uri: sqlite:///mlflow.db, experiment: digits}  # [sqlite:///<experiment folder>/mlflow.db]
  wandb: {project: dp-digits, mode: offline}                       # offline [default] or online
  tensorboard: true                                                # event files in each trial's folder
```

Nothing leaves the machine unless the user names a remote tracker: MLflow defaults to an SQLite file
in the experiment's folder, W&B to offline runs there (``wandb sync`` uploads them later). Metrics
computed from the private training data without noise are named in each run's tags (MLflow),
notes (W&B) and a text summary (TensorBoard) as non-private diagnostics: :data:`NON_PRIVATE`.
The trackers are an extra (``pip install 'dptune[tracking]'``); a tracker asked for but not
installed is refused when the spec is read, before anything runs.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from ...schema import non_private
from ...search_spaces.spec import SpecError, mapping, register_section, spec_path
from ..store.layout import is_uri

if TYPE_CHECKING:
    from ray import tune

#: The reported metrics computed from private training data without noise (NOT differentially
#: private), as each tracker's runs are labelled: the trial schema's declarations (``schema/figures.py``).
NON_PRIVATE = ", ".join(non_private())
#: tracker → (the spec's keys, the packages it needs).
TRACKERS = {"mlflow": (("tracking_uri", "experiment"), ("mlflow", "sqlalchemy", "alembic")),
            "wandb": (("project", "mode", "group", "dir"), ("wandb",)),
            "tensorboard": ((), ("tensorboardX",))}
WANDB_MODES = ("offline", "online")
#: MLflow 3 refuses a file store (``file:///…/mlruns`` or a plain path) unless this is true; a spec that
#: names one gets it (dptune sets it for its own process), unless the user set it otherwise.
ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"


def _file_store(uri: str | None) -> bool:
    """Whether MLflow reads ``uri`` as a file store: a ``file:`` URI or a path without a scheme."""
    if uri is None or uri.startswith("databricks"):
        return False
    return urlparse(uri).scheme in ("", "file")   # as MLflow reads a tracking URI


def _local_uri(uri: str) -> str:
    """An MLflow tracking URI whose local file (an SQLite database, a file store) is read against the
    folder dptune runs in, as a spec's paths are."""
    if uri.startswith("sqlite:///"):   # sqlite:///relative.db, or sqlite:////absolute.db
        return "sqlite:///" + spec_path(uri[len("sqlite:///"):])
    return spec_path(uri) if _file_store(uri) and ":" not in uri else uri   # a plain path: a file store


@dataclass(frozen=True)
class Tracking:
    """The trackers of a sweep: MLflow and W&B settings (None: off) and TensorBoard on or off."""

    mlflow: dict | None = None
    wandb: dict | None = None
    tensorboard: bool = False

    @property
    def names(self) -> list[str]:
        return [n for n in TRACKERS if getattr(self, n)]


def _missing(packages: tuple[str, ...]) -> list[str]:
    return [p for p in packages if importlib.util.find_spec(p) is None]


@register_section("tracking", default={}, summary="mlflow / wandb / tensorboard: each trial a run in a tracker")
def parse_tracking(value: Any, catalog: object) -> Tracking:
    value = mapping(value, "tracking", tuple(TRACKERS))
    parsed: dict[str, Any] = {}
    for name, (keys, packages) in TRACKERS.items():
        if name not in value or value[name] in (None, False):
            continue
        if name == "tensorboard":
            if value[name] is not True:
                raise SpecError(f"tracking.tensorboard: must be true or false; got {value[name]!r}")
            options: Any = True
        else:
            options = dict(mapping({} if value[name] is True else value[name], f"tracking.{name}", keys))
            for key, v in options.items():
                if not isinstance(v, str) or not v:
                    raise SpecError(f"tracking.{name}.{key}: must be a non-empty string; got {v!r}")
        if name == "mlflow" and "tracking_uri" in options:
            options["tracking_uri"] = _local_uri(options["tracking_uri"])
        if name == "wandb":
            if "dir" in options:
                options["dir"] = spec_path(options["dir"])
            if "project" not in options:
                raise SpecError("tracking.wandb.project: required (the W&B project the runs go to)")
            if options.setdefault("mode", "offline") not in WANDB_MODES:
                raise SpecError(f"tracking.wandb.mode: must be one of {', '.join(WANDB_MODES)}; got {options['mode']!r}")
        missing = _missing(packages)
        if missing:
            raise SpecError(f"tracking.{name}: {', '.join(missing)} not installed; pip install 'dptune[tracking]'")
        if name == "mlflow" and _file_store(options.get("tracking_uri")) and \
                os.environ.get(ALLOW_FILE_STORE, "true").lower() not in ("true", "1"):
            raise SpecError(f"tracking.mlflow.tracking_uri: {options['tracking_uri']} is an MLflow file store, and "
                            f"{ALLOW_FILE_STORE}={os.environ[ALLOW_FILE_STORE]} refuses it (MLflow's advice: a database "
                            "backend such as sqlite:///mlflow.db, or unset it to keep the file store)")
        parsed[name] = options
    return Tracking(**parsed)


def tracker_callbacks(tracking: Tracking, experiment: str, root: str) -> list["tune.Callback"]:
    """Ray Tune callbacks for ``tracking``; ``root`` is the experiment's folder (local defaults go
    there), ``experiment`` its name (the MLflow experiment and W&B group unless given)."""
    callbacks: list[tune.Callback] = []
    local = not is_uri(root)
    if tracking.mlflow is not None:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        uri = tracking.mlflow.get("tracking_uri")
        if _file_store(uri):   # the user named a file store: honour it (MLflow 3 asks for this opt-in)
            os.environ.setdefault(ALLOW_FILE_STORE, "true")
        if uri is None and not local:
            raise SpecError(f"tracking.mlflow.tracking_uri: required with storage {root} (the default is an SQLite "
                            "file in a local experiment folder)")
        class MLflow(MLflowLoggerCallback):
            """Ray's callback; each run also gets the training defaults its trial config leaves out."""

            def log_trial_start(self, trial: Any) -> None:
                super().log_trial_start(trial)
                extra = {k: v for k, v in _parameters(trial.config).items() if k not in trial.config}
                self.mlflow_util.log_params(run_id=self._trial_runs[trial], params_to_log=extra)

        callbacks.append(MLflow(
            tracking_uri=uri or f"sqlite:///{os.path.join(root, 'mlflow.db')}",
            experiment_name=tracking.mlflow.get("experiment", experiment),
            tags={"dptune.experiment": experiment, "dptune.non_private_metrics": NON_PRIVATE}))
    if tracking.wandb is not None:
        callbacks.append(_wandb_callback(tracking.wandb, experiment, root if local else os.getcwd()))
    if tracking.tensorboard:
        callbacks.append(_tensorboard_callback())
    return callbacks


def _parameters(config: dict) -> dict:
    """A trial's parameters for a tracker: its config with every training default filled in."""
    from .trial_config import resolved

    return resolved(config)


def _wandb_callback(options: dict, experiment: str, folder: str) -> "tune.Callback":
    from ray.air.integrations.wandb import WandbLoggerCallback, _WandbLoggingActor

    class WandbRunActor(_WandbLoggingActor):
        """Ray's per-trial logging actor, which also waits for W&B's service process to write the run
        out. ``wandb.finish`` returns before that process has flushed the run file, and Ray kills the
        actor as soon as its ``run`` returns: W&B's own flush at interpreter exit never runs, and the
        run file was left empty or without its history (seen under load)."""

        def run(self) -> None:
            super().run()
            self._wandb.teardown()

    class Wandb(WandbLoggerCallback):
        """Ray's callback with every training option as the run's config (defaults included), each run
        written out before its actor ends (``WandbRunActor`` above), quiet at interpreter exit (its
        ``__del__`` reads a Ray module already gone)."""

        _logger_actor_cls = WandbRunActor

        def _start_logging_actor(self, trial: Any, exclude_results: list, **init: Any) -> None:
            init["config"] = _parameters(init.get("config", trial.config))
            super()._start_logging_actor(trial, exclude_results, **init)

        def __del__(self) -> None:
            try:
                super().__del__()
            except (AttributeError, TypeError):
                pass

    if options["mode"] == "offline":  # Ray asks for an API key unless W&B's own switch says offline
        os.environ["WANDB_MODE"] = "offline"
    return Wandb(project=options["project"], group=options.get("group", experiment), mode=options["mode"],
                 dir=options.get("dir", folder), notes=f"non-private diagnostics: {NON_PRIVATE}",
                 tags=["dptune"])


def _tensorboard_callback() -> "tune.Callback":
    from ray.tune.logger import TBXLoggerCallback

    class TensorBoard(TBXLoggerCallback):
        """Ray's TensorBoard writer, with each run's parameters and the non-private diagnostics named
        as text."""

        def log_trial_start(self, trial: Any) -> None:
            super().log_trial_start(trial)
            writer = self._trial_writer[trial]
            writer.add_text("dptune/parameters", "\n".join(f"    {k}: {v}" for k, v in _parameters(trial.config).items()))
            writer.add_text("dptune/non_private_metrics", NON_PRIVATE)

    return TensorBoard()
