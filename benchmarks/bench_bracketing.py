"""Benchmark: bracketing against a wide grid (issue 48), on a cell whose initial grid misses the
optimum on one axis at a time.

Task: digits (N = 1,437), the mlp (64 tanh units), DP-SGD, ε = 2, δ = 1e-5, 3 epochs, seeds 0, 1, 2,
reproducible randomness. **Wide grid** (the reference): C ∈ 0.1·3^k (k = −2…4), B ∈ {16, …, 512},
η = 2·√(B/128)·m with m ∈ 2^j (j = −4…2): 7 × 6 × 7 = 294 configurations × 3 seeds, trained with
dptune's trainer in worker processes; its best seed-mean is the answer. **Cases**: a `dptune sweep`
(bracketing on, at most two extensions per axis; multi-fidelity, proxies, packs and racing off, so
that bracketing alone differs from the grid) of a narrow grid that misses the wide optimum (C*, B*, m*)
on one axis by two steps — η too small (m ∈ {m*/8, m*/4}), C too large (C ∈ {9C*, 27C*}), B too
large (B ∈ {4B*, 8B*}) — and holds the other two axes' optimum with a neighbour either side.

Reported per case: where the sweep ended, its optimum's seed-mean in its own store and in the wide
table (the same trials: reproducible), the regret against the wide optimum, and the compute as trials
(each trains 3 epochs of N examples in expectation, whatever its B) against the wide grid's. Goal:
regret ≤ 1 point at ≤ 1/3 of the wide grid's compute.

    python benchmarks/bench_bracketing.py [--workers 2] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench_search_efficiency import train_one

EPSILON, DELTA, EPOCHS, SEEDS = 2.0, 1e-5, 3, [0, 1, 2]
ETA_REF, B_REF = 2.0, 128
CLIPS = [round(0.1 * 3 ** k, 10) for k in range(-2, 5)]
BATCHES = [16, 32, 64, 128, 256, 512]
MULTIPLIERS = [2.0 ** j for j in range(-4, 3)]
TRIAL = {"optimizer": "sgd", "model_options": {"hidden": 64, "depth": 1}}
SEARCH = {"algorithm": "grid", "scheduler": "none", "proxy": "off", "transfer": "off", "pack": "off",
          "racing": "off", "bracket": {"max_extensions": 2}}


def spec(clips: list, batches: list, multipliers: list, search: dict) -> dict:
    return {"experiment": "bracketing",
            "axes": {"epsilon": [EPSILON], "delta": DELTA, "backbone": ["mlp"], "dataset": ["digits"],
                     "epochs": [EPOCHS]},
            "clip_bound": clips, "batch_size": batches,
            "learning_rate": {"reference": ETA_REF, "reference_batch_size": B_REF, "multipliers": multipliers},
            "pruning": {"min_steps": 1, "plateau_tol": 1e9}, "seeds": SEEDS, "trial": TRIAL, "search": search}


def key(c: float, b: int, lr: float) -> tuple[float, int, float]:
    """A configuration, with C and η to six significant digits (bracketing computes its values)."""
    return float(f"{c:.6g}"), int(b), float(f"{lr:.6g}")


def wide_grid(workers: int) -> tuple[dict, float, int]:
    """{configuration: [accuracy per seed]}, training seconds summed, trials."""
    from dptune.platform.sweep import spec_sections  # noqa: F401  (registers the platform's spec sections)
    from dptune.platform.sweep.catalog import trainables_catalog
    from dptune.search_spaces import load_spec, plan_sweep

    catalog = trainables_catalog()
    trials = plan_sweep(load_spec(spec(CLIPS, BATCHES, MULTIPLIERS, {**SEARCH, "bracket": "off"}), catalog),
                        catalog).trials()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        outcomes = list(pool.map(train_one, trials, chunksize=4))
    table: dict = defaultdict(dict)
    for t, (acc, _) in zip(trials, outcomes):
        table[key(t["clip_bound"], t["batch_size"], t["learning_rate"])][int(t["seed"])] = acc
    return ({k: [v[s] for s in SEEDS] for k, v in table.items()}, sum(s for _, s in outcomes), len(trials))


def run_sweep(name: str, clips: list, batches: list, multipliers: list, root: Path) -> dict:
    """One case as a real `dptune sweep`: its trials, its optimum (the best seed-mean of the
    configurations that finished on every seed), wall seconds and the bracketing record."""
    folder = root / name
    folder.mkdir()
    path = folder / "spec.json"
    path.write_text(json.dumps(spec(clips, batches, multipliers, SEARCH)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DPTUNE_CACHE_DIR": str(root / "cache")}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dptune", "sweep", str(path), "--storage", str(folder)],
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"dptune sweep failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    query = subprocess.run([sys.executable, "-m", "dptune", "query", "--format", "json", "--store",
                            str(folder / "bracketing"), "SELECT * FROM trials"], capture_output=True, text=True, env=env)
    rows = json.loads(query.stdout)
    runs: dict = defaultdict(dict)
    for r in rows:
        if r["status"] in ("finished", "equivalent"):
            runs[key(r["clip_bound"], r["batch_size"], r["learning_rate"])][int(r["seed"])] = r["accuracy"]
    complete = {k: sum(v.values()) / len(v) for k, v in runs.items() if len(v) == len(SEEDS)}
    best = max(complete, key=complete.get)
    closing = [line for line in proc.stdout.splitlines() if "bracket" in line or "edge" in line]
    return {"wall_s": wall, "trials": len(rows), "trained": sum(r["status"] != "equivalent" for r in rows),
            "optimum": best, "own_mean": complete[best], "closing": closing}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).with_name("results") / "bracketing.json"))
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
    start = time.perf_counter()
    table, train_s, wide_trials = wide_grid(args.workers)
    means = {k: sum(v) / len(v) for k, v in table.items()}
    c_star, b_star, lr_star = best = max(means, key=means.get)
    m_star = min(MULTIPLIERS, key=lambda m: abs(m - lr_star / (ETA_REF * (b_star / B_REF) ** 0.5)))   # on the grid
    print(f"wide grid: {wide_trials} trials in {time.perf_counter() - start:.0f} s; optimum C={c_star:g} B={b_star} "
          f"η={lr_star:g} (m={m_star:g}): {means[best]:.4f}", flush=True)

    def around(values: list, centre: float) -> list:
        i = min(range(len(values)), key=lambda j: abs(values[j] - centre))
        return values[max(0, i - 1):i + 2]

    ci = CLIPS.index(min(CLIPS, key=lambda c: abs(c - c_star)))
    bi = BATCHES.index(b_star)
    mi = min(range(len(MULTIPLIERS)), key=lambda j: abs(MULTIPLIERS[j] - m_star))
    cases = {"η too small": (around(CLIPS, c_star), around(BATCHES, b_star), [m_star / 8, m_star / 4]),
             "C too large": ([round(c_star * 9, 10), round(c_star * 27, 10)], around(BATCHES, b_star),
                             around(MULTIPLIERS, m_star)),
             "B too large": (around(CLIPS, c_star), [b_star * 4, b_star * 8], around(MULTIPLIERS, m_star))}
    report = {"wide": {"trials": wide_trials, "train_s": train_s, "optimum": best, "mean": means[best],
                       "indices": [ci, bi, mi]}, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="bench-bracketing-") as tmp:
        for name, (clips, batches, multipliers) in cases.items():
            got = run_sweep(name.replace(" ", "-"), clips, batches, multipliers, Path(tmp))
            wide_mean = means.get(got["optimum"])
            got.update(grid={"C": clips, "B": batches, "m": multipliers}, wide_mean=wide_mean,
                       regret=None if wide_mean is None else means[best] - wide_mean,
                       compute=got["trained"] / wide_trials)
            report["cases"][name] = got
            regret = "not in the wide grid" if wide_mean is None else f"{100 * got['regret']:.2f} points"
            print(f"\n{name}: initial C {clips}, B {batches}, m {[f'{m:g}' for m in multipliers]}\n"
                  f"  optimum C={got['optimum'][0]:g} B={got['optimum'][1]} η={got['optimum'][2]:g}: "
                  f"{got['own_mean']:.4f} in its store, {wide_mean if wide_mean is None else round(wide_mean, 4)} "
                  f"in the wide table; regret {regret}; {got['trained']} trials trained "
                  f"({got['compute']:.0%} of the wide grid), {got['wall_s']:.0f} s", flush=True)
            for line in got["closing"]:
                print("  | " + line.strip())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"\nraw results: {args.out}")


if __name__ == "__main__":
    main()
