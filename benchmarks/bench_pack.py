"""Packed trials: configuration-steps per second of K configurations trained as one pack, against
the same K configurations trained apart.

For each case (a model and a fixed batch of B examples; common.py's cases) and pack size K, one full
DP optimizer step (forward, backward, per-sample norms, clipping, noise, SGD step) of K
configurations that differ in C, σ and η:

- separate: K models, each with its own DPEngine and optimizer, stepped one after the other in one
  process (K trials in one worker, no per-trial overhead counted);
- fractional (``--processes``): K processes started together, each training its own model, as Ray
  Tune's fractional GPUs (``gpu: 1/K``) run K trials on one device; timed from a shared barrier to the
  last process's end;
- pack: one packed model (dptune.trainables.engine.packed_layers) with PackedDPEngine and
  PackedOptimizer, every member on the same batch.

The figure is configuration-steps per second: K / (time of one step of all K). "non-private" is one
plain step of one model, for scale. Methods run interleaved round after round; each figure is the
median over rounds.

Run: python benchmarks/bench_pack.py [--cases cnn wrn16_4 vit_tiny_film] [--members 1 4 16]
                                     [--device cuda] [--processes] [--rounds 5] [--steps 5]
"""
from __future__ import annotations

import argparse
import copy
import multiprocessing as mp
import statistics
import time
import warnings

import torch
from torch import nn

from common import CASES, DEFAULT_DEVICE, build_case
from dptune.trainables import DPEngine
from dptune.trainables.engine.batching import model_outputs
from dptune.trainables.engine.packed_layers import pack_models
from dptune.trainables.engine.packed_step import PackedDPEngine, PackedOptimizer

warnings.filterwarnings("ignore")
LOSS = nn.CrossEntropyLoss(reduction="none")


def settings(k: int) -> tuple[float, float, float]:
    """(C, σ, η) of configuration k: different for every member."""
    return 0.5 * (1 + k % 4), 0.8 + 0.1 * (k % 3), 1e-3 * (1 + k % 5)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def separate_step(model: nn.Module, inputs, targets, k: int):
    clip, sigma, lr = settings(k)
    engine = DPEngine(model, LOSS, clip_bound=clip, noise_multiplier=sigma, expected_batch_size=len(targets))
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        engine.private_gradient(inputs, targets)
        opt.step()
    return step


def pack_step(model: nn.Module, inputs, targets, members: int):
    packed = pack_models([model] * members)
    clips, sigmas, lrs = zip(*(settings(k) for k in range(members)))
    engine = PackedDPEngine(packed, LOSS, members=members, clip_bounds=clips, noise_multipliers=sigmas,
                            expected_batch_size=len(targets))
    opt = PackedOptimizer(torch.optim.SGD([p for p in packed.parameters() if p.requires_grad], lr=1.0), lrs,
                          engine.active)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        engine.private_gradient(inputs, targets)
        opt.step()
    return step


def nonprivate_step(model: nn.Module, inputs, targets):
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model_outputs(model, inputs), targets).backward()
        opt.step()
    return step


def timed(step, steps: int, device: str) -> float:
    """Seconds per call of ``step`` over ``steps`` calls (after the first round's warm-up)."""
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - start) / steps


def _worker(case: str, device: str, k: int, steps: int, barrier, results) -> None:
    torch.set_num_threads(1)
    c = build_case(case, None, 0, "eager", device)
    step = separate_step(c.model, c.inputs, c.targets, k)
    step()   # warm-up: kernels, the engine's first-batch check
    sync(device)
    barrier.wait()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    results.put(time.perf_counter() - start)


def fractional(case: str, device: str, members: int, steps: int) -> float:
    """Seconds per step of all K when K processes train one configuration each, concurrently."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(members + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(case, device, k, steps, barrier, results)) for k in range(members)]
    for p in procs:
        p.start()
    barrier.wait()
    start = time.perf_counter()
    for _ in procs:
        results.get()
    elapsed = time.perf_counter() - start
    for p in procs:
        p.join()
    return elapsed / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--members", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--device", default=DEFAULT_DEVICE)
    parser.add_argument("--processes", action="store_true", help="also time K concurrent processes (fractional GPUs)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="steps timed per round and method")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"device {args.device}, torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds × "
          f"{args.steps} steps; configuration-steps per second (median over rounds)\n")
    print("| case | K | non-private (1 model) | separate | fractional | pack | pack / separate | pack / fractional |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.cases:
        case = build_case(name, None, 0, "eager", args.device)
        for members in args.members:
            models = [copy.deepcopy(case.model) for _ in range(members)]
            steps = {"non-private": nonprivate_step(copy.deepcopy(case.model), case.inputs, case.targets),
                     "pack": pack_step(case.model, case.inputs, case.targets, members)}
            separate = [separate_step(m, case.inputs, case.targets, k) for k, m in enumerate(models)]
            steps["separate"] = lambda: [s() for s in separate]
            for step in steps.values():
                step()   # warm-up
            times: dict[str, list[float]] = {m: [] for m in steps}
            for _ in range(args.rounds):
                for method, step in steps.items():
                    times[method].append(timed(step, args.steps, args.device))
            rate = {m: (1 if m == "non-private" else members) / statistics.median(t) for m, t in times.items()}
            frac = members / fractional(name, args.device, members, args.steps * args.rounds) if args.processes \
                else float("nan")
            print(f"| {case.label}, B={len(case.targets)} | {members} | {rate['non-private']:.1f} | "
                  f"{rate['separate']:.1f} | {frac:.1f} | {rate['pack']:.1f} | {rate['pack'] / rate['separate']:.2f} | "
                  f"{rate['pack'] / frac:.2f} |", flush=True)
            del models, steps, separate
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
