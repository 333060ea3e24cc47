"""Wall time of `dptune sweep` end to end (issue 16: the embedded default sweep before and after
the engine change).

Runs `python -m dptune sweep [SPEC] --storage <temp dir> --quiet` in a subprocess (local Ray, the
spec's own resources; the embedded default spec when no SPEC is given) and prints the number of
trials finished and errored and the wall seconds from start to exit, calibration, Ray start-up
and the results summary included. The sweep's output goes to --log when given; if the sweep
fails, its last lines are printed.

With ``--pack off`` the spec runs with ``search: {pack: off}`` (every configuration its own trial),
the reference of packed trials (issue 36); each run prints its best configuration per cell.

Run: python benchmarks/bench_default_sweep.py [--spec SPEC] [--log FILE] [--pack off]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def store_train_times(storage: str) -> list[float] | None:
    """Each trial's time in its training steps, from the sweep's results store (None when trials
    ran in packs: a pack's members share its time and its progress lines' wall, so neither adds up)."""
    from dptune.platform.store.results_store import ResultsStore

    stores = list(Path(storage).glob("*/store"))
    if not stores:
        return []
    trials = ResultsStore(str(stores[0])).table("trials")
    if trials["trial_id"].str.contains(r"-m\d+$").any():
        return None
    return [float(t) for t in trials.get("train_time_s", []) if t == t]


def best_per_cell(storage: str) -> str:
    """The sweep's answer: per cell, the configuration with the best seed-mean accuracy (ties to the smaller C,
    then B, then η, as the analysis breaks them: configurations that clipped every example tie exactly)."""
    from dptune.platform.store.results_store import ResultsStore

    stores = list(Path(storage).glob("*/store"))
    frame = ResultsStore(str(stores[0])).query(
        "SELECT cell, clip_bound AS C, batch_size AS B, round(learning_rate, 4) AS lr, round(avg(accuracy), 4) AS acc, "
        "count(*) AS seeds FROM trials WHERE status = 'finished' GROUP BY cell, C, B, lr "
        "QUALIFY row_number() OVER (PARTITION BY cell ORDER BY acc DESC, C, B, lr) = 1 ORDER BY cell")
    return frame.to_string(index=False)


def with_pack_off(spec: str | None, folder: str) -> str:
    """A copy of ``spec`` (the embedded default when None) with ``search: {pack: off}``."""
    import yaml

    from dptune.platform.store.layout import DEFAULT_SPEC

    text = yaml.safe_load(Path(spec or DEFAULT_SPEC).read_text())
    text.setdefault("search", {})["pack"] = "off"
    path = Path(folder) / "spec-pack-off.yaml"
    path.write_text(yaml.safe_dump(text))
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", help="sweep spec (YAML) [the embedded default]")
    parser.add_argument("--log", help="write the sweep's output here")
    parser.add_argument("--slots", type=int, default=2, help="trials the sweep runs at a time [%(default)s]")
    parser.add_argument("--cold", action="store_true", help="an empty accountant cache (σ and ε computed afresh)")
    parser.add_argument("--pack", choices=("default", "off"), default="default",
                        help="off: every configuration its own trial (search: {pack: off}) [%(default)s]")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dptune-sweep-bench-") as storage:
        spec_path = with_pack_off(args.spec, storage) if args.pack == "off" else args.spec
        command = [sys.executable, "-m", "dptune", "sweep", *([str(Path(spec_path).resolve())] if spec_path else []),
                   "--storage", storage, "--quiet"]
        start = time.perf_counter()
        env = {**os.environ, **({"DPTUNE_CACHE_DIR": str(Path(storage) / "cache")} if args.cold else {})}
        proc = subprocess.run(command, cwd=storage, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - start
        train = store_train_times(storage)
        answer = best_per_cell(storage) if proc.returncode == 0 else ""
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
    print(f"dptune sweep ({spec}, pack {args.pack}): {finished} trials finished, {errored} errored, exit "
          f"{proc.returncode}; wall {wall:.1f} s ({wall / max(finished + errored, 1):.1f} s per trial)")
    print(answer)
    # where the time goes: each trial's wall (its progress line, from start to end as the driver saw
    # them) against its training steps (train_time_s in the store), and what is left of the sweep's
    # wall outside the trials (start-up, calibration, closing), with `slots` trials at a time
    walls = [float(w) for w in re.findall(r"^\[\d+/\d+\].*\((\d+\.\d+) s\)$", output, re.MULTILINE)]
    if train is None:
        print("trials ran in packs: their members share each pack's wall and training time (not summed)")
    elif walls and train:
        outside = wall - sum(walls) / args.slots
        print(f"trials: {sum(walls):.1f} s of trial wall for {sum(train):.1f} s of training steps "
              f"({sum(walls) / sum(train):.2f}x; goal <= 1.25x); outside the trials: {outside:.1f} s "
              f"(with {args.slots} at a time; goal <= 5 s)")


if __name__ == "__main__":
    main()
