"""Benchmark: `dptune plan` on a realistic spec, with a cold and a warm accounting cache.

The spec is examples/vit_transfer.yaml: 4 ε × 3 datasets (declared sizes of CIFAR-100, SUN397,
Cassava) × 2 backbones × 2 epoch budgets × 10 batch candidates = 48 cells. Each run is the real
command in a fresh process (`dptune plan SPEC --quiet`), so the times include interpreter start-up
and imports. Cold: an empty cache directory. Warm: the same directory again (the SQLite cache on
disk; a new process has nothing in memory). The in-process row times ``plan_sweep`` alone with
a warm disk cache, without start-up and imports. CPU time (user + system of the command and its
calibration processes) is reported beside wall time because the machine may be shared.

    python benchmarks/bench_plan.py [--warm-runs 3] [--skip-cold]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "vit_transfer.yaml"
DPTUNE = [sys.executable, "-m", "dptune"]


def timed(command: list[str], env: dict) -> tuple[float, float, str]:
    """(wall s, CPU s of the command and its children, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def in_process_plan(cache: str) -> tuple[float, int, int]:
    """Seconds of load_spec + plan_sweep with the disk cache warm (memory cleared), cells, σ values."""
    os.environ["DPTUNE_CACHE_DIR"] = cache
    from dptune.platform.sweep.catalog import trainables_catalog
    from dptune.privacy.cache import clear_memory
    from dptune.search_spaces import load_spec, plan_sweep

    catalog = trainables_catalog()
    clear_memory()
    start = time.perf_counter()
    plan = plan_sweep(load_spec(SPEC, catalog), catalog, strict=False)
    seconds = time.perf_counter() - start
    sigmas = {(c.cell.epsilon, q, t) for c in plan for q, t in
              zip(c.batches.loc[c.batches["reason"] != "exceeds_dataset", "sample_rate"],
                  c.batches.loc[c.batches["reason"] != "exceeds_dataset", "steps"])}
    return seconds, len(plan.cells), len(sigmas)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--skip-cold", action="store_true", help="reuse $DPTUNE_BENCH_CACHE (already filled)")
    args = parser.parse_args()
    cache = os.environ.get("DPTUNE_BENCH_CACHE") if args.skip_cold else tempfile.mkdtemp(prefix="dptune-bench-plan-")
    env = {**os.environ, "DPTUNE_CACHE_DIR": cache}
    print(f"spec {SPEC.relative_to(ROOT)}; cache {cache}; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    if not args.skip_cold:
        wall, cpu, out = timed(DPTUNE + ["plan", str(SPEC), "--quiet"], env)
        print(f"cold: {wall:.1f} s wall, {cpu:.1f} s CPU; load average after {os.getloadavg()[0]:.1f}", flush=True)
        print("      " + out.strip().splitlines()[-2], flush=True)
    warm = [timed(DPTUNE + ["plan", str(SPEC), "--quiet"], env)[:2] for _ in range(args.warm_runs)]
    median = statistics.median(w for w, _ in warm)
    print(f"warm: {', '.join(f'{w:.1f}' for w, _ in warm)} s wall (median {median:.1f}), "
          f"{', '.join(f'{c:.1f}' for _, c in warm)} s CPU", flush=True)
    start_up = [timed(DPTUNE + ["--help"], env)[:2] for _ in range(args.warm_runs)]
    print(f"`dptune --help` (start-up and imports only): {', '.join(f'{w:.1f}' for w, _ in start_up)} s wall "
          f"(median {statistics.median(w for w, _ in start_up):.1f})", flush=True)
    seconds, cells, sigmas = in_process_plan(cache)
    print(f"in-process plan_sweep, warm disk cache: {seconds:.2f} s for {cells} cells, {sigmas} distinct σ",
          flush=True)


if __name__ == "__main__":
    main()
