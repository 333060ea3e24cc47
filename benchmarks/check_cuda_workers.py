"""CUDA check of the multi-worker DP step (issue 14), engine level (torch only, no Ray):

1. Hutchinson probes seeded per (step, layer) from a CUDA generator: the privatised gradient does
   not depend on the micro-batch size (float64, relative 1e-10).
2. Two processes on one GPU (gloo all-reduce of CUDA tensors, since NCCL needs a GPU per rank):
   each takes its shard of one logical batch; ĝ equals the one-process ĝ with the same noise seed
   (relative 1e-10), on both ranks. NCCL across GPUs needs a machine with several.

Run: python benchmarks/check_cuda_workers.py   (prints PASS/FAIL lines; exit 1 on a failure)
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dptune.trainables.engine.distributed import ProcessGroupWorkers, shard_bounds  # noqa: E402
from dptune.trainables.engine.dp_engine import DPEngine  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: a smoke run
N = 64


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, 16, dtype=torch.float64, generator=g), torch.randint(0, 4, (N,), generator=g)


def gradient(x: torch.Tensor, y: torch.Tensor, *, micro: int | None = None, all_reduce=None) -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).double().to(DEVICE)
    engine = DPEngine(model, nn.CrossEntropyLoss(reduction="none"), clip_bound=0.05, noise_multiplier=1.0,
                      expected_batch_size=N, norm_estimator="hutchinson", sketch_k=3, max_physical_batch_size=micro,
                      generator=torch.Generator(device=DEVICE).manual_seed(2),
                      probes=torch.Generator(device=DEVICE).manual_seed(3), all_reduce=all_reduce)
    engine.private_gradient(x.to(DEVICE), y.to(DEVICE))
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def worker(rank: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    workers = ProcessGroupWorkers()
    x, y = batch()
    low, high = shard_bounds(N, rank, 2)
    g = gradient(x[low:high], y[low:high], micro=5, all_reduce=workers.sum)
    parts = [torch.zeros_like(g, device="cpu") for _ in range(2)]
    dist.all_gather(parts, g.cpu())
    if rank == 0:
        torch.save(parts, out)
    dist.destroy_process_group()


def main() -> int:
    ok = True
    x, y = batch()
    whole = gradient(x, y)
    r = rel(gradient(x, y, micro=7), whole)
    ok &= r < 1e-10
    print(f"{'PASS' if r < 1e-10 else 'FAIL'} micro-batches 7 vs whole, Hutchinson probes on CUDA: rel {r:.2e}")
    out = "/tmp/check_cuda_workers.pt"
    mp.spawn(worker, args=(out,), nprocs=2)
    g0, g1 = torch.load(out)
    r = rel(g0.to(DEVICE), whole)
    same = torch.equal(g0, g1)
    ok &= r < 1e-10 and same
    print(f"{'PASS' if r < 1e-10 and same else 'FAIL'} two ranks (gloo, CUDA tensors) vs one process: rel {r:.2e}, "
          f"ranks identical: {same}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
