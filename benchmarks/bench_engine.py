"""DP step throughput (issue 16): dptune's DPEngine vs non-private training vs Opacus 1.6 hooks and ghost.

One interleaved run per (model, B): every method trains its own copy of the same model on the
same fixed batch, all timed round-robin in one loop (so that load changes hit all alike);
examples/s = B / median full optimizer step (forward, backward, clipping, noise, SGD step).
Methods: non-private; dptune "exact" (and the vmap reference "vmap" when dptune registers it);
Opacus hooks (GradSampleModule + DPOptimizer); Opacus ghost (GradSampleModuleFastGradientClipping).
A method that cannot run on a case gets "fails: <reason>" in its cell. On CPU the run uses
--threads torch threads (default 1).

Cases (default B): cnn (256, 1×28×28), wrn16_4 (64, 3×32×32), vit_tiny_film (64, ViT-Tiny + FiLM
224², random weights), minilm_lora (64, embedded all-MiniLM-L6-v2 + LoRA, --tokens 128, half of
the examples padded); --gpu-cases adds vit_base_film (256) and roberta_lora (64, RoBERTa-base +
LoRA, random weights from a config).

Run: python benchmarks/bench_engine.py [--cases cnn wrn16_4 vit_tiny_film minilm_lora] [--gpu-cases]
         [--batch B] [--repeats 5] [--tokens 128] [--device cpu|cuda] [--markdown]
         [--methods non-private "dptune exact"]
"""
from __future__ import annotations

import argparse
import sys
import warnings

import torch

from common import CASES, DEFAULT_DEVICE, GPU_CASES, build_case, failure, interleaved_medians, method_names, \
    method_steps, rate

warnings.filterwarnings("ignore")


def run_case(name: str, args: argparse.Namespace, methods: list[str]) -> tuple[str, int, dict[str, float | str]]:
    """(label, B, {method: examples/s or a failure cell})."""
    case = build_case(name, args.batch, args.tokens, args.attention, args.device)
    batch = len(case.targets)
    steps, failed = method_steps(case, methods)
    medians = interleaved_medians(steps, args.repeats)
    speeds = {m: (t if isinstance(t, str) else batch / t) for m, t in medians.items()}
    return case.label, batch, {m: {**speeds, **failed}[m] for m in methods}


def ratio(a: float | str, b: float | str | None) -> str:
    return "–" if isinstance(a, str) or not isinstance(b, float) else f"{a / b:.2f}"


def row(label: str, batch: int, speeds: dict[str, float | str], methods: list[str]) -> list[str]:
    opacus = [v for m, v in speeds.items() if m.startswith("Opacus") and not isinstance(v, str)]
    dptune = speeds.get("dptune exact", "fails: not registered")
    return [f"{label}, B={batch}", *(rate(speeds[m]) for m in methods),
            ratio(dptune, speeds.get("non-private")), ratio(dptune, max(opacus) if opacus else None)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=[*CASES, *GPU_CASES])
    parser.add_argument("--gpu-cases", action="store_true", help=f"add {', '.join(GPU_CASES)}")
    parser.add_argument("--batch", type=int, default=None, help="override every case's batch size")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (after one warm-up step)")
    parser.add_argument("--tokens", type=int, default=128, help="sequence length of the text cases")
    parser.add_argument("--attention", choices=["eager", "sdpa"], default="eager", help="ViT and text models")
    parser.add_argument("--device", default=DEFAULT_DEVICE)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--markdown", action="store_true", help="print a table ready for BENCHMARKS.md")
    parser.add_argument("--methods", nargs="+", default=method_names(), choices=method_names(), metavar="METHOD",
                        help=f"the methods to time (default all: {', '.join(method_names())})")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import opacus

    cases = args.cases + ([c for c in GPU_CASES if c not in args.cases] if args.gpu_cases else [])
    methods = args.methods
    on = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, opacus {opacus.__version__}, {on}; {args.repeats} interleaved rounds, "
          f"examples/s = B / median step")
    header = ["model, B", *(f"{m} ex/s" for m in methods), "dptune / non-private", "dptune / best Opacus"]
    rows = []
    for name in cases:
        try:
            rows.append(row(*run_case(name, args, methods), methods))
        except Exception as exc:  # noqa: BLE001 - the case could not be built: report it and go on
            rows.append([name, *([failure(exc)] + ["–"] * (len(header) - 2))])
        # progress (to stderr when the table goes to stdout)
        print("  ".join(f"{h}: {v}" for h, v in zip(header, rows[-1])), flush=True,
              file=sys.stderr if args.markdown else sys.stdout)
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
