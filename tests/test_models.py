"""Model families: shapes, insertion points, hand-counted parameters, parametrisation oracles."""
import math

import pytest
import torch

from widthscope.errors import WidthscopeError
from widthscope.models import build, count_parameters, describe
from widthscope.models.resnet import channels_for


# ----------------------------------------------------------------------------------------- MLP

def mlp_count(d, n, k, depth, bias=True):
    b = 1 if bias else 0
    return d * n + b * n + (depth - 1) * (n * n + b * n) + n * k + b * k


@pytest.mark.parametrize("width", [8, 33, 128])
@pytest.mark.parametrize("parametrization", ["standard", "ntk", "mup"])
def test_mlp_builds_forward_backward_points_count(width, parametrization):
    m = build("mlp", width, in_dim=12, out_dim=5, depth=3, parametrization=parametrization)
    x = torch.randn(7, 12)
    out = m(x)
    assert out.shape == (7, 5)
    out.square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
    assert m.widthscope_points == ["blocks.0", "blocks.1", "blocks.2"]
    for p in m.widthscope_points:
        m.get_submodule(p)
    assert count_parameters(m) == mlp_count(12, width, 5, 3)
    assert count_parameters(build("mlp", width, in_dim=12, out_dim=5, depth=2, bias=False)) == \
        mlp_count(12, width, 5, 2, bias=False)
    assert f"width={width}" in describe(m) and f"params={count_parameters(m):,}" in describe(m)


def _oracle_mlp(m, x, param, sigma_w, act):
    """Float64 forward written from the parametrisation table, independent of ScaledLinear."""
    h = x.double()
    layers = [b.linear for b in m.blocks] + [m.head]
    n = layers[0].out_features
    for i, lin in enumerate(layers):
        W, b = lin.weight.double(), lin.bias.double()
        fan_in = W.shape[1]
        if param == "standard":
            mult = 1.0
        elif param == "ntk":
            mult = sigma_w / math.sqrt(fan_in)
        else:
            mult = sigma_w * math.sqrt(n / fan_in) if i == 0 else (1.0 if i < len(layers) - 1 else sigma_w / math.sqrt(fan_in))
        h = h @ W.T * mult + b
        if i < len(layers) - 1:
            h = act(h)
    return h


@pytest.mark.parametrize("parametrization", ["standard", "ntk", "mup"])
@pytest.mark.parametrize("activation", ["relu", "tanh", "erf", "gelu", "sigmoid"])
def test_mlp_forward_matches_float64_oracle(parametrization, activation):
    acts = {"relu": torch.relu, "tanh": torch.tanh, "erf": torch.erf, "sigmoid": torch.sigmoid,
            "gelu": torch.nn.functional.gelu}
    m = build("mlp", 16, in_dim=6, out_dim=3, depth=2, activation=activation, parametrization=parametrization,
              sigma_w=1.7, sigma_b=0.3).double()
    x = torch.randn(9, 6, dtype=torch.float64)
    torch.testing.assert_close(m(x), _oracle_mlp(m, x, parametrization, 1.7, acts[activation]), rtol=1e-12, atol=1e-12)


def test_mlp_init_statistics_follow_the_table():
    n, d, sigma = 512, 256, 1.5
    std = build("mlp", n, in_dim=d, out_dim=4, parametrization="standard", sigma_w=sigma)
    ntk = build("mlp", n, in_dim=d, out_dim=4, parametrization="ntk", sigma_w=sigma)
    mup = build("mlp", n, in_dim=d, out_dim=4, parametrization="mup", sigma_w=sigma)
    # 131k / 262k samples: the sample std is within 1% of the truth with overwhelming probability
    assert std.blocks[0].linear.weight.std().item() == pytest.approx(sigma / math.sqrt(d), rel=0.02)
    assert std.blocks[1].linear.weight.std().item() == pytest.approx(sigma / math.sqrt(n), rel=0.02)
    assert ntk.blocks[1].linear.weight.std().item() == pytest.approx(1.0, rel=0.02)
    assert ntk.blocks[1].linear.multiplier == pytest.approx(sigma / math.sqrt(n))
    assert mup.blocks[0].linear.weight.std().item() == pytest.approx(1 / math.sqrt(n), rel=0.02)
    assert mup.blocks[0].linear.multiplier == pytest.approx(sigma * math.sqrt(n / d))
    assert mup.head.multiplier == pytest.approx(sigma / math.sqrt(n))
    assert torch.all(std.blocks[0].linear.bias == 0)  # sigma_b = 0 default


