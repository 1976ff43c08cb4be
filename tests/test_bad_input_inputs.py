"""Issue 42, every bad input refused: the data and model inputs a tester found slipping through
(a split flag on a plain file, a broken dataset_dict.json, an unreachable Hub, a tokenizer larger than
the embedding in Python, a compiled or PEFT-wrapped model's task)."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys

import pytest
import torch
from torch import nn

import hf_tiny
import widthscope as ws
from cli_run import one_line
from widthscope.data.objects import task_of
from widthscope.errors import WidthscopeError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny GPT-2 directory (config, weights, tokenizer), the model, its tokenizer and a text file."""
    import transformers as tf

    root = tmp_path_factory.mktemp("inputs")
    hf_tiny.save_model(root / "gpt2", "gpt2")
    (root / "c.txt").write_text("\n\n".join(hf_tiny.corpus(40)))
    model = tf.AutoModelForCausalLM.from_pretrained(root / "gpt2").eval()
    tok = tf.AutoTokenizer.from_pretrained(root / "gpt2")
    return {"root": root, "dir": str(root / "gpt2"), "txt": str(root / "c.txt"), "model": model, "tok": tok}


def _no_loading(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(importlib.import_module("widthscope.checkpoint"), "load", boom)


def test_a_split_flag_on_a_file_without_splits_is_refused_before_the_model_loads(tiny, tmp_path, capsys, monkeypatch):
    _no_loading(monkeypatch)
    out = tmp_path / "r.json"
    base = ["certify", "--model", tiny["dir"], "--out", str(out)]
    one_line([*base, "--data", tiny["txt"], "--train-split", "train"], capsys, "has no splits")
    cap = one_line([*base, "--data", tiny["txt"], "--test-split", "test"], capsys, "drop --test-split")
    assert repr(tiny["txt"]) in cap.err
    one_line(
        [*base, "--train-data", tiny["txt"], "--test-data", tiny["txt"], "--train-split", "train"],
        capsys,
        "--train-data",
    )
    assert not out.exists()
    with pytest.raises(WidthscopeError, match="has no splits.*drop --train-split"):
        ws.load_inputs(ws.InputSpec(model=tiny["dir"], data=tiny["txt"], train_split="train"))


@pytest.mark.parametrize("splits", ["5", "null", '"train"', "[1, 2]"])
def test_a_dataset_dict_json_without_a_list_of_splits_is_one_line(splits, tiny, tmp_path, capsys):
    d = tmp_path / "dd"
    d.mkdir()
    (d / "dataset_dict.json").write_text(f'{{"splits": {splits}}}')
    cap = one_line(
        ["certify", "--model", tiny["dir"], "--data", str(d), "--out", str(tmp_path / "r.json")],
        capsys,
        "is not a valid DatasetDict: 'splits' must be a list of split names",
    )
    assert str(d / "dataset_dict.json") in cap.err


def test_an_unreachable_hub_is_one_line_at_once_not_retries(tiny, tmp_path):
    with socket.socket() as s:  # a local port nothing listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    offline = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    env = {k: v for k, v in os.environ.items() if k not in offline}  # online, as a user is by default
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1")
    out = tmp_path / "r.json"
    argv = ["certify", "--model", tiny["dir"], "--data", "hf:org/name", "--out", str(out)]
    proc = subprocess.run([sys.executable, "-m", "widthscope", *argv], env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Retry" not in proc.stderr, proc.stderr
    assert "hf:org/name" in lines[0] and "cannot be reached" in lines[0], lines[0]
    assert not out.exists()


def test_a_tokenizer_larger_than_the_embedding_is_refused_before_any_forward(tiny):
    import transformers as tf

    small = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=64)).eval()
    small.register_forward_pre_hook(lambda *a: pytest.fail("a forward ran before the refusal"))
    texts = hf_tiny.corpus(8)
    with pytest.raises(
        WidthscopeError,
        match=r"certify\(tokenizer=\.\.\.\): tokenizer .* has \d+ tokens but the "
        r"model's embedding has 50 rows",
    ):
        ws.certify(small, texts[:4], texts[4:], tokenizer=tiny["tok"], seq_len=16, progress=False)


class _LoraModel(nn.Module):
    """PEFT's structure (peft is not installed): ``PeftModel.base_model`` (a tuner) ``.model`` (the
    model), attributes forwarded inward, ``get_base_model()``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *a, **k):
        return self.model(*a, **k)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.model, name)


class _PeftModel(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.base_model = _LoraModel(model)

    def forward(self, *a, **k):
        return self.base_model(*a, **k)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.base_model, name)

    def get_base_model(self):
        return self.base_model.model


def test_a_compiled_or_peft_wrapped_model_has_the_task_of_the_model_it_wraps(tiny, monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "disable", True)  # the wrapper, run eagerly: nothing to compile
    compiled = torch.compile(tiny["model"])
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    peft = _PeftModel(tiny["model"])
    assert task_of(compiled) == task_of(peft) == task_of(torch.compile(peft)) == "causal-lm"
    texts = hf_tiny.corpus(8)
    for wrapped, prefix in ((compiled, "_orig_mod."), (peft, "base_model.model.")):
        res = ws.certify(
            wrapped,
            texts[:4],
            texts[4:],
            tokenizer=tiny["tok"],
            seq_len=16,
            M=[4],
            K=[4],
            draws=10,
            interventions="none",
            progress=False,
        )
        assert res.points[0].point.startswith(prefix)
