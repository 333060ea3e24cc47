"""Check (issue 17, item 3): the warm-started σ of a cold plan against today's from-scratch search.

Plans SPEC with an empty cache (the series calibration `dptune plan` uses), then recalibrates every
distinct (ε, δ, q, T) with the from-scratch search (the CLT start, no neighbour), in parallel, and
reports the largest relative difference (goal: ≤ 0.1%) and whether every planned σ meets its ε
(epsilon_spent(σ) ≤ ε, goal: all). Costs a from-scratch calibration of the whole spec (minutes).

    python benchmarks/bench_plan_sigmas.py [SPEC] [--workers 2]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def scratch(args: tuple) -> tuple[float, float]:
    """(from-scratch σ, ε spent by the planned σ) of one request."""
    from dptune.privacy import calibration, epsilon_spent

    eps, delta, q, steps, planned = args
    return calibration._search(eps, delta, q, steps, "exact", None), epsilon_spent(planned, delta, q, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", nargs="?", default=str(ROOT / "examples" / "vit_transfer.yaml"))
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    os.environ["DPTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="dptune-sigmas-")
    from dptune.platform.sweep import spec_sections  # noqa: F401
    from dptune.platform.sweep.catalog import trainables_catalog
    from dptune.search_spaces import load_spec, plan_sweep

    catalog = trainables_catalog()
    start = time.perf_counter()
    plan = plan_sweep(load_spec(args.spec, catalog), catalog, workers=args.workers, strict=False)
    print(f"cold plan (in process, series calibration): {time.perf_counter() - start:.1f} s")
    requests = {}
    for cell in plan.cells:
        for row in cell.rows:
            sigma = row["noise_multiplier"]
            if sigma is not None and math.isfinite(sigma):
                requests[(cell.cell.epsilon, cell.cell.delta, float(row["sample_rate"]), int(row["steps"]))] = sigma
    os.environ["DPTUNE_CACHE_DIR"] = "off"  # from scratch: no cache
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        out = list(pool.map(scratch, [(*k, v) for k, v in requests.items()]))
    print(f"from-scratch recalibration of {len(requests)} σ: {time.perf_counter() - start:.1f} s")
    diffs = [planned / old - 1 for planned, (old, _) in zip(requests.values(), out)]
    over = [(k, spent) for k, (_, spent) in zip(requests, out) if spent > k[0]]
    print(f"largest |σ_planned / σ_scratch − 1|: {max(map(abs, diffs)):.5%} (goal ≤ 0.1%); "
          f"mean {sum(diffs) / len(diffs):+.5%}")
    print(f"planned σ with ε spent above the target: {len(over)} (goal 0) {over[:5]}")
    sys.exit(0 if not over and max(map(abs, diffs)) <= 1e-3 + 1e-9 else 1)


if __name__ == "__main__":
    main()
