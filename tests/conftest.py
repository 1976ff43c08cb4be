import os

import pytest
import torch

# Two xdist workers on two cores: one intra-op thread each avoids oversubscription.
torch.set_num_threads(1)
os.environ.setdefault("WIDTHSCOPE_PROGRESS", "0")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
