"""One trial on W data-parallel workers (issue 14): DP step throughput at W = 1 and W = 2, and the
share of the step spent in communication.

Each configuration runs as the platform runs a multi-worker trial: a Ray Train ``TorchTrainer``
with W CPU workers (gloo), one torch thread each, every worker a dptune ``Trainer`` with
``ProcessGroupWorkers`` (W = 1: the one-process path, no collectives). The data are synthetic
(N random examples of the model's input shape, 10 classes); σ = 1 (no calibration); the same seeds
for every W, so every W trains on the same Poisson batches (expected size B). After ``--warmup``
steps, ``--steps`` steps are timed one by one on rank 0:

- examples/s = B / median step time (sampling, the worker's shard through the book-keeping engine,
  all-reduce of the clipped sums, noise, SGD step);
- communication share = time in collectives / step time, summed over the timed steps. It includes
  waiting for the slower worker (the shards of a Poisson batch differ in size), so it bounds the
  pure transfer time from above.

Run (the lead, alone on the machine, W + 1 free cores):
    python benchmarks/bench_workers.py --models cnn wrn16_4 --batch 512 --steps 20 --markdown
Smoke run: python benchmarks/bench_workers.py --models cnn --batch 32 --steps 2 --warmup 1
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")

#: model -> (input shape, N synthetic training examples)
MODELS = {"cnn": ((1, 28, 28), 16384), "wrn16_4": ((3, 32, 32), 16384)}


def per_worker(loop_config: dict) -> None:
    """One worker: build the Trainer, time ``steps`` steps after ``warmup``; rank 0 writes the figures."""
    import torch
    from torch.utils.data import TensorDataset

    from dptune.trainables.config import TrainConfig
    from dptune.trainables.engine.distributed import ProcessGroupWorkers, Workers
    from dptune.trainables.data.splits import DatasetSplits
    from dptune.trainables.training import Trainer

    torch.set_num_threads(1)
    shape, n = MODELS[loop_config["model"]]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g)
    data = DatasetSplits("synthetic", TensorDataset(x, y), TensorDataset(x[:64], y[:64]), 10,
                         [str(c) for c in range(10)], shape)
    workers = ProcessGroupWorkers() if loop_config["workers"] > 1 else Workers()
    batch = loop_config["batch"]
    cfg = TrainConfig(dataset="synthetic", model=loop_config["model"], epsilon=1.0, noise_multiplier=1.0,
                      batch_size=batch, epochs=100.0, learning_rate=0.1, device="cpu", seed=0,
                      max_physical_batch_size=loop_config["physical"])
    trainer = Trainer(cfg, data, workers=workers)
    for _ in range(loop_config["warmup"]):
        trainer.train_step()
    times, comm_before = [], workers.comm_time_s
    for _ in range(loop_config["steps"]):
        start = time.perf_counter()
        trainer.train_step()
        times.append(time.perf_counter() - start)
    comm = workers.comm_time_s - comm_before
    if workers.rank == 0:
        with open(loop_config["out"], "w") as f:
            json.dump({"median_step_s": statistics.median(times), "total_s": sum(times), "comm_s": comm}, f)


def run(model: str, workers: int, args: argparse.Namespace, storage: str) -> dict:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out = os.path.join(storage, f"{model}-{workers}.json")
    TorchTrainer(per_worker, train_loop_config={"model": model, "workers": workers, "batch": args.batch,
                                                "steps": args.steps, "warmup": args.warmup, "out": out,
                                                "physical": args.physical},
                 torch_config=TorchConfig(backend="gloo"),
                 scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
                 run_config=RunConfig(storage_path=storage, name=f"{model}-{workers}")).fit()
    with open(out) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--batch", type=int, default=512, help="expected (Poisson) batch size B")
    parser.add_argument("--physical", type=int, default=None, help="max_physical_batch_size per worker")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()

    import ray

    ray.init(address="local", num_cpus=max(args.workers), include_dashboard=False, logging_level=logging.ERROR,
             _node_ip_address="127.0.0.1")
    rows = []
    with tempfile.TemporaryDirectory() as storage:
        for model in args.models:
            base = None
            for w in args.workers:
                r = run(model, w, args, storage)
                rate = args.batch / r["median_step_s"]
                base = base or rate
                rows.append((model, w, rate, rate / base, r["comm_s"] / r["total_s"]))
    ray.shutdown()
    header = ["model", "W", "examples/s", "speed-up vs W=1", "communication share"]
    lines = [(m, str(w), f"{rate:.0f}", f"{up:.2f}×", f"{share:.1%}") for m, w, rate, up, share in rows]
    if args.markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        print(f"B={args.batch}, {args.steps} timed steps, 1 thread per worker")
        for line in [header, *lines]:
            print("  ".join(f"{c:>20}" for c in line))


if __name__ == "__main__":
    main()
