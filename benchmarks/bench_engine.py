"""DP step throughput: dptune's DPEngine vs non-private training vs Opacus (same model, batch, machine).

Each measurement is one optimizer step on a fixed batch of B examples (forward, backward,
per-sample clipping and noise where private), repeated; examples/s is B / median step time.
Run: python benchmarks/bench_engine.py [--models cnn wrn16_4] [--batch 256] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch import nn

from dptune.trainables import DPEngine
from dptune.trainables.models import create_model

warnings.filterwarnings("ignore")
SHAPES = {"cnn": (1, 28, 28), "wrn16_4": (3, 32, 32), "mlp": (1, 28, 28)}


def interleaved_medians(steps: dict, repeats: int) -> dict[str, float]:
    """Median step time of each method, timed round-robin so load changes hit all alike."""
    for step in steps.values():
        step()  # warm-up
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def bench(name: str, B: int, repeats: int, micro: int | None) -> dict[str, float]:
    torch.manual_seed(0)
    shape = SHAPES[name]
    x, y = torch.randn(B, *shape), torch.randint(0, 10, (B,))
    loss = nn.CrossEntropyLoss(reduction="none")

    model = create_model(name, num_classes=10, input_shape=shape)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def plain():
        opt.zero_grad()
        loss(model(x), y).mean().backward()
        opt.step()

    engine = DPEngine(model, loss, clip_bound=1.0, noise_multiplier=1.0, expected_batch_size=B,
                      max_physical_batch_size=micro)

    def dptune_step():
        opt.zero_grad()
        engine.private_gradient(x, y)
        opt.step()

    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    o_model = GradSampleModule(create_model(name, num_classes=10, input_shape=shape))
    o_opt = DPOptimizer(torch.optim.SGD(o_model.parameters(), lr=0.01), noise_multiplier=1.0, max_grad_norm=1.0,
                        expected_batch_size=B)

    def opacus_step():
        o_opt.zero_grad()
        nn.functional.cross_entropy(o_model(x), y).backward()
        o_opt.step()

    medians = interleaved_medians({"non-private": plain, "dptune": dptune_step, "opacus": opacus_step}, repeats)
    return {name: B / t for name, t in medians.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["cnn", "wrn16_4"])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--micro", type=int, default=None, help="DPEngine max_physical_batch_size")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, B = {args.batch}")
    print("| model | non-private ex/s | dptune ex/s | Opacus ex/s | dptune / non-private | Opacus / non-private | dptune / Opacus |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        r = bench(name, args.batch, args.repeats, args.micro)
        print(f"| {name} | {r['non-private']:.0f} | {r['dptune']:.0f} | {r['opacus']:.0f} | "
              f"{r['dptune'] / r['non-private']:.2f} | {r['opacus'] / r['non-private']:.2f} | "
              f"{r['dptune'] / r['opacus']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
