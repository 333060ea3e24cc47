"""Poisson sampling of logical batches, as the accountant assumes.

Each of the N examples joins a batch independently with probability q = B/N, so batch sizes are
Binomial(N, q): empty and oversized batches are normal and must be processed as they come.
"""
from __future__ import annotations

import torch



from ..errors import UserError
class PoissonSampler:
    """Draws index tensors of Poisson-sampled batches from a seeded generator.

    ``state_dict``/``load_state_dict`` save and restore the generator so a resumed run draws the
    same batches as an uninterrupted one.
    """

    def __init__(self, num_examples: int, sample_rate: float, *, seed: int = 0) -> None:
        if num_examples < 1:
            raise UserError(f"num_examples must be >= 1; got {num_examples}")
        if not 0.0 < sample_rate <= 1.0:
            raise UserError(f"sample_rate must be in (0, 1]; got {sample_rate}")
        self.num_examples = num_examples
        self.sample_rate = sample_rate
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self) -> torch.Tensor:
        """Indices of one batch (sorted, possibly empty)."""
        mask = torch.rand(self.num_examples, generator=self.generator) < self.sample_rate
        return mask.nonzero(as_tuple=True)[0]

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
