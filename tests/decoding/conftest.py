"""Tiny models run fastest on one thread (and a shared, busy CPU makes two threads far slower)."""

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
