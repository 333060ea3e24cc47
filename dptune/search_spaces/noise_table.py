"""Plan-time noise calibration: deduplicated, cache first, the rest in parallel processes.

A sweep asks for σ at every (ε, δ, q, T, estimator) of every cell; backbones share them, so the
requests are deduplicated first. Values already in the accountant's cache (memory or the SQLite
file shared by all processes) are read in this process; only the missing ones go to a process
pool, longest first (T drives the cost), with a progress bar. Workers write the on-disk cache, so
a second plan, and every trial, finds them there.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Iterable, NamedTuple

from ..privacy.cache import cached
from ..privacy.calibration import calibrate_noise, sigma_key


class NoiseRequest(NamedTuple):
    """The inputs of one ``calibrate_noise`` call."""

    epsilon: float
    delta: float
    sample_rate: float
    steps: int
    norm_estimator: str = "exact"
    sketch_k: int | None = None


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


def _calibrate(request: NoiseRequest) -> float:
    return calibrate_noise(request.epsilon, request.delta, request.sample_rate, request.steps,
                           norm_estimator=request.norm_estimator, sketch_k=request.sketch_k)


def default_workers() -> int:
    """CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def calibrate_many(requests: Iterable[NoiseRequest], *, workers: int | None = None,
                   progress: bool = False) -> dict[NoiseRequest, float]:
    """σ for every distinct request. Cached values are read here; the others are computed by
    ``workers`` processes (default: all CPUs; 1 computes in this process).

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
    missing.sort(key=lambda r: r.steps, reverse=True)  # the slowest first balances the pool
    workers = min(workers or default_workers(), len(missing))
    from tqdm.auto import tqdm

    desc = f"calibrating σ ({len(results)} cached, {workers} process{'es' if workers > 1 else ''})"
    with tqdm(total=len(missing), desc=desc, unit="σ", disable=not progress, file=sys.stderr) as bar:
        if workers <= 1:
            for request in missing:
                results[request] = _calibrate(request)
                bar.update(1)
            return results
        context = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
        try:
            futures = {pool.submit(_calibrate, request): request for request in missing}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                bar.update(1)
        finally:  # on an error or ^C, do not wait for the calibrations still queued
            pool.shutdown(wait=True, cancel_futures=True)
    return results
