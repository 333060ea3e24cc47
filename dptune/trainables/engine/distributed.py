"""One DP training run on W data-parallel workers: the same DP step as on one worker, noise added once.

Every worker holds the whole model and the same seeded generators (batches, noise, probes), and
runs the same :class:`~dptune.trainables.training.Trainer`. Per step (docs/architecture.md,
"Multi-worker trials"):

1. every worker draws the *same* global Poisson mask over all N examples and keeps the indices in
   its shard (a contiguous block of the training set), so the union of the shards' batches is one
   Poisson batch of rate q over N (a shard's part may be empty);
2. each worker computes the clipped sum Σ_i c_i g_i of its examples (any norm engine, any
   micro-batching; randomised estimators use the step's probes, the same on every worker);
3. the clipped sums are summed over the workers: one all-reduce of one flat buffer;
4. every worker adds the *same* Gaussian noise σCξ (its noise generator is in the same state on
   every worker), so the noise is added once, never W times, and with no communication;
5. ĝ is normalised by the global expected B·C, and every worker steps its optimizer identically.

The result equals the one-worker run with the same seeds, up to the order of floating-point
additions. Models that draw randomness in their forward pass (dropout) see other draws per
shard and match only in distribution. The per-sample norms and labels (non-private diagnostics)
are gathered from all workers at the end of each epoch.

This module uses ``torch.distributed`` only (gloo on CPU, NCCL on GPU); starting the workers is
the platform's job (Ray Train, ``dptune.platform.sweep.multi_worker``).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence, TypeVar

import torch
from torch import nn

from .batching import Inputs, batch_len, micro_batches, model_outputs, repeat_rows
from .precision import Precision

T = TypeVar("T")


class Workers:
    """The workers of one run as a single process (W = 1): every collective is the identity."""

    rank: int = 0
    size: int = 1

    def __init__(self) -> None:
        self.comm_time_s = 0.0  # seconds spent in collectives (the benchmark's communication share)

    def shard(self, indices: torch.Tensor, num_examples: int) -> torch.Tensor:
        """This worker's part of a global batch's (sorted) ``indices`` over ``num_examples``."""
        return indices

    def sum(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """{name: Σ over workers} (the clipped sums)."""
        return tensors

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensors of all workers (an example per entry of the last dimension: a pack's norms are
        [K, n]), concatenated along it in rank order (CPU)."""
        return tensor

    def shared(self, make: Callable[[], T]) -> T:
        """``make()`` on rank 0, the same value on every worker (a secure run's secret: it travels
        to the trial's own workers only, in memory; the members of a pack its scheduler stopped)."""
        return make()


class ProcessGroupWorkers(Workers):
    """W workers of the default ``torch.distributed`` process group (initialised by the caller)."""

    def __init__(self) -> None:
        super().__init__()
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ProcessGroupWorkers needs an initialised torch.distributed process group")
        self.dist = dist
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()

    def shard(self, indices: torch.Tensor, num_examples: int) -> torch.Tensor:
        low, high = shard_bounds(num_examples, self.rank, self.size)
        return indices[(indices >= low) & (indices < high)]

    def sum(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not tensors:
            return tensors
        start = time.perf_counter()
        flat = torch.cat([t.reshape(-1) for t in tensors.values()])  # one buffer, one all-reduce
        self.dist.all_reduce(flat, op=self.dist.ReduceOp.SUM)
        out, offset = {}, 0
        for name, t in tensors.items():
            out[name] = flat[offset:offset + t.numel()].view_as(t)
            offset += t.numel()
        self.comm_time_s += time.perf_counter() - start
        return out

    def shared(self, make: Callable[[], T]) -> T:
        box = [make() if self.rank == 0 else None]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        parts: list = [None] * self.size
        self.dist.all_gather_object(parts, tensor.detach().cpu())
        self.comm_time_s += time.perf_counter() - start
        return torch.cat(parts, dim=-1)


def shard_bounds(num_examples: int, rank: int, size: int) -> tuple[int, int]:
    """[low, high): the contiguous block of the training set that worker ``rank`` of ``size`` holds."""
    return rank * num_examples // size, (rank + 1) * num_examples // size


class Baseline:
    """The non-private baseline's step: ``.grad`` set to the mean gradient of the per-example ``loss_fn``
    over the *global* realised batch (Σ over workers of the summed losses' gradients, over the global
    batch size), the forward under ``precision``'s autocast.

    A pack's (``members`` K: a model of :func:`.packing.pack_models`): the batch is repeated once per
    member (member-major rows, as the DP engine's), so each member's slice gets its own mean gradient,
    in passes of at most ``max_rows`` rows; ``active``, :meth:`retire` and :meth:`keep_members` keep its
    members' flags as :class:`.dp_engine.DPEngine` does (it has no clipping, noise or parts)."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *,
                 workers: Workers, precision: Precision = Precision(), members: int = 1,
                 max_rows: int | None = None) -> None:
        self.model, self.loss_fn, self.workers, self.precision = model, loss_fn, workers, precision
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.members, self.max_rows = members, max_rows
        self.active = torch.ones(members, dtype=torch.bool, device=self.params[0].device)

    def __call__(self, inputs: Inputs, targets: torch.Tensor) -> int:
        """Set every member's mean gradient over this batch; returns the global batch size (0: no step)."""
        grads: list = [None] * len(self.params)
        per_pass = None if self.max_rows is None else max(1, self.max_rows // self.members)
        if batch_len(inputs):
            for x, y in micro_batches(inputs, targets, per_pass):
                if self.members > 1:
                    x, y = repeat_rows(x, self.members), repeat_rows(y, self.members)
                with self.precision.autocast(targets.device):
                    loss = self.loss_fn(model_outputs(self.model, x), y).sum()
                grads = [g if a is None else a if g is None else a + g
                         for a, g in zip(grads, self.precision.backward(loss, self.params))]
        sums = {str(i): torch.zeros_like(p) if g is None else g for i, (p, g) in enumerate(zip(self.params, grads))}
        sums["count"] = torch.tensor([float(len(targets))], device=targets.device, dtype=self.params[0].dtype)
        total = self.workers.sum(sums)
        count = int(round(float(total.pop("count"))))
        if count:
            for i, p in enumerate(self.params):
                p.grad = total[str(i)] / count
        return count

    def retire(self, k: int) -> None:
        """Member ``k`` of a pack stops (the packed optimizer leaves it as it is)."""
        self.active[k] = False

    def keep_members(self, rows: Sequence[int]) -> None:
        """Shrink a pack to its members ``rows`` (after the packed model shrank)."""
        self.active = self.active[torch.tensor(list(rows), dtype=torch.long, device=self.active.device)]
        self.members = len(rows)
