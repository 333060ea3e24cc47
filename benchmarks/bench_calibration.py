"""σ calibration time, cold and cached, against Opacus's get_noise_multiplier(accountant="prv").

Run: python benchmarks/bench_calibration.py   (prints a Markdown table)
"""
from __future__ import annotations

import os
import tempfile
import time
import warnings

os.environ["DPTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="dptune-bench-")  # cold start

from opacus.accountants.utils import get_noise_multiplier  # noqa: E402

from dptune.privacy import calibrate_noise, epsilon_spent  # noqa: E402
from dptune.privacy.cache import clear_memory  # noqa: E402

warnings.filterwarnings("ignore")
DELTA = 1e-5
CASES = [(1.0, 0.02, 489), (3.0, 0.02, 489), (8.0, 0.02, 489), (1.0, 0.004, 2500), (8.0, 0.1, 100)]


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    calibrate_noise(2.0, DELTA, 0.5, 4)  # import/JIT warm-up outside the measurements
    get_noise_multiplier(target_epsilon=2.0, target_delta=DELTA, sample_rate=0.5, steps=4, accountant="prv")
    print("| ε | q | T | σ dptune | ε(σ) dptune | cold s | memory-cached ms | disk-cached ms | σ Opacus | ε(σ Opacus) | Opacus s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for eps, q, steps in CASES:
        sigma, cold = timed(lambda: calibrate_noise(eps, DELTA, q, steps))
        _, warm = timed(lambda: calibrate_noise(eps, DELTA, q, steps))
        clear_memory()
        _, disk = timed(lambda: calibrate_noise(eps, DELTA, q, steps))
        theirs, t_opacus = timed(lambda: get_noise_multiplier(target_epsilon=eps, target_delta=DELTA, sample_rate=q,
                                                              steps=steps, accountant="prv"))
        print(f"| {eps:g} | {q:g} | {steps} | {sigma:.4f} | {epsilon_spent(sigma, DELTA, q, steps):.4f} | {cold:.2f} | "
              f"{warm * 1e3:.3f} | {disk * 1e3:.2f} | {theirs:.4f} | {epsilon_spent(theirs, DELTA, q, steps):.4f} | "
              f"{t_opacus:.2f} |")


if __name__ == "__main__":
    main()
