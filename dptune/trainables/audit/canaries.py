"""The canaries of a one-run privacy audit (:mod:`.run`): examples each included in the training
set with probability ½, and how the auditor scores them afterwards.

Two kinds, both ordinary examples of the training set, Poisson-sampled, clipped and noised like
every other (so they audit the run's own sampler, engine, estimator, clipping and workers):

- **gradient canaries** (white-box): example i carries the label ``num_classes + i`` of one of the
  *tag* logits that :class:`CanaryHead` appends to the model's outputs. The tag logits are a
  linear layer on a constant input, offset so far below the real logits that no other example's
  gradient reaches them; canary i's gradient is then a large multiple of the i-th tag weight's
  direction (a Dirac canary: Steinke, Nasr & Jagielski, "Privacy auditing with one (1) training
  run", NeurIPS 2023), always clipped, so whenever it is sampled it adds C·e_i to the clipped sum
  and nothing elsewhere. The auditor reads the privatised gradient ĝ_t of the tag weights at
  every step and keeps the tags fixed between steps (they are its instrument, not the model's).
  Canary i's score is Σ_t x_t,i − T·median_t x_t,i with x_t,i = −B·ĝ_t,i (in units of C): its
  contributions summed against its own noise, robust to a noise draw reused across steps.
- **input canaries** (black-box): held-out test examples with a wrong label; a canary's score is
  minus the final model's loss on it.

The training set keeps its size N: as many real training examples as canaries were included
are left out (at random), so q = B/N, T and σ are the trial's own.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

from ...errors import UserError
from ..data.splits import DatasetSplits, take

#: The tag logits start this far below zero: e^-30 ≈ 1e-13 of any other example's softmax.
TAG_OFFSET = 30.0
#: Tag gradients are this many times max(C, 1): far above the rest of a canary's gradient, so
#: every gradient canary is clipped (also at 10·C) and its clipped gradient is ~C along its tag.
TAG_SCALE = 1e4


class CanaryHead(nn.Module):
    """The model's logits followed by ``count`` tag logits, ``scale``·W·1 (W: one weight per tag)."""

    def __init__(self, backbone: nn.Module, count: int, scale: float) -> None:
        super().__init__()
        self.backbone = backbone
        self.scale = float(scale)
        self.tags = nn.Linear(1, count, bias=False)
        self.register_buffer("initial", torch.full((count, 1), -TAG_OFFSET / self.scale))
        self.reset()

    @torch.no_grad()
    def reset(self) -> None:
        """Put the tag weights back where they started (after every optimizer step)."""
        self.tags.weight.copy_(self.initial)

    def forward(self, *args: object, **kwargs: object) -> torch.Tensor:
        out = self.backbone(*args, **kwargs)
        logits = out.logits if hasattr(out, "logits") else out
        tags = self.scale * self.tags(logits.new_ones(logits.shape[0], 1))
        return torch.cat([logits, tags], dim=-1)


class _Examples(Dataset):
    """Some examples of a dataset followed by extra (input, label) pairs (datasets that are not tensors)."""

    def __init__(self, base: Dataset, extra: list[tuple[object, torch.Tensor]]) -> None:
        self.base, self.extra = base, extra

    def __len__(self) -> int:
        return len(self.base) + len(self.extra)

    def __getitem__(self, i: int) -> tuple[object, torch.Tensor]:
        return self.base[i] if i < len(self.base) else self.extra[i - len(self.base)]


@dataclass
class Canaries:
    """Which canaries there are, which were included, and where the included ones sit in the
    audit's training set (``positions[j]``: the row of canary j, or -1)."""

    gradient: int                 # gradient canaries 0 … gradient-1 (tags 0 … gradient-1)
    inputs: int                   # input canaries gradient … gradient+inputs-1
    included: np.ndarray          # [m] bool
    test_rows: np.ndarray         # [m] the test example each canary copies
    labels: np.ndarray            # [m] its label (num_classes + tag, or a wrong class)

    @property
    def count(self) -> int:
        return self.gradient + self.inputs


def plant(data: DatasetSplits, *, gradient: int, inputs: int, seed: int) -> tuple[DatasetSplits, Canaries]:
    """Draw which canaries are included (each with probability ½, from ``seed``) and build the audit's
    training set: the included canaries in place of as many random real examples (N unchanged)."""
    n, test = len(data.train), len(data.test)
    if gradient < 0 or inputs < 0 or gradient + inputs == 0:
        raise UserError(f"canaries: give a positive number of gradient or input canaries; got {gradient}, {inputs}")
    if inputs > test:
        raise UserError(f"canaries: at most {test} input canaries (the test split's size); got {inputs}")
    if gradient + inputs > n:
        raise UserError(f"canaries: at most N = {n} canaries in all; got {gradient + inputs}")
    rng = np.random.default_rng(seed)
    m = gradient + inputs
    included = rng.random(m) < 0.5
    rows = np.concatenate([np.arange(gradient) % test, rng.permutation(test)[:inputs]])
    true = take(data.test, torch.as_tensor(rows[gradient:], dtype=torch.long))[1].numpy()
    wrong = (true + 1 + rng.integers(0, max(data.num_classes - 1, 1), inputs)) % data.num_classes
    labels = np.concatenate([data.num_classes + np.arange(gradient), wrong]).astype(np.int64)
    keep = np.sort(rng.permutation(n)[: n - int(included.sum())])
    chosen = np.flatnonzero(included)
    x, _ = take(data.test, torch.as_tensor(rows[chosen], dtype=torch.long))
    y = torch.as_tensor(labels[chosen])
    if isinstance(data.train, TensorDataset):
        base_x, base_y = data.train.tensors
        train: Dataset = TensorDataset(torch.cat([base_x[keep], x.to(base_x.dtype)]), torch.cat([base_y[keep], y]))
    else:
        items = [({k: v[j] for k, v in x.items()} if isinstance(x, dict) else x[j], y[j]) for j in range(len(y))]
        train = _Examples(Subset(data.train, keep.tolist()), items)
    return replace(data, train=train, validation=None), Canaries(gradient, inputs, included, rows, labels)


def gradient_scores(tag_gradients: torch.Tensor, expected_batch_size: float) -> np.ndarray:
    """Scores of the gradient canaries from the tags' ĝ at every step ([T, m]; see the module docstring)."""
    x = -expected_batch_size * tag_gradients.double()
    return (x.sum(0) - x.shape[0] * x.median(0).values).numpy()


@torch.no_grad()
def input_scores(model: nn.Module, data: DatasetSplits, canaries: Canaries, device: torch.device) -> np.ndarray:
    """Scores of the input canaries: minus the final model's loss on each (its wrong label)."""
    from ..engine.batching import model_outputs, to_device

    rows = torch.as_tensor(canaries.test_rows[canaries.gradient:], dtype=torch.long)
    x, _ = take(data.test, rows)
    y = torch.as_tensor(canaries.labels[canaries.gradient:], device=device)
    model.eval()
    logits = model_outputs(model, to_device(x, device))[:, : data.num_classes]
    model.train()
    return (-nn.functional.cross_entropy(logits, y, reduction="none")).double().cpu().numpy()
