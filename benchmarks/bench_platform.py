"""Platform overhead and results-store query speed.

1. 200 trials of a trivial trainable through dptune's own sweep path (Tuner with reused actors,
   one checkpoint and one report per trial, the store callback writing Parquet): wall time per trial.
2. `dptune query`-style aggregate by axes over 1,000,000 trial rows after compaction, and over
   10,000 uncompacted per-trial files.
Run: python benchmarks/bench_platform.py [--trials 200] [--rows 1000000] [--files 10000]
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dptune.platform import tune_adapter
from dptune.platform.store import ResultsStore

AGGREGATE = ("SELECT dataset, backbone, epsilon, count(*) AS n, max(accuracy) AS best, avg(epsilon_spent) AS eps "
             "FROM trials GROUP BY dataset, backbone, epsilon ORDER BY dataset, backbone, epsilon")


def trivial_trainable(config: dict) -> None:
    """Does no training: one report with a checkpoint, as a one-epoch trial would."""
    tune_adapter.report({"accuracy": 0.5, "loss": 1.0, "epsilon_spent": 1.0, "epoch": 1},
                        state={"history": [{"epoch": 1, "accuracy": 0.5, "loss": 1.0}]})


def platform_overhead(n_trials: int) -> float:
    import ray

    from dptune.platform.launcher import RunSettings, run_trials, start_ray

    start_ray(num_cpus=2)
    trials = [{"train": {"dataset": "digits", "model": "mlp", "epsilon": 1.0, "seed": i}, "meta": {"cell": "c"}}
              for i in range(n_trials)]
    with tempfile.TemporaryDirectory() as storage:
        settings = RunSettings(experiment="overhead", storage=storage, verbose=0, max_failures=0)
        start = time.perf_counter()
        run_trials(trials, settings, trainable=trivial_trainable)
        elapsed = time.perf_counter() - start
        assert len(ResultsStore(settings.paths.store).table("trials")) == n_trials
    ray.shutdown()
    return elapsed


def synthetic_trials(n: int, rng: np.random.Generator, offset: int = 0) -> pa.Table:
    return pa.table({
        "trial_id": [f"t{offset + i}" for i in range(n)],
        "dataset": rng.choice(["cifar100", "sun397", "cassava"], n), "backbone": rng.choice(["vit_b", "vit_t"], n),
        "epsilon": rng.choice([0.5, 1.0, 2.0, 8.0], n), "clip_bound": rng.choice([0.1, 1.0, 10.0], n),
        "batch_size": rng.choice([256, 1024, 4096], n), "learning_rate": rng.random(n),
        "accuracy": rng.random(n), "epsilon_spent": rng.random(n), "status": ["finished"] * n,
        "written_at": np.full(n, time.time()),
    })


def timed_query(store: ResultsStore, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        store.query(AGGREGATE)
        times.append(time.perf_counter() - start)
    return min(times)


def query_speed(n_rows: int, n_files: int) -> tuple[float, float, float]:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as root:
        store = ResultsStore(f"{root}/store")
        per = n_rows // 100
        for k in range(100):  # as many rows as a big sweep's compacted history, in 100 small parts
            pq.write_table(synthetic_trials(per, rng, k * per), f"{root}/store/trials/trial-batch{k}.parquet")
        start = time.perf_counter()
        store.compact()
        compact_s = time.perf_counter() - start
        compacted = timed_query(store)
    with tempfile.TemporaryDirectory() as root:
        store = ResultsStore(f"{root}/store")
        for i in range(n_files):  # one file per trial, as the sweep writes them before compaction
            pq.write_table(synthetic_trials(1, rng, i), f"{root}/store/trials/trial-t{i}.parquet")
        loose = timed_query(store)
    return compacted, compact_s, loose


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    compacted, compact_s, loose = query_speed(args.rows, args.files)
    print(f"query over {args.rows:,} rows after compaction: {compacted:.3f} s (compaction took {compact_s:.1f} s)")
    print(f"query over {args.files:,} uncompacted trial files: {loose:.3f} s")
    elapsed = platform_overhead(args.trials)
    print(f"{args.trials} trivial trials: {elapsed:.1f} s wall, {elapsed / args.trials:.3f} s per trial")


if __name__ == "__main__":
    main()