def test_mlp_output_scale_with_width_ntk_constant_mup_shrinks():
    """At init, NTK/standard outputs are O(1) in width; μP outputs shrink like 1/√n."""
    x = torch.randn(256, 20)

    def out_std(param, n):
        torch.manual_seed(1)
        return build("mlp", n, in_dim=20, out_dim=1, parametrization=param, activation="tanh")(x).std().item()

    r_ntk = out_std("ntk", 4096) / out_std("ntk", 64)
    r_mup = out_std("mup", 4096) / out_std("mup", 64)
    assert 0.5 < r_ntk < 2.0
    assert 1 / 16 < r_mup < 1 / 4  # theory: sqrt(64/4096) = 1/8


def test_mlp_flattens_images_deterministic_and_float64():
    torch.manual_seed(3)
    a = build("mlp", 10, in_dim=2 * 4 * 4, out_dim=3)
    torch.manual_seed(3)
    b = build(**a.widthscope_config)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    img = torch.randn(5, 2, 4, 4)
    assert torch.equal(a(img), a(img.flatten(1)))
    assert a.double()(img.double()).dtype == torch.float64
    with pytest.raises(WidthscopeError, match="in_dim"):
        a(torch.randn(5, 7))


def test_mlp_callable_activation_and_errors():
    m = build("mlp", 8, in_dim=3, out_dim=2, activation=torch.nn.functional.softplus)
    assert m(torch.randn(4, 3)).shape == (4, 2)
    assert "softplus" in m.widthscope_config["activation"]
    with pytest.raises(WidthscopeError, match="relu, tanh, erf, gelu, sigmoid"):
        build("mlp", 8, in_dim=3, out_dim=2, activation="swishy")
    with pytest.raises(WidthscopeError, match="standard, ntk, mup"):
        build("mlp", 8, in_dim=3, out_dim=2, parametrization="sp")
    with pytest.raises(WidthscopeError, match="mlp, resnet20, llama, pythia"):
        build("transformer", 8)
    with pytest.raises(WidthscopeError, match="in_dim"):
        build("mlp", 8, out_dim=2)
    with pytest.raises(WidthscopeError, match="bad option"):
        build("mlp", 8, in_dim=3, out_dim=2, dropout=0.1)
    with pytest.raises(WidthscopeError, match="positive integer"):
        build("mlp", 0, in_dim=3, out_dim=2)


# ----------------------------------------------------------------------------------- ResNet-20

def resnet20_count(k, in_ch, classes, norm="batch"):
    c = channels_for(k)
    nrm = 2 if norm in ("batch", "group", "layer") else 0  # weight + bias per channel

    def conv(ci, co, ks):
        return ci * co * ks * ks + (co if norm == "none" else 0)

    total = conv(in_ch, c[0], 3) + nrm * c[0]
    prev = c[0]
    for s in range(3):
        for b in range(3):
            ci = prev if b == 0 else c[s]
            total += conv(ci, c[s], 3) + nrm * c[s] + conv(c[s], c[s], 3) + nrm * c[s]
            if ci != c[s] or (s > 0 and b == 0):
                total += conv(ci, c[s], 1) + nrm * c[s]
        prev = c[s]
    return total + c[2] * classes + classes


@pytest.mark.parametrize("width,norm", [(0.25, "batch"), (0.5, "group"), (1, "layer"), (0.5, "none")])
def test_resnet20_builds_points_count(width, norm):
    m = build("resnet20", width, num_classes=7, norm=norm, in_channels=1)
    x = torch.randn(2, 1, 32, 32)
    out = m(x)
    assert out.shape == (2, 7)
    out.sum().backward()
    assert len(m.widthscope_points) == 9
    for p in m.widthscope_points:
        m.get_submodule(p)
    assert count_parameters(m) == resnet20_count(width, 1, 7, norm)
    assert describe(m).startswith("resnet20 width=")


def test_resnet20_standard_size_and_channels():
    assert channels_for(1) == (16, 32, 64) and channels_for(0.5) == (8, 16, 32) and channels_for(2) == (32, 64, 128)
    m = build("resnet20", 1)
    # 16/32/64 channels with two projection shortcuts: 272,474 (0.27M as in He et al.)
    assert count_parameters(m) == resnet20_count(1, 3, 10) == 272474
    with pytest.raises(WidthscopeError, match="batch, group, layer, none"):
        build("resnet20", 1, norm="instance")
    with pytest.raises(WidthscopeError, match="in_channels"):
        m(torch.randn(1, 1, 32, 32))


# --------------------------------------------------------------------------------- transformers

