import pytest
import torch

torch.set_num_threads(1)  # timings and scheduling swing wildly otherwise on 2 cores


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
