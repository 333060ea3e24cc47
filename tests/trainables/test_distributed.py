"""Pieces of multi-worker training that need no second process: shards, probes per (step, layer),
and the refusal to resume on another number of workers. (W = 2 against W = 1 on real Ray Train:
tests/platform/test_multi_worker.py.)"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from dptune.trainables.config import TrainConfig
from dptune.trainables.engine.distributed import Workers, shard_bounds
from dptune.trainables.engine.dp_engine import DPEngine
from dptune.trainables.training import Trainer


@pytest.mark.parametrize("n,size", [(1437, 2), (10, 3), (5, 4), (2, 2)])
def test_shards_cover_the_training_set_once(n, size):
    covered = []
    for rank in range(size):
        low, high = shard_bounds(n, rank, size)
        covered += list(range(low, high))
    assert covered == list(range(n))


def test_one_worker_collectives_are_the_identity():
    w, idx, t = Workers(), torch.tensor([0, 3, 9]), {"a": torch.ones(2)}
    assert w.shard(idx, 10) is idx and w.sum(t) is t and (w.size, w.rank) == (1, 0)


def _hutchinson_gradient(micro: int | None, probes: bool) -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    x = torch.randn(10, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.arange(10) % 3
    engine = DPEngine(model, nn.CrossEntropyLoss(reduction="none"), clip_bound=0.1, noise_multiplier=0.0,
                      expected_batch_size=10, norm_estimator="hutchinson", sketch_k=2, max_physical_batch_size=micro,
                      generator=torch.Generator().manual_seed(2),
                      probes=torch.Generator().manual_seed(3) if probes else None)
    engine.private_gradient(x, y)
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_probes_per_step_and_layer_make_hutchinson_independent_of_micro_batches():
    """The same probes for every micro-batch of a step (as for every worker); without a probe
    generator each micro-batch draws its own, and the result moves with the split."""
    whole, split = _hutchinson_gradient(None, probes=True), _hutchinson_gradient(3, probes=True)
    assert torch.allclose(whole, split, rtol=1e-12, atol=1e-15)
    assert not torch.allclose(_hutchinson_gradient(None, probes=False), _hutchinson_gradient(3, probes=False))


class _Pretend(Workers):
    """A W-worker group as far as the checkpoint check is concerned (no collectives are called)."""

    size = 2


def test_a_checkpoint_resumes_only_on_the_workers_that_wrote_it():
    cfg = TrainConfig(dataset="digits", model="mlp", epsilon=2.0, epochs=1, batch_size=100, noise_multiplier=1.0,
                      model_options={"hidden": 8}, device="cpu")
    state = Trainer(cfg).state_dict()
    assert state["workers"] == 1
    with pytest.raises(ValueError, match=r"written on 1 worker\(s\).*not on 2: set resources.workers to 1"):
        Trainer(cfg, workers=_Pretend()).load_state_dict(state)
    Trainer(cfg).load_state_dict(state)  # the same W resumes
