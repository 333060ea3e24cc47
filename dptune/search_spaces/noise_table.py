"""Plan-time noise calibration: deduplicated, cache first, the rest in parallel processes.

A sweep asks for σ at every (ε, δ, q, T, estimator) of every cell; backbones share them, so the
requests are deduplicated first. Values already in the accountant's cache (memory or the SQLite
file shared by all processes) are read in this process; only the missing ones are computed, with
a progress bar. They are grouped into **series**: the batch sizes of one (ε, δ, estimator,
epochs) in increasing order, calibrated one after the other so that each search starts from its
neighbours' answer (``calibrate_noise_series``: about half the accountant evaluations); the series
go to a process pool, longest first (or to the executor the caller passes: a sweep on a Ray cluster
runs them as Ray tasks across it, :mod:`dptune.platform.sweep.ray_tasks`). Workers write the on-disk
cache, so a second plan, and every trial on that machine, finds them there.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
from collections import defaultdict
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from typing import Iterable, NamedTuple, Sequence

from ..privacy.accountant import epsilon_curve
from ..privacy.cache import cached
from ..privacy.schedule import accounted_steps
from ..privacy.calibration import calibrate_noise_series, sigma_key


class NoiseRequest(NamedTuple):
    """The inputs of one ``calibrate_noise`` call."""

    epsilon: float
    delta: float
    sample_rate: float
    steps: int
    norm_estimator: str = "exact"
    sketch_k: int | None = None
    #: the run's epochs E: with ``calibrate_many(curves=True)`` the ε at each epoch end of a run at
    #: this σ is computed too (the trial then finds its per-epoch ε in the cache)
    epochs: float | None = None


class _Missing(Exception):
    pass


def _raise_missing() -> float:
    raise _Missing


def cached_noise(request: NoiseRequest) -> float | None:
    """σ from the accountant's cache without computing it (None when absent).

    Uses the key ``calibrate_noise`` stores under (``sigma_key``); a mismatch could only cause a
    recomputation, never a wrong σ.
    """
    key = sigma_key(request.epsilon, request.delta, request.sample_rate, request.steps, request.norm_estimator,
                    request.sketch_k)
    try:
        return cached(key, _raise_missing)
    except _Missing:
        return None


def _calibrate_series(series: Sequence[NoiseRequest], curves: bool = False) -> list[float]:
    first = series[0]
    sigmas = calibrate_noise_series(first.epsilon, first.delta, [(r.sample_rate, r.steps) for r in series],
                                    norm_estimator=first.norm_estimator, sketch_k=first.sketch_k)
    for r, sigma in zip(series, sigmas):
        if curves and r.epochs is not None:
            epsilon_curve(sigma, r.delta, r.sample_rate, accounted_steps(r.epochs, r.steps),
                          norm_estimator=r.norm_estimator, sketch_k=r.sketch_k)
    return sigmas


def series_of(requests: Iterable[NoiseRequest]) -> list[list[NoiseRequest]]:
    """The requests grouped by (ε, δ, estimator, k, epochs ≈ q·T to two digits), each group in
    increasing q; the groups with the most steps first (they take longest)."""
    groups: dict[tuple, list[NoiseRequest]] = defaultdict(list)
    for r in requests:
        epochs = float(f"{r.sample_rate * r.steps:.2g}")
        groups[(r.epsilon, r.delta, r.norm_estimator, r.sketch_k, epochs)].append(r)
    series = [sorted(g, key=lambda r: (r.sample_rate, r.steps)) for g in groups.values()]
    return sorted(series, key=lambda g: sum(r.steps for r in g), reverse=True)


def default_workers() -> int:
    """CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def calibrate_many(requests: Iterable[NoiseRequest], *, workers: int | None = None, progress: bool = False,
                   executor: Executor | None = None, curves: bool = False) -> dict[NoiseRequest, float]:
    """σ for every distinct request. Cached values are read here; the others are computed by
    ``workers`` processes (default: all CPUs; 1 computes in this process), or by ``executor``
    (one series per task; the caller owns it). With ``curves`` (a sweep about to launch), the tasks
    also put into the cache the ε at every epoch end of each request with ``epochs``, so trials do
    not compute it (nor import the accountant's PRV code).

    Processes are spawned, not forked: the caller may hold threads (Ray, gRPC, torch) that a fork
    would copy in a locked state.
    """
    unique = list(dict.fromkeys(requests))
    results: dict[NoiseRequest, float] = {}
    missing = []
    for request in unique:
        value = cached_noise(request)
        if value is None:
            missing.append(request)
        else:
            results[request] = value
    if not missing:
        return results
    series = series_of(missing)
    workers = min(workers or default_workers(), len(series))
    from tqdm.auto import tqdm

    where = ("as tasks" if executor is not None else
             f"{workers} process{'es' if workers > 1 else ''}")
    desc = f"calibrating σ ({len(results)} cached, {where})"
    with tqdm(total=len(missing), desc=desc, unit="σ", disable=not progress, file=sys.stderr) as bar:
        if executor is None and workers <= 1:
            for group in series:
                results.update(zip(group, _calibrate_series(group, curves)))
                bar.update(len(group))
            return results
        pool = executor or ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        futures = {}
        try:
            futures = {pool.submit(_calibrate_series, group, curves): group for group in series}
            for future in as_completed(futures):
                group = futures[future]
                results.update(zip(group, future.result()))
                bar.update(len(group))
        finally:  # on an error or ^C, do not wait for the calibrations still queued
            if executor is None:
                pool.shutdown(wait=True, cancel_futures=True)
            else:
                for future in futures:
                    future.cancel()
    return results
