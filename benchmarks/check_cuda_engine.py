"""On a GPU: dptune's engines give the clipped sum and per-example norms of a per-example loop.

The test suite checks the engines against tests/trainables/per_example_reference.py on CPU; this
runs the same comparison on CUDA (float32, TF32 off), where kernels, dtypes and hooks differ:
for each case, the book-keeping engine ("hooks") and the vmap engine against one autograd
backward per example, clip bound chosen so about half the examples are clipped.

Run: python benchmarks/check_cuda_engine.py [--cases cnn wrn16_4 vit_tiny_film roberta_lora] [--batch 8]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trainables"))
from common import build_case  # noqa: E402
from per_example_reference import clipped_sum_loop  # noqa: E402

from dptune.trainables.engine.dp_engine import DPEngine  # noqa: E402
from dptune.trainables.engine.per_sample import VmapNormEngine  # noqa: E402


def relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = torch.sqrt(sum((a[k] - b[k]).double().pow(2).sum() for k in b))
    return float(num / torch.sqrt(sum(b[k].double().pow(2).sum() for k in b)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["cnn", "wrn16_4", "vit_tiny_film", "roberta_lora"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest relative error accepted")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    worst = 0.0
    for name in args.cases:
        case = build_case(name, args.batch, args.tokens, "eager", args.device)
        case.model.eval()  # no dropout: the loop and the engines see the same function
        _, norms = clipped_sum_loop(case.model, case.inputs, case.targets, clip=1e9)
        clip = float(norms.median())
        sums, norms = clipped_sum_loop(case.model, case.inputs, case.targets, clip=clip)
        for per_sample in ("hooks", "vmap"):
            loss = nn.CrossEntropyLoss(reduction="none")
            engine = DPEngine(case.model, loss, clip_bound=clip, noise_multiplier=0.0, expected_batch_size=args.batch,
                              norm_estimator=VmapNormEngine(case.model, loss) if per_sample == "vmap" else "exact")
            try:
                got, got_norms = engine.clipped_sum(case.inputs, case.targets)
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"{case.label:55s} {per_sample:5s}  fails: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                worst = float("inf")
                continue
            err_sum = relative_error({k: v for k, v in got.items()}, sums)
            err_norm = float(((got_norms - norms).abs() / norms).max())
            worst = max(worst, err_sum, err_norm)
            print(f"{case.label:55s} {per_sample:5s}  clipped sum rel. err {err_sum:.1e}  norms max rel. err "
                  f"{err_norm:.1e}  on {args.device}")
    print(f"worst relative error {worst:.1e} (tolerance {args.tolerance:g}): "
          f"{'OK' if worst <= args.tolerance else 'FAILED'}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
