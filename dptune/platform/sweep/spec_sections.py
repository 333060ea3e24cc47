"""The platform's sections of the sweep spec: experiment name, storage, per-trial resources, retries.

```yaml
experiment: digits-small      # folder name under storage
storage: ./dptune-results     # local path, NFS mount, or s3://bucket/prefix
resources: {cpu: 1, gpu: 0}   # per trial; fractional GPUs allowed (gpu: 0.25 → four trials per GPU)
# resources: {workers: 4, gpu: 1, cpu: 4, workers_from_batch_size: 4096}
#   one trial on 4 Ray Train workers with 1 GPU and 4 CPUs each (the same result as on one worker);
#   trials with a batch size below 4096 stay on one worker [workers: 1, every trial]
failure: {max_failures: 2}    # retries of a trial after a node or actor failure
tracking: {mlflow: {}, wandb: {project: dp}, tensorboard: true}   # trackers.py
```
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...search_spaces.spec import Catalog, SpecError, integer, mapping, number, register_section
from ..store.layout import DEFAULT_EXPERIMENT, DEFAULT_STORAGE
from .trial_config import PACK
from . import starts  # noqa: F401  (registers search.prior's check: an earlier sweep's store, read before Ray)
from ...schema import BATCH_SIZE

if TYPE_CHECKING:
    from ray import tune

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Resources:
    """What each trial gets, from the spec to its workers (one set of values, one name each hop):
    ``cpu``/``gpu`` per trial, or per worker of a trial on ``workers`` W Ray Train workers (trials
    with a batch size below ``workers_from_batch_size`` run on one); at most ``max_concurrent``
    trials at once (None: as many as fit)."""

    cpu: float = 1.0
    gpu: float = 0.0
    max_concurrent: int | None = None
    workers: int = 1
    workers_from_batch_size: int | None = None

    def workers_for(self, config: dict) -> int:
        """W for one trial's flat config, or a pack's (its members share B): 1 below ``workers_from_batch_size``."""
        batch = (config[PACK][0] if PACK in config else config).get(BATCH_SIZE)
        if self.workers_from_batch_size is not None and batch is not None and int(batch) < self.workers_from_batch_size:
            return 1
        return self.workers

    def placement(self, config: dict) -> "tune.PlacementGroupFactory":
        """What Tune reserves for the trial: cpu/gpu for a one-worker trial; next to nothing for the
        Tune function of a multi-worker trial (its Train workers reserve W × (cpu, gpu) themselves;
        a fraction of a CPU would keep a worker needing a whole one off a full node)."""
        from ray import tune

        if self.workers_for(config) == 1:
            return tune.PlacementGroupFactory([{"CPU": self.cpu, "GPU": self.gpu}])
        return tune.PlacementGroupFactory([{"memory": 1}])  # one byte: Tune refuses an empty request


@register_section("experiment", default=DEFAULT_EXPERIMENT, summary="experiment name (a folder under storage)")
def parse_experiment(value: Any, catalog: Catalog) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise SpecError(f"experiment: must be a name of letters, digits, '_', '.', '-'; got {value!r}")
    return value


@register_section("storage", default=DEFAULT_STORAGE, summary="local path, NFS path or s3://…")
def parse_storage(value: Any, catalog: Catalog) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"storage: must be a path or a URI such as s3://bucket/prefix; got {value!r}")
    return value


@register_section("resources", default={}, summary="per-trial (per-worker) cpu and gpu, workers per trial")
def parse_resources(value: Any, catalog: Catalog) -> Resources:
    value = mapping(value, "resources", ("cpu", "gpu", "max_concurrent", "workers", "workers_from_batch_size"))
    cpu = number(value.get("cpu", 1), "resources.cpu", gt=0)
    gpu = number(value.get("gpu", 0), "resources.gpu", ge=0)
    if gpu > 1 and not gpu.is_integer():
        raise SpecError(f"resources.gpu: above 1 must be a whole number of GPUs; got {gpu!r}")
    concurrent = value.get("max_concurrent")
    workers = integer(value.get("workers", 1), "resources.workers", ge=1)
    if workers > 1 and 0 < gpu < 1:
        raise SpecError(f"resources.gpu: with workers > 1 must be 0 or a whole number of GPUs per worker "
                        f"(NCCL needs one GPU per worker); got {gpu!r}")
    from_batch = value.get("workers_from_batch_size")
    if from_batch is not None:
        from_batch = integer(from_batch, "resources.workers_from_batch_size", ge=1)
    return Resources(cpu, gpu, None if concurrent is None else integer(concurrent, "resources.max_concurrent", ge=1),
                     workers, from_batch)


@register_section("failure", default={}, summary="max_failures: retries of a trial after a failure")
def parse_failure(value: Any, catalog: Catalog) -> int:
    value = mapping(value, "failure", ("max_failures",))
    return integer(value.get("max_failures", 2), "failure.max_failures", ge=0)


from . import trackers  # noqa: E402,F401  (registers the ``tracking`` section beside these)
