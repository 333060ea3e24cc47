"""Early stopping within a cell (issue 12): the same (C, B, η) grid on the embedded digits task,
with ASHA and without.

Both sweeps run through dptune's own sweep path (plan → SweepSearcher → Ray Tune → store), with the
real DP trainable. Reported per sweep: trials, trial-epochs spent (the sum over trials of the
epochs each trained), wall time, the best finished accuracy per cell, and the trial-epochs and
wall time spent until the cell's best finished accuracy came within ``--tolerance`` (1 point) of
the full grid's best. Goal: ASHA within 1 point of the full grid's best with <= 40% of its epochs.

Run (alone on the machine; the lead records the results in BENCHMARKS.md):
    python benchmarks/bench_asha.py                      # the full benchmark
    python benchmarks/bench_asha.py --tiny               # smoke run (seconds)
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

import pandas as pd

from dptune.platform.sweep.catalog import trainables_catalog
from dptune.platform.sweep.launcher import RunSettings, start_ray
from dptune.platform.sweep.spec_sections import Resources
from dptune.platform.store.results_store import ResultsStore
from dptune.platform.sweep.driver import run_sweep
from dptune.search_spaces import load_spec, plan_sweep


def spec(args: argparse.Namespace, scheduler: dict | str) -> dict:
    return {"axes": {"epsilon": args.epsilon, "delta": 1e-5, "backbone": [args.backbone], "dataset": ["digits"],
                     "epochs": [args.epochs]},
            "clip_bound": args.clip, "batch_size": args.batch,
            "learning_rate": {"reference": args.lr, "reference_batch_size": 128, "multipliers": args.multipliers},
            "pruning": {"min_steps": 20, "plateau_tol": 0.1, "max_batch_sizes": args.max_batch_sizes},
            "search": {"algorithm": "grid", "scheduler": scheduler}, "seeds": args.seeds,
            "trial": {"optimizer": args.optimizer}}


def run(args: argparse.Namespace, name: str, scheduler: dict | str, storage: str) -> tuple[pd.DataFrame, float]:
    catalog = trainables_catalog()
    plan = plan_sweep(load_spec(spec(args, scheduler), catalog), catalog, progress=False)
    settings = RunSettings(experiment=name, storage=storage, max_failures=0,
                           verbose=0, resources=Resources(max_concurrent=args.concurrent))
    start = time.time()
    run_sweep(plan, settings, out=open("/dev/null", "w"))
    rows = ResultsStore(settings.paths.store).table("trials").sort_values("written_at")
    rows["elapsed_s"] = rows["written_at"] - start
    return rows, time.time() - start


def until_within(rows: pd.DataFrame, target: float, tolerance: float) -> tuple[float, float]:
    """(trial-epochs, seconds) spent when the best finished accuracy first reached target − tolerance
    (trials in the order they ended); (nan, nan) if it never did."""
    epochs = 0.0
    best = float("-inf")
    for r in rows.itertuples():
        epochs += float(r.epoch or 0)
        if r.status == "finished" and r.accuracy is not None:
            best = max(best, float(r.accuracy))
        if best >= target - tolerance:
            return epochs, float(r.elapsed_s)
    return float("nan"), float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 8.0])
    parser.add_argument("--epochs", type=float, default=9)
    parser.add_argument("--backbone", default="cnn")
    parser.add_argument("--clip", type=float, nargs="+", default=[0.03, 0.1, 0.3, 1, 3, 10])
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--lr", type=float, default=2.0)
    parser.add_argument("--multipliers", type=float, nargs="+", default=[0.25, 0.5, 1, 2])
    parser.add_argument("--max-batch-sizes", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--grace", type=int, default=1)
    parser.add_argument("--reduction-factor", type=float, default=3)
    parser.add_argument("--concurrent", type=int, default=2, help="trials at a time (the same for both sweeps)")
    parser.add_argument("--cpus", type=int, default=None)
    parser.add_argument("--tolerance", type=float, default=0.01)
    parser.add_argument("--tiny", action="store_true", help="smoke run: 1 ε, 2 C, 1 η, 3 epochs")
    args = parser.parse_args()
    if args.tiny:
        args.epsilon, args.epochs, args.clip, args.multipliers, args.max_batch_sizes = [8.0], 3, [0.1, 1], [1], 1
        args.backbone = "mlp"
    start_ray(num_cpus=args.cpus)
    asha = {"name": "asha", "grace_epochs": args.grace, "reduction_factor": args.reduction_factor}
    out = {}
    with tempfile.TemporaryDirectory() as storage:
        full, full_wall = run(args, "full", "none", storage)
        early, early_wall = run(args, "asha", asha, storage)
    for cell in sorted(full["cell"].unique()):
        f, e = full[full["cell"] == cell], early[early["cell"] == cell]
        target = float(f.loc[f.status == "finished", "accuracy"].max())
        e_epochs, e_wall = until_within(e, target, args.tolerance)
        f_epochs, f_wall = until_within(f, target, args.tolerance)
        out[cell] = {
            "trials": len(f), "stopped_by_asha": int((e.status == "stopped").sum()),
            "full_best": target, "asha_best": float(e.loc[e.status == "finished", "accuracy"].max()),
            "full_trial_epochs": float(f.epoch.sum()), "asha_trial_epochs": float(e.epoch.sum()),
            "asha_epoch_fraction": float(e.epoch.sum() / f.epoch.sum()),
            "full_epochs_to_within": f_epochs, "asha_epochs_to_within": e_epochs,
            "full_wall_to_within_s": f_wall, "asha_wall_to_within_s": e_wall,
        }
    out["total"] = {"full_wall_s": full_wall, "asha_wall_s": early_wall,
                    "full_trial_epochs": float(full.epoch.sum()), "asha_trial_epochs": float(early.epoch.sum()),
                    "asha_epoch_fraction": float(early.epoch.sum() / full.epoch.sum())}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
