"""The timeline of a short sweep (issue 33, item 4): where the wall time goes before the first
optimizer step and around each worker's first trial.

Runs `python -m dptune sweep SPEC --storage <temp> --quiet` in a fresh process with
``DPTUNE_TIMELINE`` set (:mod:`dptune.timeline`: the driver and every trial process append their
named moments to one file), then prints, from the command's launch: the CLI's imports, the plan
(σ calibrated, Ray started beside it), Ray Tune's start, the first optimizer step of the sweep; per
worker process: its start, its first trial's entry, the trainer built (data, model, engine), the
first step and the end, and what the first trial cost beyond its training steps; and the per-trial
overhead of the later trials (trial wall from entry to end minus training). Goals (issue 33): the
first optimizer step ≤ 5 s after launch, a worker's first trial ≤ 2 s beyond its training.

    python benchmarks/bench_timeline.py [--spec SPEC] [--warm]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: A short sweep: one cell, four trials of a few steps each, two at a time.
SPEC = """
experiment: timeline
axes: {epsilon: [4], backbone: [cnn], dataset: [digits], epochs: [2]}
clip_bound: [1]
batch_size: [256]
learning_rate: {reference: 2.0, reference_batch_size: 256, multipliers: [0.25, 0.5, 1, 2]}
pruning: {min_steps: 1, plateau_tol: 100}
search: {scheduler: none, proxy: off, transfer: off}
resources: {cpu: 1, gpu: 0}
"""


def run(spec: Path, storage: str, timeline: Path) -> tuple[float, float, str]:
    env = {**os.environ, "DPTUNE_TIMELINE": str(timeline)}
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "dptune", "sweep", str(spec), "--storage", storage, "--quiet"],
                          cwd=storage, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"the sweep failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return start, time.time(), proc.stdout


def report(records: list[dict], start: float, end: float) -> None:
    def at(moment: str) -> float:
        return min(r["time"] for r in records if r["moment"] == moment) - start

    print(f"from launch (s): CLI imported {at('cli_start'):.2f}; plan ready (σ, Ray started beside it) "
          f"{at('planned'):.2f}; Ray Tune starts {at('tune_fit'):.2f}; first trial entered "
          f"{at('trial_entered'):.2f}; **first optimizer step {at('first_step'):.2f}** (goal ≤ 5); "
          f"Tune done {at('tune_done'):.2f}; exit {end - start:.2f}")
    by_pid = defaultdict(list)
    for r in records:
        by_pid[r["pid"]].append(r)
    driver = next(r["pid"] for r in records if r["moment"] == "cli_start")
    later = []
    for pid, marks in sorted(by_pid.items(), key=lambda kv: kv[1][0]["time"]):
        if pid == driver:
            continue
        born = next((r["process_started"] for r in marks if "process_started" in r), marks[0]["time"])
        trials, current = [], {}
        for r in marks:
            current[r["moment"]] = r
            if r["moment"] == "trial_end":
                trials.append(current)
                current = {}
        if not trials:
            continue
        first = trials[0]
        wall = first["trial_end"]["time"] - born
        train = first["trial_end"]["train_time_s"]
        print(f"worker {pid}: process started {born - start:.2f}; first trial entered "
              f"{first['trial_entered']['time'] - born:+.2f} after its start, trainer built "
              f"{first['trainer_built']['time'] - first['trial_entered']['time']:+.2f} later, first step "
              f"{first['first_step']['time'] - first['trainer_built']['time']:+.2f} later; first trial: "
              f"{wall:.2f} s from process start for {train:.2f} s of training: **{wall - train:.2f} s beyond it** "
              f"(goal ≤ 2); {len(trials)} trial(s)")
        later += [t["trial_end"]["time"] - t["trial_entered"]["time"] - t["trial_end"]["train_time_s"]
                  for t in trials[1:]]
    if later:
        print(f"later trials: {statistics.median(later):.2f} s median beyond training, from entry to end "
              f"(evaluation, checkpoints, Tune's reports; {len(later)} trials)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", help="sweep spec [a one-cell sweep of four short trials]")
    parser.add_argument("--warm", action="store_true", help="run once untimed first (σ cache and data on disk)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dptune-timeline-") as tmp:
        spec = Path(args.spec).resolve() if args.spec else Path(tmp) / "spec.yaml"
        if not args.spec:
            spec.write_text(SPEC)
        if args.warm:
            run(spec, tempfile.mkdtemp(dir=tmp), Path(tmp) / "warm.jsonl")
        timeline = Path(tmp) / "timeline.jsonl"
        start, end, _ = run(spec, tempfile.mkdtemp(dir=tmp), timeline)
        records = [json.loads(line) for line in timeline.read_text().splitlines()]
        if os.environ.get("BENCH_TIMELINE_RAW"):
            for r in sorted(records, key=lambda r: r["time"]):
                print(f"{r['time'] - start:7.2f}  {r['pid']:>7}  {r['moment']}")
        report(records, start, end)


if __name__ == "__main__":
    main()
