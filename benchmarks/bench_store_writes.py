"""What durable writes cost per trial: `ResultsStore.write_trial` (three Parquet files, each
temp file + fsync + rename + folder fsync) against the same three files written as before issue 23
(temp file + rename, no fsync), interleaved, on the local disk of the store folder.

Run alone: python benchmarks/bench_store_writes.py [--trials 200] [--rounds 5] [--folder DIR]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from dptune.platform.store.results_store import ResultsStore, schema_tag


def trial_rows(i: int) -> tuple[dict, list[dict]]:
    """A trial row and 10 epoch rows of the size a sweep writes (a few dozen columns)."""
    trial = {"trial_id": f"t{i}", "config_id": f"c{i}", "status": "finished", "accuracy": 0.9, "epsilon": 1.0,
             **{f"h{k}": float(k) for k in range(40)}, "config": "{" + "x" * 800 + "}"}
    return trial, [{"epoch": e, "accuracy": 0.5 + e / 100, "loss": 1.0 / e} for e in range(1, 11)]


def unsynced(store: ResultsStore, trial: dict, epochs: list[dict]) -> None:
    """The three files as the store wrote them before: temp file and rename, nothing fsynced."""
    for table, rows in (("epochs", epochs), ("gradnorms", [{"trial_id": trial["trial_id"]}]), ("trials", [trial])):
        data = pa.Table.from_pylist([{**r, "trial_id": trial["trial_id"], "written_at": time.time()} for r in rows])
        final = f"{store.path}/{table}/trial-{trial['trial_id']}.{schema_tag(data.schema)}.parquet"
        tmp = f"{store.path}/{table}/.{uuid.uuid4().hex}.tmp"
        pq.write_table(data, tmp)
        os.replace(tmp, final)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--folder", default=None, help="where the stores go [a temporary folder]")
    args = parser.parse_args()
    times: dict[str, list[float]] = {"durable (fsync)": [], "before (no fsync)": []}
    with tempfile.TemporaryDirectory(dir=args.folder) as root:
        for r in range(args.rounds):
            for name in times:
                store = ResultsStore(f"{root}/{r}-{name[:3]}")
                start = time.perf_counter()
                for i in range(args.trials):
                    trial, epochs = trial_rows(i)
                    if name.startswith("durable"):
                        store.write_trial(trial, epochs)
                    else:
                        unsynced(store, trial, epochs)
                times[name].append((time.perf_counter() - start) / args.trials)
    print(f"{args.trials} trials x {args.rounds} interleaved rounds; store under {args.folder or tempfile.gettempdir()}")
    print("| write | ms per trial (median) | min | max |\n|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {1e3 * statistics.median(values):.2f} | {1e3 * min(values):.2f} | {1e3 * max(values):.2f} |")


if __name__ == "__main__":
    main()
