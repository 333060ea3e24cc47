"""Platform overhead and results-store query speed.

1. 200 trials of a trivial trainable through dptune's own sweep path (Tuner with reused actors,
   one checkpoint and one report per trial, the store callback writing Parquet): wall time per
   trial, split into the fixed start (Tuner start to the first trial: Ray starting the trial
   worker processes, which import torch) and the marginal cost of one more trial (first to last
   trial start, over the trials between).
2. `dptune query`-style aggregate by axes over 1,000,000 trial rows after compaction; over
   10,000 loose per-trial files (no compaction at all); and over the store that 10,000 trials
   leave through the sweep's own write path (each trial written as the store callback writes it,
   with its compaction policy: `ResultsStore.compact_every(COMPACT_EVERY)`).
Run alone: python benchmarks/bench_platform.py [--trials 200] [--rows 1000000] [--files 10000]
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dptune.platform.sweep import tune_adapter
from dptune.platform.store.results_store import ResultsStore, schema_tag

AGGREGATE = ("SELECT dataset, backbone, epsilon, count(*) AS n, max(accuracy) AS best, avg(epsilon_spent) AS eps "
             "FROM trials GROUP BY dataset, backbone, epsilon ORDER BY dataset, backbone, epsilon")


def trivial_trainable(stamps: str):
    """A trainable that does no training: one report with a checkpoint, as a one-epoch trial would
    (and notes when it started, in ``stamps``)."""
    def trivial(config: dict) -> None:
        import os
        with open(os.path.join(stamps, str(config["seed"])), "w") as f:
            f.write(repr(time.time()))
        tune_adapter.report({"test_accuracy": 0.5, "score": 0.5, "test_loss": 1.0, "epsilon_spent": 1.0, "epoch": 1, "step": config["steps"],
                             "steps": config["steps"]},
                            state={"history": [{"epoch": 1, "test_accuracy": 0.5, "test_loss": 1.0}]})
    return trivial


def trivial_plan(n_trials: int):
    """A plan of ``n_trials`` trials of one configuration (one seed each), built as a sweep builds it."""
    from dptune.platform.sweep import spec_sections  # noqa: F401
    from dptune.platform.sweep.catalog import trainables_catalog
    from dptune.search_spaces import load_spec, plan_sweep

    spec = {"axes": {"epsilon": 1.0, "backbone": "mlp", "dataset": "digits", "epochs": 1}, "clip_bound": [1.0],
            "batch_size": [64], "learning_rate": {"reference": 1.0, "reference_batch_size": 64},
            "seeds": list(range(n_trials))}
    catalog = trainables_catalog()
    return plan_sweep(load_spec(spec, catalog), catalog, workers=1)


def platform_overhead(n_trials: int) -> tuple[float, float, float]:
    """(wall seconds of the whole run, fixed start, marginal seconds per trial)."""
    import os

    import ray

    from dptune.platform.sweep.launcher import RunSettings, start_ray
    from dptune.platform.sweep.driver import run_sweep

    plan = trivial_plan(n_trials)
    start_ray(num_cpus=2)
    with tempfile.TemporaryDirectory() as storage, tempfile.TemporaryDirectory() as stamps:
        settings = RunSettings(experiment="overhead", storage=storage, verbose=0, max_failures=0)
        begin, start = time.time(), time.perf_counter()
        run_sweep(plan, settings, trainable=trivial_trainable(stamps))
        elapsed = time.perf_counter() - start
        assert len(ResultsStore(settings.paths.store).table("trials")) == n_trials
        started = sorted(float(open(os.path.join(stamps, name)).read()) for name in os.listdir(stamps))
    ray.shutdown()
    return elapsed, started[0] - begin, (started[-1] - started[0]) / max(1, len(started) - 1)


def synthetic_trials(n: int, rng: np.random.Generator, offset: int = 0) -> pa.Table:
    return pa.table({
        "trial_id": [f"t{offset + i}" for i in range(n)], "config_id": [f"c{offset + i}" for i in range(n)],
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


def query_speed(n_rows: int, n_files: int) -> tuple[float, float, float, float, int]:
    """(query after compaction, compaction seconds, query over loose files, query over the store
    the sweep's write path leaves, how many files that store holds)."""
    from dptune.platform.sweep.store_callback import COMPACT_EVERY

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
        for i in range(n_files):  # one file per trial, named as the store names them, before compaction
            table = synthetic_trials(1, rng, i)
            pq.write_table(table, f"{root}/store/trials/trial-t{i}.{schema_tag(table.schema)}.parquet")
        loose = timed_query(store)
    with tempfile.TemporaryDirectory() as root:
        store = ResultsStore(f"{root}/store")
        for i in range(n_files):  # the same trials through the store callback's write and compaction
            row = synthetic_trials(1, rng, i).to_pylist()[0]
            store.write_trial(row, [{"epoch": 1, "accuracy": row["accuracy"]}])
            store.compact_every(COMPACT_EVERY)
        swept = timed_query(store)
        held = len(store._files("trials"))
    return compacted, compact_s, loose, swept, held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    compacted, compact_s, loose, swept, held = query_speed(args.rows, args.files)
    print(f"query over {args.rows:,} rows after compaction: {compacted:.3f} s (compaction took {compact_s:.1f} s)")
    print(f"query over {args.files:,} loose trial files (never compacted): {loose:.3f} s")
    print(f"query over the store {args.files:,} trials leave through the sweep's write path "
          f"({held} files): {swept:.3f} s")
    elapsed, fixed, marginal = platform_overhead(args.trials)
    print(f"{args.trials} trivial trials: {elapsed:.1f} s wall, {elapsed / args.trials:.3f} s per trial; "
          f"fixed start {fixed:.1f} s, then {marginal:.3f} s per additional trial")


if __name__ == "__main__":
    main()
