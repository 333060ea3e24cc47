"""Checks on a CUDA device that each member of a pack gets the per-sample norms and the privatised
gradient its own model gets from DPEngine (float64, cnn / wrn16_4 / ViT-Tiny + FiLM, K = 3, members
with different weights, C and σ, the same noise stream). Prints the largest differences.

Run: python benchmarks/check_cuda_pack.py [--device cuda]
"""
from __future__ import annotations

import argparse
import copy

import torch

from common import DEFAULT_DEVICE, build_case
from dptune.trainables import DPEngine
from dptune.trainables.engine.packing import pack_models
from dptune.trainables.engine.randomness import SeededStream

LOSS = torch.nn.CrossEntropyLoss(reduction="none")
SETTINGS = [(0.5, 1.0), (2.0, 0.5), (8.0, 2.0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=DEFAULT_DEVICE)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    device = torch.device(args.device)
    for name in ("cnn", "wrn16_4", "vit_tiny_film"):
        case = build_case(name, args.batch, 0, "eager", args.device)
        model, x, y = case.model.double(), case.inputs.double(), case.targets
        models = [copy.deepcopy(model) for _ in SETTINGS]
        with torch.no_grad():
            for k, m in enumerate(models):
                for p in m.parameters():
                    if p.requires_grad:
                        p.add_(0.01 * k * torch.randn_like(p))
        packed = pack_models(models)
        engine = DPEngine(packed, LOSS, members=len(models), clip_bound=[c for c, _ in SETTINGS],
                          noise_multiplier=[s for _, s in SETTINGS], expected_batch_size=args.batch,
                          generator=SeededStream(1, "noise", device))
        stats = engine.private_gradient(x, y)
        worst_norm = worst_grad = 0.0
        for k, (m, (clip, sigma)) in enumerate(zip(models, SETTINGS)):
            alone = DPEngine(m, LOSS, clip_bound=clip, noise_multiplier=sigma, expected_batch_size=args.batch,
                             generator=SeededStream(1, "noise", device))
            ref = alone.private_gradient(x, y)
            worst_norm = max(worst_norm, float(((stats["norms"][k] - ref["norms"]) / ref["norms"]).abs().max()))
            trainable = [(p, q) for p, q in zip(packed.parameters(), m.parameters()) if q.requires_grad]
            worst_grad = max(worst_grad, max(float((p.grad[k] - q.grad).abs().max()) for p, q in trainable))
        ok = worst_norm < 1e-9 and worst_grad < 1e-9
        print(f"{case.label}: K = {len(models)}, largest relative norm difference {worst_norm:.1e}, "
              f"largest ĝ difference {worst_grad:.1e}: {'OK' if ok else 'MISMATCH'}", flush=True)


if __name__ == "__main__":
    main()
