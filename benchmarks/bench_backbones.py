"""Pretrained backbones under DP: step throughput, and a real DP fine-tuning run.

throughput: examples/s of one optimizer step on a fixed batch of B examples for ViT-Tiny + FiLM
(224×224, random weights: throughput does not depend on them) and all-MiniLM-L6-v2 + LoRA
(pretrained, 128 tokens): non-private (same model; and with fused attention, the fastest
non-private setting), dptune's DPEngine, and Opacus (GradSampleModule + DPOptimizer, same model
and trainable set). The variants run interleaved, round after round, so that load changes on a
shared machine hit them alike; each figure is B / median step time.

finetune: MiniLM + LoRA on the embedded BBC News set at ε = 8 and ε = 1 (δ = 1e-5, DP-Adam) and
the non-private baseline, through the same Trainer as ``dptune train``.

Run: python benchmarks/bench_backbones.py throughput [--batch 64] [--rounds 5]
     python benchmarks/bench_backbones.py finetune [--max-length 32] [--epochs 6] [--batch 256]
"""
from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
import warnings
from typing import Callable

import torch
from torch import nn

from dptune.trainables import DPEngine
from dptune.trainables.engine.batching import model_outputs
from dptune.trainables.config import TrainConfig
from dptune.trainables.models.catalog import create_model, parameter_summary
from dptune.trainables.training import train

warnings.filterwarnings("ignore")
VIT = "vit_tiny_patch16_224.augreg_in21k"
MINILM = "all-MiniLM-L6-v2"


def inputs_for(name: str, batch: int, generator: torch.Generator) -> tuple[object, torch.Tensor, int]:
    """A fixed batch (inputs, targets) and the number of classes."""
    if name == VIT:
        return torch.randn(batch, 3, 224, 224, generator=generator), torch.randint(0, 100, (batch,), generator=generator), 100
    ids = torch.randint(1000, 29000, (batch, 128), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, torch.randint(0, 5, (batch,), generator=generator), 5


def build(name: str, classes: int, attention: str) -> nn.Module:
    weights = {"weights": "random"} if name == VIT else {}
    shape = (3, 224, 224) if name == VIT else (128,)
    return create_model(name, num_classes=classes, input_shape=shape, attention=attention, **weights)


def steps(name: str, batch: int) -> dict[str, Callable[[], None]]:
    """One optimizer step per variant, each on its own copy of the model."""
    torch.manual_seed(0)
    x, y, classes = inputs_for(name, batch, torch.Generator().manual_seed(0))
    loss = nn.CrossEntropyLoss(reduction="none")
    model = build(name, classes, "eager")
    fused = build(name, classes, "sdpa")
    fused.load_state_dict(model.state_dict())

    def plain(m: nn.Module) -> Callable[[], None]:
        opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=1e-3)

        def step() -> None:
            opt.zero_grad()
            loss(model_outputs(m, x), y).mean().backward()
            opt.step()

        return step

    dp_model = copy.deepcopy(model)
    engine = DPEngine(dp_model, loss, clip_bound=1.0, noise_multiplier=1.0, expected_batch_size=batch)
    dp_opt = torch.optim.SGD([p for p in dp_model.parameters() if p.requires_grad], lr=1e-3)

    def dptune() -> None:
        dp_opt.zero_grad()
        engine.private_gradient(x, y)
        dp_opt.step()

    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    o_model = GradSampleModule(copy.deepcopy(model))
    o_opt = DPOptimizer(torch.optim.SGD([p for p in o_model.parameters() if p.requires_grad], lr=1e-3),
                        noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=batch)

    def opacus() -> None:
        o_opt.zero_grad()
        loss(model_outputs(o_model, x), y).mean().backward()
        o_opt.step()

    return {"non-private": plain(model), "non-private fused": plain(fused), "dptune": dptune, "opacus": opacus}


def throughput(name: str, batch: int, rounds: int) -> dict[str, float]:
    """examples/s per variant: B / median step time over ``rounds`` interleaved rounds."""
    variants = steps(name, batch)
    for step in variants.values():  # warm-up
        step()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for k, step in variants.items():
            start = time.perf_counter()
            step()
            times[k].append(time.perf_counter() - start)
    return {k: batch / statistics.median(v) for k, v in times.items()}


def run_throughput(args: argparse.Namespace) -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, B = {args.batch}, {args.rounds} rounds")
    print("| model | trainable | non-private ex/s (eager / fused attn) | dptune ex/s | Opacus ex/s "
          "| dptune / non-private (eager / best) | dptune / Opacus |")
    print("|---|---|---|---|---|---|---|")
    for name, label in ((VIT, "ViT-Tiny + FiLM, 224²"), (MINILM, "MiniLM-L6 + LoRA r=8, 128 tokens")):
        model = build(name, 100 if name == VIT else 5, "eager")
        trainable, total = parameter_summary(model)
        r = throughput(name, args.batch, args.rounds)
        best = max(r["non-private"], r["non-private fused"])
        print(f"| {label} | {trainable:,} ({trainable / total:.2%}) | {r['non-private']:.1f} / "
              f"{r['non-private fused']:.1f} | {r['dptune']:.1f} | {r['opacus']:.1f} | "
              f"{r['dptune'] / r['non-private']:.2f} / {r['dptune'] / best:.2f} | {r['dptune'] / r['opacus']:.2f} |",
              flush=True)


def run_finetune(args: argparse.Namespace) -> None:
    print(f"BBC News (1,780 train / 445 test, 5 classes), {MINILM} + LoRA (r=8, α=16, query/value) + head, "
          f"max_length {args.max_length}, B = {args.batch}, {args.epochs} epochs, Adam, seed {args.seed}")
    print("| setting | σ | steps | test accuracy | ε spent | train time (s) |")
    print("|---|---|---|---|---|---|")
    for epsilon, lr in ((math.inf, args.lr_nonprivate), (8.0, args.lr), (1.0, args.lr)):
        cfg = TrainConfig(dataset="bbc_news", model=MINILM, peft="lora", max_length=args.max_length, epsilon=epsilon,
                          clip_bound=args.clip, batch_size=args.batch, learning_rate=lr, epochs=args.epochs,
                          optimizer="adam", seed=args.seed, device="cpu")
        history = train(cfg, progress=False)
        last = history[-1]
        sigma = "–" if math.isinf(epsilon) else f"{_sigma(cfg):.3f}"
        setting = "non-private" if math.isinf(epsilon) else f"ε = {epsilon:g} (C = {args.clip:g})"
        spent = "∞" if math.isinf(last["epsilon_spent"]) else f"{last['epsilon_spent']:.2f}"
        print(f"| {setting}, η = {lr:g} | {sigma} | {last['step']} | {last['test_accuracy']:.2%} | {spent} | "
              f"{last['train_time_s']:.0f} |", flush=True)


def _sigma(cfg: TrainConfig) -> float:
    from dptune.trainables.training import plan_privacy

    return plan_privacy(cfg, 1780).noise_multiplier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--rounds", type=int, default=5)
    t.set_defaults(run=run_throughput)
    f = sub.add_parser("finetune")
    f.add_argument("--max-length", type=int, default=32)
    f.add_argument("--epochs", type=float, default=6)
    f.add_argument("--batch", type=int, default=256)
    f.add_argument("--clip", type=float, default=1.0)
    f.add_argument("--lr", type=float, default=1e-2, help="DP runs")
    f.add_argument("--lr-nonprivate", type=float, default=5e-3)
    f.add_argument("--seed", type=int, default=0)
    f.set_defaults(run=run_finetune)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
