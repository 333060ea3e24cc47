"""Time to an answer: dptune sweeps against a hand-written Ray Tune + Opacus grid on the same cells.

The cells: a dataset (``--dataset``: digits, N = 1,437 training images, or mnist5k, N = 4,000), dptune's
small tanh CNN, DP-SGD, ε ∈ ``--epsilons``, δ = 1e-5, ``--epochs`` epochs; the grid C × B × η with
η = η_ref·√(B/128)·m (by default the embedded default sweep's: C ∈ {0.1, 1, 10}, B ∈ {32, …, 512},
m ∈ {0.5, 1}; seed 0).

- **baseline**: what a user writes without dptune — a Ray Tune function trainable that trains the
  same model on the same split with Opacus 1.6 (``PrivacyEngine.make_private_with_epsilon``,
  Poisson sampling, hooks mode, σ from Opacus's PRV accountant in every trial) and reports test
  accuracy each epoch; ``tune.grid_search`` over every (ε, C, B, m).
- **dptune** runs (``dptune sweep`` of the same cells and grid), one per lever:
  ``dptune``: the **plain spec**, naming no lever (so it gets those dptune turns on by default where they
  are safe: multi-fidelity in steps, proxies ``auto`` with one seed, transfer across ε; see
  ``search_spaces/levers.py``), with the default pruning (σ√T plateau, minimum steps, two kept B spread
  across the plateau); ``dptune-nolevers``: the same with every lever named off (the plain spec before
  issue 33); every other run names all three levers, on or off:
  ``dptune-asha``: with ASHA early stopping (``search.scheduler: asha``, within a B, the first rung
  after 20 optimizer steps, as the embedded default); ``dptune-asha-epochs``: rungs at epoch ends;
  ``dptune-proxy``: proxy runs (``search.proxy``: every configuration at B/k and σ/k for the cell's T,
  then each cell's choice once at full scale); ``dptune-proxy-asha``: both;
  ``…-all-B``: the same over every B on the plateau; ``…-transfer``: with transfer across the ε cells
  (``search.transfer``: the largest ε first, each smaller ε only within one grid step of the previous
  cell's best);
  ``dptune-nopack``: the plain spec with packed trials named off (``search.pack: off``), the reference
  of packed trials (issue 36);
  ``dptune-gp`` / ``dptune-tpe``: Optuna's GP or TPE sampler (``search.algorithm``) with
  ``--search-budget`` configurations per cell, C and η continuous between the grid's ends for GP,
  multi-fidelity, proxies and transfer off; for each, and for ``dptune-nolevers`` (the full grid with
  the same trainer), the trials and seconds until its best so far is within 1 point of the
  ``dptune-nolevers`` grid's best at each ε (issue 48);
  ``dptune@DIR`` (with ``--compare-with DIR``): the ``dptune`` run from another checkout (e.g. the
  code before a change), for the change's own row.

All run on local Ray with 2 concurrent one-CPU trials, one torch thread each, each dptune run with its
own empty accountant cache (σ computed afresh, as the baseline's are). Reported: wall seconds from
launch to the sweep's end (calibration, Ray start-up and pruning included), trials, per-sample
gradients computed, each cell's best accuracy, the speed-up over the baseline and the gap between
the best accuracies. Each run's best trial is one draw of its configuration (and the grid's best draw is
biased upward: the best of many noisy draws); so the **main figure** retrains every run's chosen
configuration under ``--reevaluate`` new seeds (≥ 3) with one trainer, dptune's, and compares the
seed-means, with their standard errors, against the grid's best configuration's seed-mean.

    python benchmarks/bench_end_to_end.py [--only baseline dptune …] [--dataset digits] [--epsilons 1]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DELTA, SEED = 1e-5, 0
ETA_REF, B_REF = 2.0, 128
RUNS = ["baseline", "dptune", "dptune-nopack", "dptune-nolevers", "dptune-asha", "dptune-asha-epochs", "dptune-proxy",
        "dptune-proxy-asha", "dptune-all-B", "dptune-asha-all-B", "dptune-proxy-all-B", "dptune-transfer",
        "dptune-asha-transfer", "dptune-proxy-asha-transfer", "dptune-gp", "dptune-tpe"]
#: The scheduler of the runs named ``…asha…``: rungs in optimizer steps (the embedded default's), or at
#: epoch ends for ``…asha-epochs…``.
ASHA = {"steps": "{name: asha, grace_steps: 20, reduction_factor: 3}",
        "epochs": "{name: asha, grace_epochs: 1, reduction_factor: 3}"}
#: Training-set sizes of the datasets (what the baseline's T·B is counted with).
TRAIN_SIZE = {"digits": 1437, "mnist5k": 4000}


def baseline_trainable(config: dict) -> None:
    """One configuration, as a user would write it with Opacus (reports test accuracy per epoch)."""
    import warnings

    import torch
    from opacus import PrivacyEngine
    from ray import tune
    from torch.utils.data import DataLoader

    from dptune.trainables.data.catalog import load_dataset
    from dptune.trainables.models.catalog import create_model

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    data = load_dataset(config["dataset"])
    model = create_model("cnn", num_classes=data.num_classes, input_shape=data.input_shape)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["learning_rate"])
    loader = DataLoader(data.train, batch_size=config["batch_size"], shuffle=True)
    engine = PrivacyEngine(accountant="prv")
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model, optimizer=optimizer, data_loader=loader, target_epsilon=config["epsilon"], target_delta=DELTA,
        epochs=config["epochs"], max_grad_norm=config["clip_bound"], poisson_sampling=True)
    test_x, test_y = (torch.stack([x for x, _ in data.test]), torch.tensor([int(y) for _, y in data.test]))
    for epoch in range(1, config["epochs"] + 1):
        model.train()
        for x, y in loader:
            if len(y) == 0:
                continue
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = float((model(test_x).argmax(1) == test_y).float().mean())
        tune.report({"accuracy": accuracy, "epoch": epoch})


def run_baseline(args: argparse.Namespace, storage: str) -> dict:
    import ray
    from ray import tune

    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR",
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        space = {"epsilon": tune.grid_search(args.epsilons), "clip_bound": tune.grid_search(args.clips),
                 "batch_size": tune.grid_search(args.batch_sizes), "multiplier": tune.grid_search(args.multipliers),
                 "epochs": args.epochs, "dataset": args.dataset,
                 "learning_rate": tune.sample_from(
                     lambda spec: ETA_REF * math.sqrt(spec.config.batch_size / B_REF) * spec.config.multiplier)}
        tuner = tune.Tuner(tune.with_resources(baseline_trainable, {"cpu": 1}), param_space=space,
                           tune_config=tune.TuneConfig(metric="accuracy", mode="max", max_concurrent_trials=2),
                           run_config=tune.RunConfig(storage_path=storage, name="baseline", verbose=0))
        results = tuner.fit()
    finally:
        ray.shutdown()
    wall = time.perf_counter() - start
    best: dict[float, dict] = {}
    for r in results:
        eps = float(r.config["epsilon"])
        if r.metrics.get("accuracy") is not None and (eps not in best or r.metrics["accuracy"] > best[eps]["accuracy"]):
            best[eps] = {"accuracy": r.metrics["accuracy"],
                         "config": {k: r.config[k] for k in ("clip_bound", "batch_size", "learning_rate")}}
    n = TRAIN_SIZE[args.dataset]
    return {"wall_s": wall, "trials": len(results),
            "examples": sum(math.ceil(args.epochs * n / r.config["batch_size"]) * r.config["batch_size"] for r in results),
            "best": best}


def spec_text(args: argparse.Namespace, *, scheduler: str | None, capped: bool, proxy: int | str,
              transfer: bool = False, plain: bool = False, pack: bool = True, algorithm: str = "grid",
              budget: int = 12) -> str:
    """The cells as a dptune sweep spec (the embedded default's pruning); ``capped=False`` searches
    every B on the σ√T plateau, not only two of them; ``proxy`` k > 1 (or ``auto``: k per B) ranks at B/k and σ/k, then
    trains each cell's choice at full scale; ``transfer`` searches each smaller ε near the previous best. Every lever
    is named, on or off, unless ``plain``: then none is (dptune decides) but packed trials when ``pack`` is
    false. ``algorithm`` gp or tpe: that sampler, ``budget`` configurations per cell."""
    search = (f"search: {{algorithm: {algorithm}" + (f", budget: {budget}, seed: 0" if algorithm != "grid" else "")
              + f", scheduler: {ASHA[scheduler] if scheduler else 'none'}"
              + (f", proxy: {{batch_divisor: {proxy}}}" if proxy != 1 else ", proxy: off")
              + (", transfer: {radius: 1}" if transfer else ", transfer: off") + "}")
    if plain:
        search = "search: {algorithm: grid}" if pack else "search: {algorithm: grid, pack: off}"
    return f"""experiment: e2e
axes: {{epsilon: {args.epsilons}, delta: {DELTA}, backbone: [cnn], dataset: [{args.dataset}], epochs: [{args.epochs}]}}
clip_bound: {args.clips}
batch_size: {args.batch_sizes}
learning_rate: {{reference: {ETA_REF}, reference_batch_size: {B_REF}, multipliers: {args.multipliers}}}
pruning: {{min_steps: 20, plateau_tol: 0.1{", max_batch_sizes: 2" if capped else ""}}}
{search}
seeds: [{SEED}]
trial: {{optimizer: sgd}}
resources: {{cpu: 1, gpu: 0}}
"""


def run_dptune(args: argparse.Namespace, name: str, storage: str) -> dict:
    base, _, checkout = name.partition("@")
    spec = Path(storage) / "spec.yaml"
    scheduler = ("epochs" if "asha-epochs" in base else "steps") if "asha" in base else None
    spec.write_text(spec_text(args, scheduler=scheduler, capped=not base.endswith("all-B"),
                              proxy=args.proxy_divisor if "proxy" in base else 1, transfer=base.endswith("transfer"),
                              plain=base in ("dptune", "dptune-nopack"), pack=base != "dptune-nopack",
                              algorithm=base.removeprefix("dptune-") if base in ("dptune-gp", "dptune-tpe") else "grid",
                              budget=args.search_budget))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DPTUNE_CACHE_DIR": str(Path(storage) / "cache")}
    if checkout:
        env["PYTHONPATH"] = checkout
    start, launched = time.perf_counter(), time.time()
    proc = subprocess.run([sys.executable, "-m", "dptune", "sweep", str(spec), "--storage", storage, "--quiet"],
                          cwd=storage, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"dptune sweep failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    query = subprocess.run([sys.executable, "-m", "dptune", "query", "--format", "json", "--store",
                            str(Path(storage) / "e2e"),
                            "SELECT * FROM trials"], capture_output=True, text=True, env=env)
    rows = json.loads(query.stdout)
    best: dict[float, dict] = {}
    for r in rows:   # a proxy search's answer is its finished (final) run; proxies only rank
        if r["status"] == "finished" and (r["epsilon"] not in best or r["accuracy"] > best[r["epsilon"]]["accuracy"]):
            best[r["epsilon"]] = {"accuracy": r["accuracy"],
                                  "config": {k: r[k] for k in ("clip_bound", "batch_size", "learning_rate")}}
    ended = sorted((r for r in rows if r["status"] != "equivalent"), key=lambda r: r["written_at"])
    return {"wall_s": wall, "trials": len(rows),
            "examples": sum((r.get("step") or 0) * r["batch_size"] for r in rows if r["status"] != "equivalent"),
            "best": best, "order": [(r["written_at"] - launched, r["epsilon"], r["accuracy"] if r["status"] == "finished"
                                     else None) for r in ended]}


def to_regret(order: list, epsilon: float, target: float) -> tuple[int, float] | None:
    """(trials of the cell ended, seconds since launch) when a finished trial of the cell at ``epsilon``
    first reached ``target``, or None."""
    mine = [(t, a) for t, e, a in order if e == epsilon]
    for k, (seconds, accuracy) in enumerate(mine, 1):
        if accuracy is not None and accuracy >= target:
            return k, seconds
    return None


def reevaluate(args: argparse.Namespace, epsilon: float, config: dict) -> list[float]:
    """Final test accuracy of one chosen (C, B, η) retrained by dptune's trainer under seeds 1..``seeds``
    (new model inits, batches and noise; the sweep's train/test split): the quality of an answer,
    freed from the one lucky or unlucky draw each run's best trial is."""
    import torch

    from dptune.trainables.config import TrainConfig
    from dptune.trainables.training import Trainer

    torch.set_num_threads(1)
    accuracies = []
    for seed in range(1, args.reevaluate + 1):
        trainer = Trainer(TrainConfig(dataset=args.dataset, model="cnn", epsilon=epsilon, delta=DELTA,
                                      epochs=args.epochs, optimizer="sgd", clip_bound=float(config["clip_bound"]),
                                      batch_size=int(config["batch_size"]),
                                      learning_rate=float(config["learning_rate"]), seed=seed,
                                      split_seed=SEED).validate())
        accuracies.append(trainer.fit()[-1]["test_accuracy"])
    return accuracies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", help=f"runs, of {', '.join(RUNS)} and dptune@DIR [all]")
    parser.add_argument("--dataset", choices=sorted(TRAIN_SIZE), default="digits")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--clips", type=float, nargs="+", default=[0.1, 1, 10])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    parser.add_argument("--multipliers", type=float, nargs="+", default=[0.5, 1])
    parser.add_argument("--proxy-divisor", type=lambda v: v if v == "auto" else int(v), default=3,
                        help="k of the proxy runs, or auto (per B the largest power of two that keeps σ/k >= 0.5 "
                             "and B/k >= 16) [%(default)s: the largest that keeps σ/k >= 0.5 at B = 32, ε = 1]")
    parser.add_argument("--search-budget", type=int, default=12,
                        help="configurations per cell of dptune-gp and dptune-tpe [%(default)s]")
    parser.add_argument("--compare-with", metavar="DIR", help="also run `dptune` from this checkout (dptune@DIR)")
    parser.add_argument("--reevaluate", type=int, default=5, metavar="SEEDS",
                        help="retrain each run's chosen configuration under this many seeds, the main figure "
                             "[%(default)s; at least 3; 0: skip]")
    args = parser.parse_args()
    if 0 < args.reevaluate < 3:
        parser.error("--reevaluate: at least 3 seeds (a mean and its standard error), or 0 to skip")
    runs = args.only or RUNS + ([f"dptune@{args.compare_with}"] if args.compare_with else [])
    results = {}
    for name in runs:
        with tempfile.TemporaryDirectory(prefix="e2e-") as storage:
            try:
                results[name] = run_baseline(args, storage) if name == "baseline" else run_dptune(args, name, storage)
            except Exception as exc:  # e.g. a spec an older checkout refuses: say so, keep the others
                results[name] = {"error": str(exc).strip().splitlines()[-1][:300]}
        print(name, json.dumps(results[name]), flush=True)
    epsilons = [float(e) for e in args.epsilons]
    base = results.get("baseline", {})
    print(f"\n{args.dataset}, cnn, ε ∈ {{{', '.join(f'{e:g}' for e in epsilons)}}}, {args.epochs} epochs")
    print("\n| run | wall s | speed-up vs baseline | trials | per-sample gradients | "
          + " | ".join(f"best at ε={e:g} (gap, points)" for e in epsilons) + " |")
    print("|---|---|---|---|---|" + "---|" * len(epsilons))
    for name, r in results.items():
        if "error" in r:
            print(f"| {name} | fails: {r['error']} |" + " |" * (3 + len(epsilons)))
            continue
        speed = f"{base['wall_s'] / r['wall_s']:.2f}×" if "wall_s" in base else ""
        cells = []
        for e in epsilons:
            mine, theirs = r["best"].get(e), base.get("best", {}).get(e)
            gap = f" ({100 * (mine['accuracy'] - theirs['accuracy']):+.1f})" if mine and theirs else ""
            cells.append(f"{mine['accuracy']:.4f}{gap}" if mine else "—")
        print(f"| {name} | {r['wall_s']:.0f} | {speed} | {r['trials']} | {r['examples']:,} | " + " | ".join(cells) + " |")
    grid = results.get("dptune-nolevers", {}).get("best", {})
    if grid:
        print("\nTo regret ≤ 1 point of the dptune-nolevers grid's best (its single draw per configuration): "
              "trials ended in the cell, seconds since launch")
        for name in ("dptune-nolevers", "dptune-gp", "dptune-tpe"):
            if "order" in results.get(name, {}):
                reached = [to_regret(results[name]["order"], e, grid[e]["accuracy"] - 0.01) if e in grid else None
                           for e in epsilons]
                print(f"| {name} | " + " | ".join("not reached" if r is None else f"{r[0]} trials, {r[1]:.0f} s"
                                                  for r in reached) + " |")
    if not args.reevaluate:
        return
    main_figure(args, results, epsilons)


def main_figure(args: argparse.Namespace, results: dict, epsilons: list[float]) -> None:
    """Each run's answer retrained by one trainer under seeds 1..``--reevaluate``: mean ± standard
    error per ε, and the gap to the grid's best configuration (the baseline's answer) retrained the same way."""
    base = results.get("baseline", {})
    print(f"\nMain figure: each run's answer retrained by dptune's trainer, seeds 1..{args.reevaluate} (mean ± "
          "standard error of test accuracy; gap to the grid's best configuration retrained the same way, points)")
    print("\n| run | wall s | speed-up | " + " | ".join(f"ε={e:g}: answer (C, B, η) → mean ± s.e. (gap)" for e in epsilons)
          + " |")
    print("|---|---|---|" + "---|" * len(epsilons))
    means: dict[tuple, tuple[float, float]] = {}

    def answer(e: float, config: dict) -> tuple[tuple, tuple[float, float]]:
        key = (e, *(round(float(config[k]), 6) for k in ("clip_bound", "batch_size", "learning_rate")))
        if key not in means:
            accuracies = reevaluate(args, e, config)
            error = statistics.stdev(accuracies) / math.sqrt(len(accuracies)) if len(accuracies) > 1 else 0.0
            means[key] = (statistics.mean(accuracies), error)
        return key, means[key]

    for name, r in results.items():
        if "best" not in r:
            continue
        cells = []
        for e in epsilons:
            if e not in r["best"]:
                cells.append("—")
                continue
            key, (mean, error) = answer(e, r["best"][e]["config"])
            gap = ""
            if e in base.get("best", {}):
                _, (base_mean, _) = answer(e, base["best"][e]["config"])
                gap = f" ({100 * (mean - base_mean):+.1f})"
            cells.append(f"C={key[1]:g}, B={key[2]:g}, η={key[3]:.3g} → {mean:.4f} ± {error:.4f}{gap}")
        speed = f"{base['wall_s'] / r['wall_s']:.2f}×" if "wall_s" in base else ""
        print(f"| {name} | {r['wall_s']:.0f} | {speed} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
