"""Time to an answer: a dptune sweep against a hand-written Ray Tune + Opacus grid on one cell.

The cell: digits (N = 1,437 training images, the embedded data), dptune's small tanh CNN, DP-SGD,
ε = 1, δ = 1e-5, 8 epochs; the grid of the embedded default sweep: C ∈ {0.1, 1, 10},
B ∈ {32, 64, 128, 256, 512}, η = 2·√(B/128)·m with m ∈ {0.5, 1} (30 configurations, seed 0).

- **baseline**: what a user writes without dptune — a Ray Tune function trainable that trains the
  same model on the same split with Opacus 1.6 (``PrivacyEngine.make_private_with_epsilon``,
  Poisson sampling, hooks mode) and reports test accuracy each epoch; ``tune.grid_search`` over
  every configuration.
- **dptune**: ``dptune sweep`` of the same cell and grid with the default spec's pruning (σ√T plateau,
  minimum steps, two kept B spread across the plateau), the same with ASHA early stopping
  (``search.scheduler: asha``), and ASHA over every B on the plateau (``dptune-asha-all-B``); proxy runs
  (``search.proxy``: every configuration at B/3 and σ/3, then the choice once at full scale), over the
  two spread B and over every B (``dptune-proxy``, ``dptune-proxy-all-B``).

Both run on local Ray with 2 concurrent one-CPU trials, one torch thread each. Reported: wall
seconds from launch to the sweep's end (calibration, Ray start-up and pruning included), trials
(and trial-epochs) run, the best accuracy, and the speed-up of dptune over the baseline with the
gap between the two best accuracies (goal: ≥ 5× faster, within 1 point). Each run's best trial is one
draw of its configuration; ``--reevaluate`` then retrains every chosen configuration under new seeds
with one trainer, so the answers are compared rather than the draws.

    python benchmarks/bench_end_to_end.py [--only baseline dptune dptune-asha dptune-asha-all-B] [--epochs 8]
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

EPSILON, DELTA, SEED = 1.0, 1e-5, 0
CLIPS, BATCHES, MULTIPLIERS = [0.1, 1, 10], [32, 64, 128, 256, 512], [0.5, 1]
ETA_REF, B_REF = 2.0, 128
#: dptune runs: the default spec's pruning (two plateau B: its ends), with ASHA, every B on the plateau,
#: and every B with ASHA.
RUNS = ["baseline", "dptune", "dptune-asha", "dptune-all-B", "dptune-asha-all-B", "dptune-proxy", "dptune-proxy-all-B"]
#: The divisor of the proxy runs (``search.proxy.batch_divisor``) of the runs named ``…proxy…``.
PROXY_DIVISOR = 3   # the largest that keeps σ' ≥ MIN_PROXY_SIGMA at B = 32 in this cell (4 is refused)


def baseline_trainable(config: dict) -> None:
    """One configuration, as a user would write it with Opacus (reports test accuracy per epoch)."""
    import warnings

    import torch
    from opacus import PrivacyEngine
    from ray import tune
    from torch.utils.data import DataLoader

    from dptune.trainables.data import load_dataset
    from dptune.trainables.models import create_model

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    data = load_dataset("digits")
    model = create_model("cnn", num_classes=data.num_classes, input_shape=data.input_shape)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["learning_rate"])
    loader = DataLoader(data.train, batch_size=config["batch_size"], shuffle=True)
    engine = PrivacyEngine(accountant="prv")
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model, optimizer=optimizer, data_loader=loader, target_epsilon=EPSILON, target_delta=DELTA,
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


def run_baseline(epochs: int, storage: str) -> dict:
    import ray
    from ray import tune

    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR",
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        space = {"clip_bound": tune.grid_search(CLIPS), "batch_size": tune.grid_search(BATCHES),
                 "multiplier": tune.grid_search(MULTIPLIERS), "epochs": epochs,
                 "learning_rate": tune.sample_from(
                     lambda spec: ETA_REF * math.sqrt(spec.config.batch_size / B_REF) * spec.config.multiplier)}
        tuner = tune.Tuner(tune.with_resources(baseline_trainable, {"cpu": 1}), param_space=space,
                           tune_config=tune.TuneConfig(metric="accuracy", mode="max", max_concurrent_trials=2),
                           run_config=tune.RunConfig(storage_path=storage, name="baseline", verbose=0))
        results = tuner.fit()
        best = results.get_best_result(metric="accuracy", mode="max", scope="last")
        frame = results.get_dataframe()
    finally:
        ray.shutdown()
    n = 1437   # digits' training images: every trial's T·B ≈ E·N per-sample gradients
    return {"wall_s": time.perf_counter() - start, "trials": len(frame), "trial_epochs": len(frame) * epochs,
            "examples": sum(math.ceil(epochs * n / b) * b for b in frame["config/batch_size"]),
            "best_accuracy": best.metrics["accuracy"], "best_config": {k: best.config[k] for k in
                                                                       ("clip_bound", "batch_size", "learning_rate")}}


def spec_text(epochs: int, scheduler: bool, capped: bool = True, proxy: int = 1) -> str:
    """The cell as a dptune sweep spec (the embedded default's grid and pruning, ε = 1 only);
    ``capped=False`` searches every B on the σ√T plateau, not only two of them; ``proxy`` k > 1 ranks
    at B/k and σ/k, then trains the choice at full scale."""
    search = ("search: {algorithm: grid"
              + (", scheduler: {name: asha, grace_epochs: 1, reduction_factor: 3}" if scheduler else "")
              + (f", proxy: {{batch_divisor: {proxy}}}" if proxy > 1 else "") + "}")
    return f"""experiment: e2e
axes: {{epsilon: [{EPSILON}], delta: {DELTA}, backbone: [cnn], dataset: [digits], epochs: [{epochs}]}}
clip_bound: {CLIPS}
batch_size: {BATCHES}
learning_rate: {{reference: {ETA_REF}, reference_batch_size: {B_REF}, multipliers: {MULTIPLIERS}}}
pruning: {{min_steps: 20, plateau_tol: 0.1{", max_batch_sizes: 2" if capped else ""}}}
{search}
seeds: [{SEED}]
trial: {{optimizer: sgd}}
resources: {{cpu: 1, gpu: 0}}
"""


def run_dptune(epochs: int, storage: str, scheduler: bool, capped: bool = True, proxy: int = 1) -> dict:
    spec = Path(storage) / "spec.yaml"
    spec.write_text(spec_text(epochs, scheduler, capped, proxy))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DPTUNE_CACHE_DIR": str(Path(storage) / "cache")}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dptune", "sweep", str(spec), "--storage", storage, "--quiet"],
                          cwd=storage, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"dptune sweep failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    query = subprocess.run([sys.executable, "-m", "dptune", "query", "--format", "json", "--store",
                            str(Path(storage) / "e2e"),
                            "SELECT status, accuracy, clip_bound, batch_size, learning_rate, epoch, step FROM trials"],
                           capture_output=True, text=True, env=env)
    rows = json.loads(query.stdout)
    finished = [r for r in rows if r["status"] == "finished"]   # a proxy search's answer; proxies only rank
    best = max(finished, key=lambda r: r["accuracy"])
    return {"wall_s": wall, "trials": len(rows),
            "trial_epochs": sum(r["epoch"] or 0 for r in rows),
            "examples": sum((r["step"] or 0) * r["batch_size"] for r in rows if r["status"] != "equivalent"),
            "stopped": sum(r["status"] == "stopped" for r in rows), "best_accuracy": best["accuracy"],
            "best_config": {k: best[k] for k in ("clip_bound", "batch_size", "learning_rate")}}


def reevaluate(config: dict, epochs: int, seeds: int) -> list[float]:
    """Final test accuracy of one chosen (C, B, η) retrained by dptune's trainer under seeds 1..``seeds``
    (new model inits, batches and noise; the sweep's train/test split): the quality of an answer,
    freed from the one lucky or unlucky draw each run's best trial is."""
    import torch

    from dptune.trainables.config import TrainConfig
    from dptune.trainables.training import Trainer

    torch.set_num_threads(1)
    accuracies = []
    for seed in range(1, seeds + 1):
        trainer = Trainer(TrainConfig(dataset="digits", model="cnn", epsilon=EPSILON, delta=DELTA, epochs=epochs,
                                      optimizer="sgd", clip_bound=float(config["clip_bound"]),
                                      batch_size=int(config["batch_size"]),
                                      learning_rate=float(config["learning_rate"]), seed=seed,
                                      split_seed=SEED).validate())
        while not trainer.done:
            metrics = trainer.run_epoch()
        accuracies.append(metrics["test_accuracy"])
    return accuracies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=RUNS, nargs="+")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--reevaluate", type=int, default=5, metavar="SEEDS",
                        help="retrain each run's chosen configuration under this many seeds [%(default)s; 0: skip]")
    args = parser.parse_args()
    runs = args.only or RUNS
    results = {}
    for name in runs:
        with tempfile.TemporaryDirectory(prefix=f"e2e-{name}-") as storage:
            try:
                results[name] = (run_baseline(args.epochs, storage) if name == "baseline"
                                 else run_dptune(args.epochs, storage, scheduler="asha" in name,
                                                 capped=not name.endswith("all-B"),
                                                 proxy=PROXY_DIVISOR if "proxy" in name else 1))
            except Exception as exc:  # e.g. a spec without schedulers: say so, keep the others
                results[name] = {"error": str(exc).splitlines()[-1][:300]}
        print(name, json.dumps(results[name]), flush=True)
    print("\n| run | wall s | trials | trial-epochs | examples (per-sample gradients) | best accuracy | speed-up vs baseline "
          "| gap (points) |")
    print("|---|---|---|---|---|---|---|---|")
    base = results.get("baseline", {})
    for name, r in results.items():
        if "error" in r:
            print(f"| {name} | fails: {r['error']} | | | | | | |")
            continue
        speed = f"{base['wall_s'] / r['wall_s']:.2f}×" if "wall_s" in base else ""
        gap = f"{100 * (base['best_accuracy'] - r['best_accuracy']):+.1f}" if "best_accuracy" in base else ""
        print(f"| {name} | {r['wall_s']:.0f} | {r['trials']} | {r['trial_epochs']} | {r['examples']:,} | {r['best_accuracy']:.4f} "
              f"| {speed} | {gap} |")
    if not args.reevaluate:
        return
    print(f"\nEach run's answer retrained by dptune's trainer, seeds 1..{args.reevaluate} (mean ± sd of test accuracy):")
    print("\n| run | chosen (C, B, η) | mean accuracy | sd | gap to baseline's answer (points) |")
    print("|---|---|---|---|---|")
    means: dict[tuple, tuple[float, float]] = {}
    for name, r in results.items():
        if "best_config" not in r:
            continue
        key = tuple(round(float(r["best_config"][k]), 6) for k in ("clip_bound", "batch_size", "learning_rate"))
        if key not in means:
            accuracies = reevaluate(r["best_config"], args.epochs, args.reevaluate)
            means[key] = (statistics.mean(accuracies), statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0)
        mean, sd = means[key]
        base_key = (tuple(round(float(base["best_config"][k]), 6) for k in ("clip_bound", "batch_size", "learning_rate"))
                    if "best_config" in base else None)
        gap = f"{100 * (means[base_key][0] - mean):+.1f}" if base_key in means else ""
        print(f"| {name} | C={key[0]:g}, B={key[1]:g}, η={key[2]:.3g} | {mean:.4f} | {sd:.4f} | {gap} |")


if __name__ == "__main__":
    main()
