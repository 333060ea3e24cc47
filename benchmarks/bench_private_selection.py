"""Private selection (issue 13; "Hyperparameter Tuning with Renyi Differential Privacy", Papernot &
Steinke, ICLR 2022) on the embedded digits task: does tuning pay once its privacy is paid for?

For each total ε (the budget of the released model, tuning included), three test accuracies:

- **private selection**: dptune's plan for ``selection.mode: private`` (K drawn from the law, K
  random draws from the pruned (C, B, η) space, σ per B solved so the repeat-and-select total meets
  ε); each trial releases its noisy validation score; the best noisy score's model is tested once.
  Averaged over ``--repeats`` selections (search seeds 0..R-1: new K, new draws).
- **(a) best non-private selection at the same per-trial ε**: every configuration of the same pruned
  space trained with the same per-trial σ, the best *raw* validation accuracy picked (optimistic:
  not a valid release, its ε does not cover the selection).
- **(b) one untuned default** (C = 1, B = 128, η = η_ref) at the full total ε (σ from the PRV
  accountant), on the same training part; mean over ``--repeats`` training seeds.

Tuning pays when private selection beats (b). The trials run in-process with dptune's Trainer (the
same trainer and the same noisy-score code a sweep runs on Ray; the platform path is covered by
tests/platform/test_private_selection_sweep.py).

Run (accuracy figures, not timings; a few minutes on 2 cores):
    python benchmarks/bench_private_selection.py                 # ε ∈ {1, 3, 8}, cnn, 8 epochs, mean K 10
    python benchmarks/bench_private_selection.py --tiny          # smoke run
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from dptune.platform.sweep.catalog import trainables_catalog
from dptune.platform.sweep.trial_config import train_config
from dptune.search_spaces import load_spec, plan_sweep
from dptune.trainables.config import TrainConfig
from dptune.trainables.training import Trainer, evaluate, train


def spec(args: argparse.Namespace, seed: int) -> dict:
    return {"axes": {"epsilon": args.epsilon, "delta": 1e-5, "backbone": [args.backbone], "dataset": ["digits"],
                     "epochs": [args.epochs]},
            "clip_bound": args.clip, "batch_size": args.batch,
            "learning_rate": {"reference": args.lr, "reference_batch_size": 128, "multipliers": args.multipliers},
            "pruning": {"min_steps": 20, "plateau_tol": 0.1, "max_batch_sizes": args.max_batch_sizes},
            "search": {"algorithm": "random", "seed": seed},
            "selection": {"mode": "private", "distribution": args.distribution, "mean_trials": args.mean_trials,
                          "score_noise": args.score_noise, "validation_fraction": args.validation_fraction},
            "trial": {"optimizer": "sgd", "device": "cpu"}}


def private_selection(cell) -> dict:
    """Run a cell's K draws; the best noisy validation score's model is tested once."""
    best, best_key = None, None
    for k in range(len(cell.draws)):
        trainer = Trainer(train_config(cell.draw_config(k)))
        metrics = {}
        while not trainer.done:
            metrics = trainer.run_epoch()
        key = (metrics["selection_score"], -k)
        if best_key is None or key > best_key:
            best, best_key = trainer, key
    if best is None:   # K = 0 (Poisson): nothing released
        return {"k": 0, "test_accuracy": None}
    test = evaluate(best.model, best.data.test, best.data.num_classes, best.device)["accuracy"]
    cfg = best.cfg
    return {"k": len(cell.draws), "test_accuracy": test, "selected": {"C": cfg.clip_bound, "B": cfg.batch_size,
                                                                      "lr": cfg.learning_rate},
            "noisy_score": best_key[0]}


def nonprivate_selection(cell, seed: int) -> dict:
    """Every configuration of the pruned space at the per-trial σ; best raw validation accuracy."""
    runs = []
    for c, b, m in cell.grid:
        train_cfg = dict(cell.trial_config(c, b, m, seed), split_seed=seed)
        last = train(train_config(train_cfg), progress=False)[-1]
        runs.append((last["validation_accuracy"], last["test_accuracy"], (c, b, m)))
    val, test, config = max(runs, key=lambda r: r[0])
    return {"configurations": len(runs), "test_accuracy": test, "validation_accuracy": val,
            "selected": {"C": config[0], "B": config[1], "lr": cell.learning_rate(config[1], config[2])},
            "oracle_test_accuracy": max(r[1] for r in runs)}


def default_run(args: argparse.Namespace, epsilon: float, seed: int) -> float:
    """C = 1, B = 128, η = η_ref at the full ε (σ calibrated by the trainer), same training part."""
    cfg = TrainConfig(dataset="digits", model=args.backbone, epsilon=epsilon, delta=1e-5, clip_bound=1.0,
                      batch_size=128, learning_rate=args.lr, epochs=args.epochs, optimizer="sgd", seed=seed,
                      split_seed=0, validation_fraction=args.validation_fraction, device="cpu")
    return train(cfg, progress=False)[-1]["test_accuracy"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 3.0, 8.0])
    p.add_argument("--backbone", default="cnn")
    p.add_argument("--epochs", type=float, default=8)
    p.add_argument("--clip", type=float, nargs="+", default=[0.1, 1, 10])
    p.add_argument("--batch", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    p.add_argument("--lr", type=float, default=2.0)
    p.add_argument("--multipliers", type=float, nargs="+", default=[0.5, 1])
    p.add_argument("--max-batch-sizes", type=int, default=2)
    p.add_argument("--distribution", default="truncated_negative_binomial")
    p.add_argument("--mean-trials", type=float, default=10)
    p.add_argument("--score-noise", type=float, default=0.05)
    p.add_argument("--validation-fraction", type=float, default=0.15)
    p.add_argument("--repeats", type=int, default=3, help="private selections (search seeds) and default seeds")
    p.add_argument("--out", default="benchmarks/results/private_selection.json")
    p.add_argument("--tiny", action="store_true", help="smoke run: mlp, 1 epoch, 2 ε, mean K 2, 1 repeat")
    args = p.parse_args()
    if args.tiny:
        args.epsilon, args.backbone, args.epochs, args.mean_trials, args.repeats = [3.0, 8.0], "mlp", 2, 2, 1
        args.clip, args.multipliers, args.max_batch_sizes = [1, 10], [1], 1
    catalog = trainables_catalog()
    start = time.perf_counter()
    plans = [plan_sweep(load_spec(spec(args, seed), catalog), catalog, workers=1) for seed in range(args.repeats)]
    results = []
    for i, epsilon in enumerate(args.epsilon):
        cells = [plan.cells[i] for plan in plans]
        figures = {b: (p.trial_epsilon, p.total_epsilon) for b, p in cells[0].privacy.items()
                   if b in cells[0].searched_batch_sizes}
        private = [private_selection(cell) for cell in cells]
        released = [r["test_accuracy"] for r in private if r["test_accuracy"] is not None]
        a = nonprivate_selection(cells[0], seed=0)
        b = [default_run(args, epsilon, seed) for seed in range(args.repeats)]
        row = {"total_epsilon": epsilon, "k": [r["k"] for r in private],
               "per_trial_epsilon": {str(bs): round(t, 3) for bs, (t, _) in figures.items()},
               "sigma_per_trial": {str(r["batch_size"]): round(r["noise_multiplier"], 4) for r in cells[0].rows
                                   if r["searched"]},
               "private_selection": statistics.mean(released) if released else None, "private_runs": private,
               "nonprivate_selection_same_per_trial_eps": a["test_accuracy"], "nonprivate_detail": a,
               "default_full_eps": statistics.mean(b), "default_runs": b}
        results.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("private_runs", "nonprivate_detail")}), flush=True)
    elapsed = time.perf_counter() - start
    print(f"\n{args.backbone} on digits, {args.epochs:g} epochs; K ~ {args.distribution}(mean {args.mean_trials:g}); "
          f"score noise {args.score_noise:g}; validation fraction {args.validation_fraction:g}; {elapsed:.0f} s\n")
    print("| total ε | K drawn | per-trial ε (by B) | private selection | (a) non-private selection, same per-trial ε "
          "| (b) untuned default, full ε |")
    print("|---|---|---|---|---|---|")
    for r in results:
        per_trial = ", ".join(f"B={b}: {e:g}" for b, e in r["per_trial_epsilon"].items())
        acc = "—" if r["private_selection"] is None else f"{r['private_selection']:.3f}"
        print(f"| {r['total_epsilon']:g} | {', '.join(map(str, r['k']))} | {per_trial} | {acc} | "
              f"{r['nonprivate_selection_same_per_trial_eps']:.3f} | {r['default_full_eps']:.3f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results, "elapsed_s": elapsed}, indent=1))
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
