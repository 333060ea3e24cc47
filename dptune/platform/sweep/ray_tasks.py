"""Plan-time work as Ray tasks: a ``concurrent.futures`` executor over the Ray cluster the sweep joins.

``dptune sweep --address`` calibrates the σ its plan lacks across the cluster (one task per series
of batch sizes, :mod:`dptune.search_spaces.noise_table`) instead of in processes of the driver's
machine; the search-space code sees only an ``Executor``.
"""
from __future__ import annotations

from concurrent.futures import Executor, Future
from typing import Any, Callable

import ray


class RayTasks(Executor):
    """``submit`` runs ``fn(*args)`` as a one-CPU Ray task on the connected cluster."""

    def __init__(self, num_cpus: float = 1) -> None:
        if not ray.is_initialized():
            raise RuntimeError("RayTasks needs a connected Ray (start_ray first)")
        self.num_cpus = num_cpus

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        return ray.remote(num_cpus=self.num_cpus)(fn).remote(*args, **kwargs).future()
