"""The one-run audit on digits (issue 22): its wall time and its ε lower bounds, for the engine as it
is at ε ∈ {1, 8} and for each deliberately broken engine (trainables/audit/broken_engines.py).

Each row is one `run_audit` (1,000 gradient + 100 input canaries, seed 0): one training run of the
trial's settings with the canaries planted, then the bound at 95% confidence. Settings: digits,
--model (cnn or mlp), B = 128, 5 epochs, η = 0.5, C = 1, exact norms; 1 torch thread.

Run: python benchmarks/bench_audit.py [--model cnn] [--epsilons 1 8] [--broken-at 1 8] [--markdown]
"""
from __future__ import annotations

import argparse

import torch

from dptune.trainables.audit.run import run_audit
from dptune.trainables.audit.broken_engines import BROKEN
from dptune.trainables.config import TrainConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 8.0])
    parser.add_argument("--broken-at", nargs="+", type=float, default=[1.0, 8.0])
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = {"hidden": 16} if args.model == "mlp" else {}
    runs = [(eps, None) for eps in args.epsilons] + [(eps, b) for eps in args.broken_at for b in BROKEN]
    header = ["engine", "accountant ε", "lower bound (gradient canaries)", "lower bound (input canaries)",
              "caught", "wall (s)"]
    rows = []
    for epsilon, broken in runs:
        cfg = TrainConfig(dataset="digits", model=args.model, model_options=options, epsilon=epsilon, epochs=5,
                          batch_size=128, learning_rate=0.5, device="cpu")
        r = run_audit(cfg, broken=broken)
        rows.append([broken or "as it is (exact)", f"{r.epsilon:.2f}",
                     f"{r.gradient.epsilon:.3f} ({r.gradient.correct}/{r.gradient.guesses})",
                     f"{r.inputs.epsilon:.3f} ({r.inputs.correct}/{r.inputs.guesses})",
                     "yes" if r.violated else "no", f"{r.seconds:.1f}"])
        print("  ".join(rows[-1]), flush=True)
    if args.markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
