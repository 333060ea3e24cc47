"""Start-up of the commands a user types most (issue 17): wall time of fresh processes.

Each row is the real command (`python -m dptune …`) in a new interpreter, run ``--repeats`` times
(median reported, min and max beside it); imports and interpreter start-up are included, which is
what a user waits for. The warm plan reads the accounting cache and the catalog snapshot that one
untimed plan of the same spec wrote into a private cache folder; the query runs over a small
synthetic store. Goals (issue 17): help ≤ 1 s, warm plan ≤ 1 s, query ≤ 1.5 s.

    python benchmarks/bench_startup.py [--repeats 5] [--spec examples/digits_small.yaml]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DPTUNE = [sys.executable, "-m", "dptune"]


def wall(command: list[str], env: dict, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, env=env, capture_output=True, check=True, cwd=ROOT)
        times.append(time.perf_counter() - start)
    return times


def small_store(root: Path) -> str:
    from dptune.platform.store.results_store import ResultsStore

    store = ResultsStore(str(root / "store"))
    for i in range(50):
        store.write_trial({"trial_id": f"t{i}", "epsilon": [1.0, 8.0][i % 2], "clip_bound": 1.0,
                           "batch_size": 64, "accuracy": i / 50}, epochs=[{"epoch": 1, "accuracy": i / 50}])
    return store.root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--spec", default=str(ROOT / "examples" / "digits_small.yaml"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "DPTUNE_CACHE_DIR": f"{tmp}/cache"}
        subprocess.run([*DPTUNE, "plan", args.spec, "--quiet"], env=env, capture_output=True, check=True, cwd=ROOT)
        store = small_store(Path(tmp))
        rows = {
            "dptune --help": [*DPTUNE, "--help"],
            "dptune train --help": [*DPTUNE, "train", "--help"],
            "dptune query --help": [*DPTUNE, "query", "--help"],
            f"dptune plan {Path(args.spec).name} (warm)": [*DPTUNE, "plan", args.spec, "--quiet"],
            "dptune query (50 trials)": [*DPTUNE, "query", "SELECT epsilon, max(accuracy) FROM trials GROUP BY ALL",
                                         "--store", store],
        }
        print(f"{'command':<44} {'median s':>9} {'min s':>7} {'max s':>7}   ({args.repeats} fresh processes each)")
        for label, command in rows.items():
            times = wall(command, env, args.repeats)
            print(f"{label:<44} {statistics.median(times):9.3f} {min(times):7.3f} {max(times):7.3f}")


if __name__ == "__main__":
    main()
