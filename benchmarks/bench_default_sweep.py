"""Wall time of `dptune sweep` end to end (issue 16: the embedded default sweep before and after
the engine change).

Runs `python -m dptune sweep [SPEC] --storage <temp dir> --quiet` in a subprocess (local Ray, the
spec's own resources; the embedded default spec when no SPEC is given) and prints the number of
trials finished and errored and the wall seconds from start to exit, calibration, Ray start-up
and the results summary included. The sweep's output goes to --log when given; if the sweep
fails, its last lines are printed.

Run: python benchmarks/bench_default_sweep.py [--spec SPEC] [--log FILE]
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", help="sweep spec (YAML) [the embedded default]")
    parser.add_argument("--log", help="write the sweep's output here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dptune-sweep-bench-") as storage:
        command = [sys.executable, "-m", "dptune", "sweep", *([str(Path(args.spec).resolve())] if args.spec else []),
                   "--storage", storage, "--quiet"]
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=storage, capture_output=True, text=True)
        wall = time.perf_counter() - start
    output = proc.stdout + proc.stderr
    if args.log:
        Path(args.log).write_text(output)
    counts = re.search(r"(\d+) trials finished, (\d+) errored", output)
    spec = args.spec or "embedded default"
    if counts is None:
        print(f"dptune sweep ({spec}) failed (exit {proc.returncode}) after {wall:.1f} s; last output:\n"
              + "\n".join(output.strip().splitlines()[-15:]))
        sys.exit(1)
    finished, errored = map(int, counts.groups())
    print(f"dptune sweep ({spec}): {finished} trials finished, {errored} errored, exit {proc.returncode}; "
          f"wall {wall:.1f} s ({wall / max(finished + errored, 1):.1f} s per trial)")


if __name__ == "__main__":
    main()
