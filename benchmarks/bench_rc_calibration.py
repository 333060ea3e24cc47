"""Benchmark of σ calibration for randomized clipping (issue 4): time cold and cached, against
the exact path, and how tight the result is.

    python benchmarks/bench_rc_calibration.py            # the settings below, k = 32
    python benchmarks/bench_rc_calibration.py --reps 3

Cold = no cache at all (memory cleared, disk cache off); memory = a repeated call; disk = a fresh
in-memory cache over a filled on-disk cache. For each setting it also reports the RC/exact σ ratio,
the number of atoms of the Z_env discretisation and ε at the RC σ with the atoms rounded down (a
lower bound on the exact envelope's ε), against the target: the discretisation error. Prints a
markdown block for BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from dptune.privacy import cache, calibrate_noise
from dptune.privacy.prv import compose_epsilon
from dptune.privacy.randomized import TAIL_FRACTION, EnvelopeAtoms, GaussianMixturePRV, envelope_atoms

DELTA = 1e-5
#: (label, ε, q, T): the paper's anchor (exact σ = 4.073 at 10 epochs), and typical sweep cells.
SETTINGS = [
    ("paper anchor, 10 epochs", 0.7, 0.0553, 181),
    ("ε = 1, long run", 1.0, 0.004, 2500),
    ("ε = 3, digits B = 128, 10 epochs", 3.0, 0.089, 113),
    ("ε = 8, digits B = 128, 10 epochs", 8.0, 0.089, 113),
    ("ε = 8, q = 0.01, 1000 steps", 8.0, 0.01, 1000),
]


def timed(fn) -> tuple[float, float, float]:
    """(value, wall s, CPU s)."""
    w, c = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - w, time.process_time() - c


def cold(fn, reps: int) -> tuple[float, float, float]:
    os.environ["DPTUNE_CACHE_DIR"] = "off"
    runs = []
    for _ in range(reps):
        cache.clear_memory()
        runs.append(timed(fn))
    return runs[0][0], min(r[1] for r in runs), min(r[2] for r in runs)


def cached(fn) -> tuple[float, float]:
    """(wall s of a memory hit, wall s of a disk hit)."""
    os.environ["DPTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="dptune-bench-")
    cache.clear_memory()
    fn()
    memory = statistics.median(timed(fn)[1] for _ in range(5))
    disk = []
    for _ in range(5):
        cache.clear_memory()
        disk.append(timed(fn)[1])
    return memory, statistics.median(disk)


def rounded_down_epsilon(sigma: float, q: float, steps: int, k: int) -> tuple[float, int]:
    atoms = envelope_atoms(sigma, k, tail_mass=TAIL_FRACTION * DELTA / steps)
    down = EnvelopeAtoms(np.concatenate([[1.0], atoms.z[:-1]]), atoms.weights.copy(), 0.0)
    down.weights[-1] += atoms.tail_mass
    eps = max(compose_epsilon(GaussianMixturePRV(q, sigma, down, d), steps, DELTA) for d in ("remove", "add"))
    return eps, len(atoms.z)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--reps", type=int, default=2, help="cold runs per path (the fastest is reported)")
    args = parser.parse_args()
    print("| setting | exact σ | RC σ (×) | cold exact | cold RC (×) | memory hit RC | disk hit RC | atoms | "
          "ε at RC σ, atoms rounded down |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, eps, q, steps in SETTINGS:
        exact = lambda: calibrate_noise(eps, DELTA, q, steps)  # noqa: E731
        rc = lambda: calibrate_noise(eps, DELTA, q, steps, norm_estimator="hutchinson", sketch_k=args.k)  # noqa: E731
        s_exact, w_exact, c_exact = cold(exact, args.reps)
        s_rc, w_rc, c_rc = cold(rc, args.reps)
        memory, disk = cached(rc)
        lower, atoms = rounded_down_epsilon(s_rc, q, steps, args.k)
        print(f"| {label} (ε = {eps}, q = {q}, T = {steps}) | {s_exact:.4f} | {s_rc:.4f} (×{s_rc / s_exact:.3f}) | "
              f"{w_exact:.2f} s wall, {c_exact:.2f} s CPU | {w_rc:.2f} s wall (×{w_rc / w_exact:.1f}), "
              f"{c_rc:.2f} s CPU (×{c_rc / c_exact:.1f}) | {memory * 1e6:.0f} µs | {disk * 1e3:.1f} ms | {atoms} | "
              f"{lower:.4f} (target {eps}) |", flush=True)


if __name__ == "__main__":
    main()
