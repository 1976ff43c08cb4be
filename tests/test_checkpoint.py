"""Checkpoints: round trips for every family, HF directories, sidecar layouts, refusals."""
import json
import os

import pytest
import torch

from widthscope import checkpoint
from widthscope.errors import WidthscopeError
from widthscope.models import build


def _same_outputs(a, b, x, exact=True):
    a.eval()
    b.eval()
    with torch.no_grad():
        oa, ob = a(x), b(x)
    oa, ob = getattr(oa, "logits", oa), getattr(ob, "logits", ob)
    if exact:
        assert torch.equal(oa, ob)
    else:  # same weights, different attention kernels (sdpa vs eager): rounding differs
        torch.testing.assert_close(oa, ob, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family,width,options,x", [
    ("mlp", 16, dict(in_dim=5, out_dim=3, parametrization="ntk", activation="erf"), torch.randn(4, 5)),
    ("resnet20", 0.25, dict(num_classes=4, norm="batch"), torch.randn(2, 3, 32, 32)),
    ("llama", 32, dict(depth=1, max_seq_len=16), torch.randint(0, 256, (2, 8))),
    ("pythia", 32, dict(depth=1, max_seq_len=16), torch.randint(0, 256, (2, 8))),
])
def test_round_trip_every_family(tmp_path, family, width, options, x):
    m = build(family, width, **options)
    if family == "resnet20":  # give BatchNorm non-trivial running statistics
        m.train()
        m(torch.randn(8, 3, 32, 32) * 3 + 1)
    checkpoint.save(m, tmp_path / "ck", extra={"dataset": "toy", "result": {"test_loss": 1.5}})
    assert sorted(os.listdir(tmp_path / "ck")) == ["config.json", "model.safetensors"]
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert cfg["model"] == m.widthscope_config and cfg["extra"]["dataset"] == "toy"
    loaded = checkpoint.load(tmp_path / "ck")
    assert loaded.widthscope_config == m.widthscope_config and loaded.widthscope_points == m.widthscope_points
    assert loaded.widthscope_extra["result"] == {"test_loss": 1.5}
    assert not loaded.training
    _same_outputs(m, loaded, x)


def test_float64_round_trip_keeps_precision(tmp_path):
    m = build("mlp", 8, in_dim=3, out_dim=2).double()
    checkpoint.save(m, tmp_path / "d")
    loaded = checkpoint.load(tmp_path / "d")
    assert next(loaded.parameters()).dtype == torch.float64
    _same_outputs(m, loaded, torch.randn(5, 3, dtype=torch.float64))


def test_hf_directories_llama_and_gpt_neox(tmp_path):
    for fam, prefix in (("llama", "model.layers"), ("pythia", "gpt_neox.layers")):
        m = build(fam, 32, depth=2, max_seq_len=16)
        d = tmp_path / fam
        m.save_pretrained(d, safe_serialization=True)
        assert (d / "model.safetensors").is_file()
        loaded = checkpoint.load(d)
        assert loaded.widthscope_points == [f"{prefix}.0", f"{prefix}.1"]
        # The checkpoint's attention implementation is kept (reverse-mode probes do not need eager);
        # eager_attention switches where forward-mode AD needs it.
        assert loaded.config._attn_implementation != "eager"
        from widthscope.probe.structure import eager_attention

        assert eager_attention(loaded).config._attn_implementation == "eager"
        _same_outputs(m, loaded, torch.randint(0, 256, (2, 8)))
        rebuilt = build(**loaded.widthscope_config)  # the HF config rebuilds the architecture
        assert rebuilt.state_dict().keys() == loaded.state_dict().keys()