def llama_count(N, L, V, h, kv, hd, F):
    return V * N + L * (N * h * hd + 2 * N * kv * hd + h * hd * N + 3 * N * F + 2 * N) + N + N * V


def pythia_count(N, L, V, F):
    layer = 4 * N + (3 * N * N + 3 * N) + (N * N + N) + (N * F + F) + (F * N + N)
    return V * N + L * layer + 2 * N + N * V


@pytest.mark.parametrize("width,heads,kv,hd", [(32, 2, 1, 16), (48, 3, 3, 16), (128, 2, 1, 64), (96, 1, 1, 96)])
def test_llama_sizes_count_points(width, heads, kv, hd):
    m = build("llama", width, depth=2, max_seq_len=32)
    cfg = m.config
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (heads, kv, hd)
    assert cfg.intermediate_size % 32 == 0 and abs(cfg.intermediate_size - 8 * width / 3) <= 16
    assert cfg._attn_implementation == "eager" and not cfg.tie_word_embeddings
    assert count_parameters(m) == llama_count(width, 2, 256, heads, kv, hd, cfg.intermediate_size)
    assert m.widthscope_points == ["model.layers.0", "model.layers.1"]
    for p in m.widthscope_points:
        m.get_submodule(p)
    x = torch.randint(0, 256, (2, 10))
    out = m(x).logits
    assert out.shape == (2, 10, 256)
    out.sum().backward()
    assert not any("bias" in n for n, _ in m.named_parameters())


@pytest.mark.parametrize("width,heads", [(32, 2), (64, 1), (80, 1), (192, 3)])
def test_pythia_sizes_count_points(width, heads):
    m = build("pythia", width, depth=2, max_seq_len=32)
    assert m.config.num_attention_heads == heads and m.config.intermediate_size == 4 * width
    assert m.config.use_parallel_residual and m.config._attn_implementation == "eager"
    assert count_parameters(m) == pythia_count(width, 2, 256, 4 * width)
    assert m.widthscope_points == ["gpt_neox.layers.0", "gpt_neox.layers.1"]
    x = torch.randint(0, 256, (2, 9))
    assert m(x).logits.shape == (2, 9, 256)


def test_pythia_presets_on_meta_device():
    # Published Pythia shapes (byte vocabulary); meta tensors: no memory is allocated.
    from widthscope.models.lm import PYTHIA_PRESETS

    for name in ("70m", "410m", "12b"):
        L, N, H = PYTHIA_PRESETS[name]
        with torch.device("meta"):
            m = build("pythia", preset=name)
        assert (m.config.num_hidden_layers, m.config.hidden_size, m.config.num_attention_heads) == (L, N, H)
        assert count_parameters(m) == pythia_count(N, L, 256, 4 * N)
    with pytest.raises(WidthscopeError, match="70m"):
        build("pythia", preset="7b")
    with pytest.raises(WidthscopeError, match="width 512"):
        build("pythia", 256, preset="70m")


def test_lm_config_rebuilds_same_architecture():
    for fam in ("llama", "pythia"):
        torch.manual_seed(0)
        a = build(fam, 32, depth=1, max_seq_len=16)
        torch.manual_seed(0)
        b = build(**a.widthscope_config)
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_wrong_input_kind_raises_one_clear_error():
    # image/feature data reaching a language model (or token ids reaching an MLP/ResNet) used to
    # surface as torch tracebacks from the embedding lookup or matmul
    torch.manual_seed(0)
    for family in ("llama", "pythia"):
        lm = build(family, 32, depth=1, max_seq_len=16, vocab_size=64).eval()
        ids = torch.randint(0, 64, (2, 8))
        ref = lm(ids).logits
        assert torch.equal(lm(input_ids=ids).logits, ref)      # valid ids: unchanged
        with pytest.raises(WidthscopeError, match="integer token ids"):
            lm(torch.randn(2, 8))
        with pytest.raises(WidthscopeError, match=r"token ids must lie in 0..63 \(vocab_size=64\)"):
            lm(input_ids=torch.full((2, 8), 64))
        rebuilt = build(**lm.widthscope_config)
        with pytest.raises(WidthscopeError, match="integer token ids"):
            rebuilt(torch.randn(2, 8))
    mlp = build("mlp", 8, in_dim=4, out_dim=2)
    with pytest.raises(WidthscopeError, match="mlp expects float features, got torch.int64"):
        mlp(torch.randint(0, 5, (3, 4)))
    net = build("resnet20", 0.25, num_classes=3)
    with pytest.raises(WidthscopeError, match="resnet20 expects float images"):
        net(torch.randint(0, 255, (2, 3, 8, 8), dtype=torch.uint8))
