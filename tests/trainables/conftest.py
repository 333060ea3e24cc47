"""Shared by the trainables tests."""
import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Small tensors: thread start-up dominates on a shared machine; one torch thread per test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