def test_hf_llama_with_tied_embeddings(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    x = torch.randint(0, 64, (2, 6))
    m = LlamaForCausalLM(cfg)
    m.save_pretrained(tmp_path, safe_serialization=True)
    loaded = checkpoint.load(tmp_path)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    _same_outputs(m, loaded, x, exact=False)
    # our own save of a tied model stores the tensor once and restores the alias
    checkpoint.save(loaded, tmp_path / "ours")
    again = checkpoint.load(tmp_path / "ours")
    assert again.lm_head.weight.data_ptr() == again.model.embed_tokens.weight.data_ptr()
    _same_outputs(loaded, again, x, exact=False)  # HF default attention (SDPA) vs our eager rebuild


def test_sidecar_safetensors_and_pt_files(tmp_path):
    m = build("mlp", 8, in_dim=3, out_dim=2)
    checkpoint.save(m, tmp_path)
    loaded = checkpoint.load(tmp_path / "model.safetensors")
    _same_outputs(m, loaded, torch.randn(4, 3))
    torch.save(m.state_dict(), tmp_path / "weights.pt")
    _same_outputs(m, checkpoint.load(tmp_path / "weights.pt"), torch.randn(4, 3))
    torch.save({"state_dict": m.state_dict(), "step": 3}, tmp_path / "wrapped.pth")
    _same_outputs(m, checkpoint.load(tmp_path / "wrapped.pth"), torch.randn(4, 3))


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned_by_torch_load",))


def test_refusals_and_messages(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = build("mlp", 8, in_dim=3, out_dim=2)
    checkpoint.save(m, tmp_path)
    torch.save({"w": _Evil()}, tmp_path / "evil.pt")
    with pytest.raises(WidthscopeError, match="weights_only=True"):
        checkpoint.load(tmp_path / "evil.pt")
    assert not (tmp_path / "pwned_by_torch_load").exists()
    (tmp_path / "garbage.safetensors").write_bytes(b"this is not a checkpoint at all")
    with pytest.raises(WidthscopeError, match="not a readable safetensors"):
        checkpoint.load(tmp_path / "garbage.safetensors")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(WidthscopeError, match="not a checkpoint"):
        checkpoint.load(tmp_path / "notes.txt")
    with pytest.raises(WidthscopeError, match="does not exist"):
        checkpoint.load(tmp_path / "nope")
    other = tmp_path / "other"
    other.mkdir()
    torch.save(build("mlp", 9, in_dim=3, out_dim=2).state_dict(), other / "model.pt")
    with pytest.raises(WidthscopeError, match="no config.json"):
        checkpoint.load(other / "model.pt")
    (other / "config.json").write_text(json.dumps({"widthscope_format": 1, "model": m.widthscope_config}))
    with pytest.raises(WidthscopeError, match=r"shape mismatch .*blocks.0.linear.weight \(9, 3\) vs \(8, 3\)"):
        checkpoint.load(other)
    (other / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(WidthscopeError, match="names no architecture.*--task"):
        checkpoint.load(other)
    (other / "config.json").write_text(json.dumps({"model_type": "no_such_model_type", "architectures": ["X"]}))
    with pytest.raises(WidthscopeError, match="not known to transformers.*trust_remote_code"):
        checkpoint.load(other)
    with pytest.raises(WidthscopeError, match="widthscope_config"):
        checkpoint.save(torch.nn.Linear(2, 2), tmp_path / "x")
    custom = build("mlp", 8, in_dim=3, out_dim=2, activation=torch.nn.functional.softplus)
    with pytest.raises(WidthscopeError, match="custom activation"):
        checkpoint.save(custom, tmp_path / "y")


def test_config_that_does_not_build_names_the_checkpoint(tmp_path):
    m = build("mlp", 8, in_dim=3, out_dim=2)
    checkpoint.save(m, tmp_path / "ck")
    (tmp_path / "ck" / "config.json").write_text(json.dumps({"widthscope_format": 1,
                                                             "model": {"family": "llama"}}))
    with pytest.raises(WidthscopeError, match=r"config.json of .*ck does not describe a buildable model: "
                                              r"llama width"):
        checkpoint.load(tmp_path / "ck")
