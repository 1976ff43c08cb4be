import os

import pytest
import torch

# Two xdist workers on two cores: one intra-op thread each avoids oversubscription.
torch.set_num_threads(1)
os.environ.setdefault("WIDTHSCOPE_PROGRESS", "0")
for _k, _v in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
               ("TRANSFORMERS_VERBOSITY", "error"), ("TOKENIZERS_PARALLELISM", "false")):
    os.environ.setdefault(_k, _v)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
