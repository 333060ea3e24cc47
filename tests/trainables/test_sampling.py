"""Poisson sampling: batch-size law, independent inclusion, reproducibility, resumability."""
import pytest
import torch

from dptune.trainables import PoissonSampler


def test_batch_sizes_are_binomial():
    N, q, draws = 1000, 0.05, 4000
    sampler = PoissonSampler(N, q, seed=0)
    sizes = torch.tensor([len(sampler.sample()) for _ in range(draws)], dtype=torch.float64)
    mean_sd = (N * q * (1 - q) / draws) ** 0.5
    assert abs(sizes.mean().item() - N * q) < 4 * mean_sd
    assert sizes.var().item() == pytest.approx(N * q * (1 - q), rel=0.12)  # sd of the estimate ≈ 2.3%


def test_every_example_is_included_independently_with_probability_q():
    N, q, draws = 50, 0.2, 4000
    sampler = PoissonSampler(N, q, seed=1)
    hits = torch.zeros(draws, N)
    for t in range(draws):
        hits[t, sampler.sample()] = 1
    freq = hits.mean(0)
    assert (freq - q).abs().max() < 4.5 * (q * (1 - q) / draws) ** 0.5
    pair = (hits[:, 0] * hits[:, 1]).mean().item()
    assert abs(pair - q * q) < 4 * (q * q * (1 - q * q) / draws) ** 0.5


def test_empty_batches_happen_and_are_empty_tensors():
    sampler = PoissonSampler(10, 0.01, seed=0)
    sizes = [len(sampler.sample()) for _ in range(50)]
    assert 0 in sizes


def test_seeded_and_resumable():
    a, b = PoissonSampler(100, 0.1, seed=7), PoissonSampler(100, 0.1, seed=7)
    assert all(torch.equal(a.sample(), b.sample()) for _ in range(5))
    state = a.state_dict()
    expected = [a.sample() for _ in range(3)]
    c = PoissonSampler(100, 0.1, seed=99)
    c.load_state_dict(state)
    assert all(torch.equal(e, c.sample()) for e in expected)


@pytest.mark.parametrize("n,q", [(0, 0.1), (10, 0.0), (10, 1.5)])
def test_bad_arguments(n, q):
    with pytest.raises(ValueError):
        PoissonSampler(n, q)
