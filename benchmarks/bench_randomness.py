"""Secure randomness against reproducible randomness: the cost of a DP step (issue 22).

One interleaved run per model: both modes train their own copy of the same model on the same
fixed batch with dptune's exact engine, timed round-robin (examples/s = B / median step). Each
step draws its Poisson membership over N = 50,000 examples and the noise of every trainable
parameter from the mode's streams (trainables/engine/randomness.py): reproducible = torch generators
seeded through SeedSequence; secure = ChaCha20 (cryptography) keyed by a fresh OS secret, Gaussians
by Box–Muller in float64 with the discard-and-sum mitigation (4 draws per value + 1 discarded per call).

Cases as bench_engine.py: cnn (B=256), wrn16_4 (64), vit_tiny_film (64), minilm_lora (64). A third
copy trains in reproducible mode again (A/A): the spread between the two reproducible copies is
the noise floor of the comparison. "draws" is the randomness of one step alone (membership + the
noise of every trainable parameter), timed on its own: what secure mode adds, without the step.

Run: python benchmarks/bench_randomness.py [--cases ...] [--repeats 7] [--device cpu|cuda] [--markdown]
"""
from __future__ import annotations

import argparse
import copy
import sys
import warnings

import torch
from torch import nn

from common import CASES, DEFAULT_DEVICE, build_case, interleaved_medians, rate
from dptune.trainables.engine.dp_engine import DPEngine
from dptune.trainables.engine.randomness import membership, new_secret, stream

warnings.filterwarnings("ignore")
N = 50_000


def mode_step(mode: str, model: nn.Module, inputs: object, targets: torch.Tensor):
    """One DP step (membership over N, clipped sum, noise, SGD) with ``mode``'s streams."""
    device = targets.device
    secret = new_secret() if mode == "secure" else None
    sampler, noise = (stream(mode, name, seed=0, secret=secret, device=device) for name in ("sampler", "noise"))
    batch = len(targets)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    engine = DPEngine(model, nn.CrossEntropyLoss(reduction="none"), clip_bound=1.0, noise_multiplier=1.0,
                      expected_batch_size=batch, generator=noise)

    def step() -> None:
        membership(sampler, N, batch / N)
        opt.zero_grad()
        engine.private_gradient(inputs, targets)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    return step


def draw_time(mode: str, model: nn.Module, device: torch.device, repeats: int) -> float:
    """Median seconds of one step's draws alone: membership over N and noise for every trainable parameter."""
    import statistics
    import time

    secret = new_secret() if mode == "secure" else None
    sampler, noise = (stream(mode, name, seed=0, secret=secret, device=device) for name in ("sampler", "noise"))
    shapes = [p.shape for p in model.parameters() if p.requires_grad]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        membership(sampler, N, 0.01)
        for shape in shapes:
            noise.normal(shape, dtype=torch.float32, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--device", default=DEFAULT_DEVICE)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    on = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {on}; {args.repeats} interleaved rounds; membership over N={N:,} per step")
    header = ["model, B", "trainable parameters", "reproducible ex/s", "secure ex/s", "secure step cost",
              "A/A (reproducible twice)", "draws: reproducible / secure (ms)"]
    rows = []
    for name in args.cases:
        case = build_case(name, None, args.tokens, "eager", args.device)
        trainable = sum(p.numel() for p in case.model.parameters() if p.requires_grad)
        steps = {name: mode_step(name.split()[0], copy.deepcopy(case.model), case.inputs, case.targets)
                 for name in ("reproducible", "secure", "reproducible again")}
        medians = interleaved_medians(steps, args.repeats)
        batch = len(case.targets)
        rep, sec, again = medians["reproducible"], medians["secure"], medians["reproducible again"]
        draws = [1e3 * draw_time(mode, case.model, case.targets.device, args.repeats)
                 for mode in ("reproducible", "secure")]
        rows.append([f"{case.label}, B={batch}", f"{trainable:,}", rate(batch / rep), rate(batch / sec),
                     f"{100 * (sec / rep - 1):+.1f}%", f"{100 * (again / rep - 1):+.1f}%",
                     f"{draws[0]:.1f} / {draws[1]:.1f}"])
        print(" | ".join(rows[-1]), file=sys.stderr)
    if args.markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        for r in [header, *rows]:
            print("  ".join(r))


if __name__ == "__main__":
    main()
