"""Benchmark of per-sample weight-gradient norms for one large linear layer on a long sequence
(issue 4): materialised per-sample gradients vs ghost norms vs Hutchinson vs Hutch++.

    python benchmarks/bench_norms.py                      # the paper's layer, 8192×2048, T = 4096, k = 32, B = 1
    python benchmarks/bench_norms.py --seq 2048 --batch 2 --d-in 1024 --d-out 4096 --reps 3

Each method runs in a fresh process (so the peak resident memory, reset through
/proc/self/clear_refs, is its own): peak memory above the process with and without the stored
inputs A [B, T, d] and G [B, T, p], CPU and wall seconds, and the analytic FLOPs. Prints a markdown
block for BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

METHODS = ("materialised", "ghost", "hutchinson", "hutchpp")


def flops(method: str, T: int, d: int, p: int, k: int) -> float:
    """Multiply-adds ×2 per example."""
    return {"materialised": 2 * T * d * p + 2 * d * p,
            "ghost": 2 * T * T * (d + p) + 2 * T * T,
            "hutchinson": 2 * T * k * (d + p) + 2 * d * k,
            "hutchpp": 8 * T * k * (d + p) + 6 * p * k * k + 4 * d * k * k}[method]


def _kb(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))


def child(args: argparse.Namespace) -> None:
    import torch

    from dptune.trainables.engine.norm_estimators import (gram_sq_norms, hutchinson_sq_norms, hutchpp_sq_norms,
                                                    materialised_sq_norms)

    torch.set_num_threads(args.threads)
    fn = {"materialised": lambda A, G: materialised_sq_norms(A, G), "ghost": lambda A, G: gram_sq_norms(A, G),
          "hutchinson": lambda A, G: hutchinson_sq_norms(A, G, args.k, gen),
          "hutchpp": lambda A, G: hutchpp_sq_norms(A, G, args.k, gen)}[args.child]
    gen = torch.Generator().manual_seed(0)
    warm = torch.randn(8, 16, 32)
    fn(warm, torch.randn(8, 16, 8))  # load kernels before the baseline
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _kb("VmRSS")
    A = torch.randn(args.batch, args.seq, args.d_in)
    G = torch.randn(args.batch, args.seq, args.d_out)
    with_inputs = _kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak restarts from here
    cpu, wall = [], []
    for _ in range(args.reps):
        c, w = time.process_time(), time.perf_counter()
        fn(A, G)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    peak = _kb("VmHWM")
    print(json.dumps({"inputs_mb": (with_inputs - base) / 1024, "peak_with_inputs_mb": (peak - base) / 1024,
                      "peak_without_inputs_mb": (peak - with_inputs) / 1024, "cpu_s": min(cpu), "wall_s": min(wall)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=4096, help="T")
    parser.add_argument("--d-in", type=int, default=2048, help="d")
    parser.add_argument("--d-out", type=int, default=8192, help="p")
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    rows = {}
    for method in METHODS:
        cmd = [sys.executable, __file__, "--child", method, *sys.argv[1:]]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ}).stdout
        rows[method] = json.loads(out.strip().splitlines()[-1])
        print(method, rows[method], file=sys.stderr, flush=True)
    T, d, p, k, B = args.seq, args.d_in, args.d_out, args.k, args.batch
    print(f"\nLayer d = {d} → p = {p}, T = {T}, B = {B}, k = {k}, float32, {args.threads} torch threads, "
          f"{platform.machine()} CPU, torch; best of {args.reps} run(s). Inputs A and G: "
          f"{rows['hutchinson']['inputs_mb']:.0f} MiB.\n")
    print("| method | peak memory with inputs | without inputs | FLOPs / example | CPU time | wall time |")
    print("|---|---|---|---|---|---|")
    for m in METHODS:
        r = rows[m]
        print(f"| {m} | {r['peak_with_inputs_mb']:.0f} MiB | {r['peak_without_inputs_mb']:.1f} MiB | "
              f"{flops(m, T, d, p, k) / 1e9:.2f} G | {r['cpu_s']:.2f} s | {r['wall_s']:.2f} s |")
    print("\nSavings of the randomised estimators (1 − theirs / baseline):\n")
    print("| vs | Hutchinson: with inputs | without | FLOPs | Hutch++: with inputs | without | FLOPs |")
    print("|---|---|---|---|---|---|---|")
    for base in ("materialised", "ghost"):
        cells = []
        for m in ("hutchinson", "hutchpp"):
            cells += [1 - rows[m]["peak_with_inputs_mb"] / rows[base]["peak_with_inputs_mb"],
                      1 - rows[m]["peak_without_inputs_mb"] / rows[base]["peak_without_inputs_mb"],
                      1 - flops(m, T, d, p, k) / flops(base, T, d, p, k)]
        print(f"| {base} | " + " | ".join(f"{c:.2%}" for c in cells) + " |")


if __name__ == "__main__":
    main()
