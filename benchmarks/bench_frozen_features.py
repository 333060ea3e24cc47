"""What shared frozen computation buys a ``peft: head`` trial (issue 25, item 2).

The embedded all-MiniLM-L6-v2 with a new head on the embedded BBC News, DP-Adam: one trial's wall
time (set-up: model and data, features; training steps and evaluation) when the whole model runs
every step (no cut known: ``FEATURE_CUTS = ()``), when the features are computed (the first trial of
a sweep), read from the disk cache (a trial in another process) and from memory (the next trial in a
reused Ray worker). Variants interleaved over --rounds rounds, 1 torch thread, alone on the machine.
The test accuracies must agree (the cached path is exact; tests/trainables/test_frozen_features.py).

Run: python benchmarks/bench_frozen_features.py [--max-length 128] [--epochs 2] [--rounds 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

import torch

from dptune.trainables import frozen_features
from dptune.trainables.config import TrainConfig
from dptune.trainables.training import Trainer

VARIANTS = ("whole model every step", "features computed", "features from disk", "features from memory")


def trial(cfg: TrainConfig, variant: str, cache: str) -> tuple[float, float, float]:
    """(set-up s, fit s, final test accuracy) of one trial run as ``variant``."""
    cuts = frozen_features.FEATURE_CUTS
    if variant != "features from memory":
        frozen_features._memory.clear()
    if variant == "features computed":
        cache = tempfile.mkdtemp(prefix="dptune-features-")
    frozen_features.FEATURE_CUTS = () if variant == "whole model every step" else cuts
    os.environ["DPTUNE_CACHE_DIR"] = cache
    try:
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = Trainer(cfg)
        built = time.perf_counter()
        history = trainer.fit()
        done = time.perf_counter()
    finally:
        frozen_features.FEATURE_CUTS = cuts
    expected = None if variant == "whole model every step" else variant.split()[-1]
    assert trainer.features_source == {"computed": "computed", "disk": "disk", "memory": "memory"}.get(expected)
    return built - start, done - built, history[-1]["test_accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = TrainConfig(model="all-MiniLM-L6-v2", dataset="bbc_news", peft="head", max_length=args.max_length,
                      epsilon=2.0, batch_size=args.batch_size, clip_bound=1.0, learning_rate=0.05, optimizer="adam",
                      epochs=args.epochs, device="cpu")
    warm = tempfile.mkdtemp(prefix="dptune-features-")   # "computed" runs get a fresh folder each
    os.environ["DPTUNE_CACHE_DIR"] = warm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(cfg)   # writes the entry the disk and memory variants read
    results: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            results[variant].append(trial(cfg, variant, warm))
    print(f"MiniLM-L6 head, BBC News, {args.max_length} tokens, B = {args.batch_size}, {args.epochs:g} epochs, "
          f"{args.rounds} rounds (medians)")
    print("| trial | set-up s | training + evaluation s | trial s | test accuracy |")
    print("|---|---|---|---|---|")
    for variant, runs in results.items():
        setup = statistics.median(r[0] for r in runs)
        fit = statistics.median(r[1] for r in runs)
        print(f"| {variant} | {setup:.1f} | {fit:.2f} | {setup + fit:.1f} | {runs[-1][2]:.4f} |")


if __name__ == "__main__":
    main()
