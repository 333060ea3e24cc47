"""Per-trial overhead of each experiment tracker (issue 27) on the embedded default sweep.

Runs `dptune sweep` on the embedded default spec with ``tracking`` set to nothing (the anchor),
MLflow (SQLite in the experiment folder), W&B (offline) and TensorBoard, interleaved over
--rounds rounds, each in a fresh storage folder with a warm accountant cache (so calibration costs
the same in every run); prints the median wall time of each variant and its overhead per trial
against the anchor of the same run: (wall − anchor wall) / trials.

Run: python benchmarks/bench_trackers.py [--rounds 2]
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from dptune.platform.store.layout import DEFAULT_SPEC

VARIANTS = {"none": {}, "mlflow": {"mlflow": {}}, "wandb (offline)": {"wandb": {"project": "dptune-bench"}},
            "tensorboard": {"tensorboard": True}}


def run(tracking: dict) -> tuple[float, int]:
    """(wall seconds, trials finished) of one default sweep with ``tracking``."""
    spec = yaml.safe_load(open(DEFAULT_SPEC).read())
    with tempfile.TemporaryDirectory(prefix="dptune-trackers-") as folder:
        path = Path(folder, "spec.yaml")
        path.write_text(yaml.safe_dump({**spec, "tracking": tracking}))
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "dptune", "sweep", str(path), "--storage", folder, "--quiet"],
                              cwd=folder, capture_output=True, text=True)
        wall = time.perf_counter() - start
    counts = re.search(r"(\d+) trials finished", proc.stdout + proc.stderr)
    if proc.returncode != 0 or counts is None:
        sys.exit(f"sweep with tracking {tracking} failed:\n" + (proc.stdout + proc.stderr)[-3000:])
    return wall, int(counts.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    run({})  # warm the accountant cache and the OS's file cache
    walls: dict[str, list[float]] = {name: [] for name in VARIANTS}
    trials = 0
    for _ in range(args.rounds):
        for name, tracking in VARIANTS.items():
            wall, trials = run(tracking)
            walls[name].append(wall)
    anchor = statistics.median(walls["none"])
    print(f"embedded default sweep, {trials} trials, median of {args.rounds} interleaved rounds")
    print("| tracking | wall (s) | overhead per trial (s) |\n|---|---|---|")
    for name, values in walls.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.1f} | {(median - anchor) / trials:+.2f} |")


if __name__ == "__main__":
    main()
