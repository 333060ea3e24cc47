"""Where proxy runs rank configurations as full-scale runs do (issue 24, "TAN without a burn").

For one cell (digits, the registered cnn, DP-SGD, ε, δ = 1e-5, E epochs) and each batch size B, every
(C, η) of a grid is trained at full scale (B, σ, T) and as proxies (B/k, σ/k, T) for each divisor k,
over several seeds (dptune's trainer, the proxies' figures from ``search_spaces.proxy.proxy_run``).
Per (B, k): σ/k, the compute fraction, the Spearman rank correlation of the proxies' seed-mean
accuracies with the full runs', and the regret: the full-scale accuracy of the proxy's choice below
the best full-scale accuracy (points). This is where ``MIN_PROXY_SIGMA`` comes from.

    python benchmarks/bench_proxy.py [--epsilon 1] [--epochs 8] [--seeds 3] [--batch-sizes 256 512]
"""
from __future__ import annotations

import argparse
import itertools
import math
import statistics

import torch
from scipy import stats

from dptune.privacy import calibrate_noise
from dptune.privacy.schedule import num_steps, sample_rate
from dptune.search_spaces.proxy import proxy_run
from dptune.trainables.config import TrainConfig
from dptune.trainables.data.catalog import load_dataset
from dptune.trainables.training import Trainer

CLIPS, MULTIPLIERS, ETA_REF, B_REF = (0.3, 1.0, 3.0), (0.25, 0.5, 1.0, 2.0), 2.0, 128


def accuracy(data, *, clip, batch, lr, sigma, epochs, epsilon, seed) -> float:
    cfg = TrainConfig(dataset="digits", model="cnn", epsilon=epsilon, delta=1e-5, epochs=epochs, optimizer="sgd",
                      clip_bound=clip, batch_size=batch, learning_rate=lr, noise_multiplier=sigma, seed=seed,
                      split_seed=0)
    trainer = Trainer(cfg, data)
    metrics = trainer.fit()[-1]
    return metrics["test_accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--epochs", type=float, default=8)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--divisors", type=int, nargs="+", default=[2, 4, 8, 16])
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load_dataset("digits", seed=0)
    n = len(data.train)
    print("| B | k | B/k | σ/k | compute | Spearman ρ | proxy's choice (C, η) | its full-scale accuracy | regret (points) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for batch in args.batch_sizes:
        steps = num_steps(args.epochs, n, batch)
        sigma = calibrate_noise(args.epsilon, 1e-5, sample_rate(batch, n), steps)
        grid = list(itertools.product(CLIPS, MULTIPLIERS))
        lr = {m: ETA_REF * math.sqrt(batch / B_REF) * m for m in MULTIPLIERS}

        def means(k: int) -> list[float]:
            run = proxy_run(batch, sigma, steps, n, k)
            epochs = args.epochs if k == 1 else run.epochs
            return [statistics.mean(accuracy(data, clip=c, batch=run.batch_size, lr=lr[m], sigma=run.noise_multiplier,
                                             epochs=epochs, epsilon=args.epsilon, seed=s) for s in range(args.seeds))
                    for c, m in grid]

        full = means(1)
        best = max(full)
        for k in [1, *args.divisors]:
            run = proxy_run(batch, sigma, steps, n, k)
            proxy = full if k == 1 else means(k)
            rho = stats.spearmanr(proxy, full).statistic
            choice = max(range(len(grid)), key=lambda i: proxy[i])
            c, m = grid[choice]
            print(f"| {batch} | {k} | {run.batch_size} | {run.noise_multiplier:.3f} | 1/{k} | {rho:.2f} | "
                  f"C={c:g}, η={lr[m]:.3g} | {full[choice]:.4f} | {100 * (best - full[choice]):.1f} |", flush=True)


if __name__ == "__main__":
    main()
