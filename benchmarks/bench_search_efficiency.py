"""Benchmark: how many trials each search needs to come within 1 accuracy point of the best
configuration of the full (unpruned) grid, on an embedded task.

Task: digits (N = 1,437), a small MLP (one hidden layer of 64 tanh units), DP-SGD, δ = 1e-5,
3 epochs, two cells: ε = 0.5 and ε = 2. Full grid per cell: C ∈ {0.1, 1, 10} × B ∈ {32, …, 1024}
(6) × η(B) = 2·√(B/128)·m, m ∈ {0.25, 0.5, 1, 2}: 72 configurations, each trained once (seed 0)
with ``dptune.trainables.training.train`` in two worker processes. The pruned grid is the same
spec with the minimum-step (T ≥ 20) and σ√T plateau (5%) rules on. Optuna TPE (the SweepSearcher
used by sweeps) searches the pruned space and, for comparison, the full one; it is replayed
against the table of trained results, since a configuration trained twice with the same seed
gives the same accuracy (checked below), for 10 sampler seeds.

Per cell: for a grid, its size (every configuration must run before its best is known) and
whether its best reaches the target; for a random order, the expected position of the first
configuration within the target, (n + 1)/(k + 1) for k such configurations among n; for Optuna,
trials until its first configuration within the target (median and worst over sampler seeds).
Optuna's GP sampler (``search: {algorithm: gp}``, the SweepSearcher over continuous log ranges of C
and η between the grid's smallest and largest values and the pruned B) proposes configurations off
the grid, so each of its proposals is trained when proposed (seed 0, as the table's), for
``--gp-seeds`` sampler seeds in the worker processes; its wall is the training seconds up to its
first hit, the grid's and TPE's the same sum over the table's runs in the order they ran.

    python benchmarks/bench_search_efficiency.py [--workers 2] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SPEC = {
    "axes": {"epsilon": [0.5, 2], "delta": 1e-5, "backbone": "mlp", "dataset": "digits", "epochs": 3},
    "clip_bound": [0.1, 1, 10],
    "batch_size": [32, 64, 128, 256, 512, 1024],
    "learning_rate": {"reference": 2.0, "reference_batch_size": 128, "multipliers": [0.25, 0.5, 1, 2]},
    "trial": {"optimizer": "sgd", "model_options": {"hidden": 64, "depth": 1}},
    "seeds": [0],
}
FULL = {"min_steps": 1, "plateau_tol": 1e9}           # every B that fits in the data is kept
PRUNED = {"min_steps": 20, "plateau_tol": 0.05}
TOLERANCE = 0.01                                      # one accuracy point
SAMPLER_SEEDS = range(10)
#: The samplers search the grid's own space at full scale, every lever named off: proxies (on by default
#: with one seed) would run B/k, bracketing B beyond the table, multi-fidelity would stop trials early.
FIXED_SPACE = {"scheduler": "none", "proxy": "off", "transfer": "off", "pack": "off", "bracket": "off",
               "racing": "off"}

_splits: dict = {}   # split seed → the digits split, loaded once per worker


def train_one(config: dict) -> tuple[float, float]:
    """Final test accuracy and wall time of one trial (in a worker process), on the train/test split
    its trial would use (its ``split_seed``, else its seed, as the trainer splits)."""
    import torch

    from dptune.platform.sweep.trial_config import train_config
    from dptune.trainables.data.catalog import load_dataset
    from dptune.trainables.training import train as run

    torch.set_num_threads(1)
    split = config.get("split_seed", config["seed"])
    if split not in _splits:
        _splits[split] = load_dataset("digits", seed=split)
    start = time.perf_counter()
    history = run(train_config(config), progress=False, data=_splits[split])
    return history[-1]["test_accuracy"], time.perf_counter() - start


def key(trial: dict) -> tuple[str, float, int, float]:
    return (trial["cell"], trial["clip_bound"], trial["batch_size"],
            trial["lr_multiplier"])


def plan(catalog, **sections):
    from dptune.search_spaces import load_spec, plan_sweep

    return plan_sweep(load_spec({**SPEC, **sections}, catalog), catalog)


def expected_first_hit(values: list[float], target: float) -> float:
    """Expected position of the first value >= target in a uniformly random order."""
    hits = sum(v >= target for v in values)
    return (len(values) + 1) / (hits + 1) if hits else float("inf")


def optuna_hits(catalog, accuracy: dict, targets: dict, budget: int, pruning: dict) -> dict[str, list[float]]:
    """Per cell, the trials Optuna runs there until its first configuration within the cell's
    target (inf: never, within the budget), for each sampler seed."""
    from ray.tune.search import Searcher

    from dptune.platform.sweep.searcher import SweepSearcher

    hits: dict[str, list[float]] = {cell: [] for cell in targets}
    for seed in SAMPLER_SEEDS:
        search = {"algorithm": "optuna", "budget": budget, "seed": seed, **FIXED_SPACE}
        searcher = SweepSearcher(plan(catalog, pruning=pruning, search=search), metric="accuracy")
        seen = {cell: 0 for cell in targets}
        first = {cell: float("inf") for cell in targets}
        i = 0
        while (config := searcher.suggest(str(i))) != Searcher.FINISHED:
            k = key(config)
            seen[k[0]] += 1
            if accuracy[k] >= targets[k[0]] and first[k[0]] == float("inf"):
                first[k[0]] = seen[k[0]]
            searcher.on_trial_complete(str(i), {"accuracy": accuracy[k]})
            i += 1
        for cell in targets:
            hits[cell].append(first[cell])
    return hits


def gp_search(args: tuple) -> dict[str, tuple[list[float], list[float]]]:
    """One sampler seed of the GP search on the pruned space (in a worker process): per cell, the
    accuracies and training seconds of its proposals in order."""
    seed, budget = args
    from ray.tune.search import Searcher

    from dptune.platform.sweep.catalog import trainables_catalog
    from dptune.platform.sweep.searcher import SweepSearcher

    searcher = SweepSearcher(plan(trainables_catalog(), pruning=PRUNED,
                                  search={"algorithm": "gp", "budget": budget, "seed": seed, **FIXED_SPACE}),
                             metric="accuracy")
    out: dict[str, tuple[list[float], list[float]]] = {}
    i = 0
    while (config := searcher.suggest(str(i))) != Searcher.FINISHED:
        accuracy, seconds = train_one(config)
        accs, secs = out.setdefault(config["cell"], ([], []))
        accs.append(accuracy)
        secs.append(seconds)
        searcher.on_trial_complete(str(i), {"accuracy": accuracy})
        i += 1
    return out


def to_target(values: list[float], seconds: list[float], target: float) -> tuple[float, float]:
    """Trials and training seconds until the first value within the target (inf: never)."""
    for i, v in enumerate(values):
        if v >= target:
            return i + 1, sum(seconds[:i + 1])
    return float("inf"), float("inf")


def gp_summary(hits: list[tuple[float, float]]) -> dict:
    """Trials and training seconds to the first hit per sampler seed, with their medians and worst."""
    trials, secs = [h[0] for h in hits], [h[1] for h in hits]
    return {"per_seed": trials, "median": statistics.median(trials), "worst": max(trials), "seconds": secs,
            "median_seconds": statistics.median(secs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gp-seeds", type=int, default=5, help="sampler seeds of the GP search")
    parser.add_argument("--out", default=str(Path(__file__).with_name("results") / "search_efficiency.json"))
    args = parser.parse_args()

    from dptune.platform.sweep.catalog import trainables_catalog

    catalog = trainables_catalog()
    full, pruned = plan(catalog, pruning=FULL), plan(catalog, pruning=PRUNED)
    trials = full.trials()
    print(f"full grid: {len(trials)} trials in {len(full.cells)} cells; load average {os.getloadavg()[0]:.1f}",
          flush=True)
    for cell in pruned:
        print(cell.cell.key + "\n" + cell.batches.to_string(index=False), flush=True)
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        outcomes = list(pool.map(train_one, trials))
        elapsed = time.perf_counter() - start
        budget = max(c.num_configurations for c in pruned)
        gp_runs = list(pool.map(gp_search, [(seed, budget) for seed in range(args.gp_seeds)]))
    accuracy = {key(t): acc for t, (acc, _) in zip(trials, outcomes)}
    seconds = {key(t): s for t, (_, s) in zip(trials, outcomes)}
    best_key = max(accuracy, key=accuracy.get)
    again, _ = train_one(next(t for t in trials if key(t) == best_key))
    assert again == accuracy[best_key], f"training is not deterministic: {again} != {accuracy[best_key]}"

    cells = [c.cell.key for c in full]
    best = {cell: max((k for k in accuracy if k[0] == cell), key=accuracy.get) for cell in cells}
    targets = {cell: accuracy[best[cell]] - TOLERANCE for cell in cells}
    pruned_keys = [key(t) for t in pruned.trials()]
    tpe_pruned = optuna_hits(catalog, accuracy, targets, budget, PRUNED)
    tpe_full = optuna_hits(catalog, accuracy, targets, 72, FULL)

    report = {"task": {k: SPEC[k] for k in ("axes", "trial")}, "tolerance": TOLERANCE, "train_seconds": elapsed,
              "workers": args.workers, "mean_trial_seconds": statistics.mean(s for _, s in outcomes), "cells": {}}
    for cell in cells:
        mine = {k: v for k, v in accuracy.items() if k[0] == cell}
        kept = [accuracy[k] for k in pruned_keys if k[0] == cell]
        report["cells"][cell] = {
            "best": {"accuracy": accuracy[best[cell]], "clip_bound": best[cell][1], "batch_size": best[cell][2],
                     "lr_multiplier": best[cell][3]},
            "target": targets[cell],
            "full_grid": {"trials": len(mine), "expected_random_first_hit": expected_first_hit(list(mine.values()),
                                                                                               targets[cell])},
            "pruned_grid": {"trials": len(kept), "best": max(kept), "reaches_target": max(kept) >= targets[cell],
                            "searched_batch_sizes": next(c for c in pruned if c.cell.key == cell).searched_batch_sizes,
                            "expected_random_first_hit": expected_first_hit(kept, targets[cell])},
            "optuna_pruned": {"per_seed": tpe_pruned[cell], "median": statistics.median(tpe_pruned[cell]),
                              "worst": max(tpe_pruned[cell])},
            "optuna_full": {"per_seed": tpe_full[cell], "median": statistics.median(tpe_full[cell]),
                            "worst": max(tpe_full[cell])},
            "gp_pruned": gp_summary([to_target(*run[cell], targets[cell]) for run in gp_runs]),
            "grid_seconds": {"pruned": sum(seconds[k] for k in pruned_keys if k[0] == cell),
                             "full": sum(s for k, s in seconds.items() if k[0] == cell)},
        }
    report["accuracy"] = [{"cell": k[0], "clip_bound": k[1], "batch_size": k[2], "lr_multiplier": k[3],
                           "accuracy": v} for k, v in sorted(accuracy.items())]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))

    print(f"trained {len(trials)} configurations in {elapsed:.0f} s ({report['mean_trial_seconds']:.1f} s per "
          f"trial, {args.workers} processes); load average {os.getloadavg()[0]:.1f}")
    totals = {"full": 0, "pruned": 0, "tpe_pruned": 0.0, "tpe_full": 0.0}
    for cell, r in report["cells"].items():
        b, p, n = r["best"], r["pruned_grid"], r["full_grid"]["trials"]
        print(f"\n{cell}: best {b['accuracy']:.4f} (C={b['clip_bound']:g}, B={b['batch_size']}, "
              f"η×{b['lr_multiplier']:g}); target {r['target']:.4f}")
        first_hit = r["full_grid"]["expected_random_first_hit"]
        print(f"  full grid: {n} trials; random order hits the target after {first_hit:.1f}")
        print(f"  pruned grid: {p['trials']} trials ({p['trials'] / n:.0%}), B {p['searched_batch_sizes']}; best "
              f"{p['best']:.4f}, {'reaches' if p['reaches_target'] else 'MISSES'} the target; random order hits it "
              f"after {p['expected_random_first_hit']:.1f}")
        for name in ("optuna_pruned", "optuna_full"):
            print(f"  {name}: first hit after {r[name]['per_seed']} trials (median {r[name]['median']}, "
                  f"worst {r[name]['worst']})")
        g, s = r["gp_pruned"], r["grid_seconds"]
        print(f"  gp_pruned: first hit after {g['per_seed']} trials (median {g['median']}, worst {g['worst']}); "
              f"training seconds to it {[round(x, 1) for x in g['seconds']]} (median {g['median_seconds']:.1f}); "
              f"the pruned grid's training seconds {s['pruned']:.1f}, the full grid's {s['full']:.1f}")
        totals["full"] += n
        totals["pruned"] += p["trials"]
        totals["tpe_pruned"] += r["optuna_pruned"]["median"]
        totals["tpe_full"] += r["optuna_full"]["median"]
    f = totals["full"]
    print(f"\ntotal: full grid {f}; pruned grid {totals['pruned']} ({totals['pruned'] / f:.0%}); Optuna on the pruned "
          f"space, sum of per-cell medians {totals['tpe_pruned']:g} ({totals['tpe_pruned'] / f:.0%}); Optuna on the "
          f"full space {totals['tpe_full']:g} ({totals['tpe_full'] / f:.0%})")
    print(f"raw results: {args.out}")


if __name__ == "__main__":
    main()
