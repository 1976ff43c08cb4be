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


@pytest.fixture
def stop_second_intervention(monkeypatch):
    """A Ctrl-C at the second point's interventions (certify's per-point loop): ``.on()`` installs
    it, ``.off()`` puts the real ``intervene`` back."""
    import importlib
    from types import SimpleNamespace

    iv = importlib.import_module("widthscope.probe.interventions")  # the module (the package binds the function)
    real, calls = iv.intervene, {"n": 0}

    def stop_at_second(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    return SimpleNamespace(on=lambda: monkeypatch.setattr(iv, "intervene", stop_at_second),
                           off=lambda: monkeypatch.setattr(iv, "intervene", real))
