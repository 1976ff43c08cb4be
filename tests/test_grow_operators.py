"""Growth operators (widthscope.growth.operators): function preservation in float64, what the plain
G_stack copy computes instead, parameter counts, training after growth, optimiser state."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from widthscope.errors import WidthscopeError
from widthscope.growth.operators import optimizer_after, stack_depth, widen, zero_block
from widthscope.models import build


def _llama(width: int = 32, depth: int = 2, heads: int = 2, kv: int = 1, ffn: int | None = None) -> nn.Module:
    torch.manual_seed(0)
    m = build("llama", width, depth=depth, heads=heads, kv_heads=kv, head_dim=16, ffn=ffn, max_seq_len=16)
    with torch.no_grad():  # weights of a trained model's size (HF's init std 0.02 makes every block ~identity)
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3 / p.shape[1] ** 0.5)
            else:
                p.uniform_(0.5, 1.5)
    return m.double().eval()


def _x() -> torch.Tensor:
    return torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(1))


def _logits(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return m(x).logits


def _params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _layer_params(w: int, heads: int, kv: int, hd: int, ffn: int) -> int:
    return w * heads * hd + 2 * w * kv * hd + heads * hd * w + 3 * w * ffn + 2 * w


# ----------------------------------------------------------------------------- depth
def test_stack_zero_is_exact_and_counts_parameters():
    small, x = _llama(), _x()
    g = stack_depth(small, mode="zero")
    assert g.exact and g.model.config.num_hidden_layers == 4
    # the zeroed copies add nothing: identical values up to float64 rounding of the same sums
    torch.testing.assert_close(_logits(g.model, x), _logits(small, x), rtol=0, atol=1e-12)
    per_layer = _layer_params(32, 2, 1, 16, small.config.intermediate_size)
    assert g.new_parameters == 2 * per_layer == _params(g.model) - _params(small)
    assert [f"model.layers.{j}" for j in range(4)] == g.model.widthscope_points
    # small model unchanged (operators work on a copy)
    assert small.config.num_hidden_layers == 2


def test_stack_copy_computes_the_layer_stack_in_order():
    """G_stack's plain copy is not function-preserving; what it computes is the small model's layers
    applied in ``order``: the oracle is a model of that depth built fresh and loaded by hand."""
    small, x = _llama(), _x()
    order = [0, 1, 0, 1]
    g = stack_depth(small, order, mode="copy")
    assert not g.exact
    ref = build("llama", 32, depth=4, heads=2, kv_heads=1, head_dim=16, max_seq_len=16).double().eval()
    sd = {}
    for k, v in small.state_dict().items():
        if k.startswith("model.layers."):
            i, rest = k[len("model.layers.") :].split(".", 1)
            for j, o in enumerate(order):
                if o == int(i):
                    sd[f"model.layers.{j}.{rest}"] = v
        else:
            sd[k] = v
    ref.load_state_dict(sd)
    torch.testing.assert_close(_logits(g.model, x), _logits(ref, x), rtol=0, atol=1e-12)
    # and it is a different function from the small model's (the claim the docs make)
    assert (_logits(g.model, x) - _logits(small, x)).abs().max() > 1e-3


def test_partial_stack_and_bad_orders():
    small, x = _llama(), _x()
    g = stack_depth(small, [0, 1, 1], mode="zero")
    torch.testing.assert_close(_logits(g.model, x), _logits(small, x), rtol=0, atol=1e-12)
    assert g.detail["zeroed"] == [2] and g.sources["model.layers.2.mlp.down_proj.weight"] is None
    assert g.sources["model.layers.2.mlp.up_proj.weight"][0] == "model.layers.1.mlp.up_proj.weight"
    with pytest.raises(WidthscopeError, match="old layer index"):
        stack_depth(small, [0, 2])
    with pytest.raises(WidthscopeError, match="must appear"):
        stack_depth(small, [0, 0])
    with pytest.raises(WidthscopeError, match="zero_block"):
        stack_depth(nn.Sequential(nn.Linear(2, 2)))


def test_zero_block_is_exact():
    small, x = _llama(), _x()
    g = zero_block(small, ["model.layers.0", "model.layers.1"], hidden=48)
    assert g.exact and g.new_parameters == 2 * (2 * 32 * 48 + 32)
    torch.testing.assert_close(_logits(g.model, x), _logits(small, x), rtol=0, atol=1e-12)
    with pytest.raises(WidthscopeError, match="non-empty list"):
        zero_block(small, [])


# ----------------------------------------------------------------------------- width
@pytest.mark.parametrize("heads,kv,width", [(2, 1, 64), (2, 2, 48), (2, 2, 64)])
def test_widen_is_function_preserving(heads, kv, width):
    small, x = _llama(heads=heads, kv=kv), _x()
    ffn = small.config.intermediate_size + 32
    g = widen(small, width, ffn=ffn, seed=3)
    assert g.exact
    c = g.model.config
    assert (c.hidden_size, c.intermediate_size, c.num_attention_heads) == (width, ffn, width // 16)
    assert c.num_attention_heads // c.num_key_value_heads == heads // kv
    expected = 2 * 256 * width + width + 2 * _layer_params(width, width // 16, c.num_key_value_heads, 16, ffn)
    assert _params(g.model) == expected and g.new_parameters == expected - _params(small)
    # HF's RMSNorm computes its mean square in float32 even for float64 inputs: the old and the grown
    # model average different numbers of channels there, so they agree to float32 rounding, not float64
    torch.testing.assert_close(_logits(g.model, x), _logits(small, x), rtol=1e-5, atol=1e-5)


def test_widen_mlp_only_and_twice():
    small, x = _llama(heads=2, kv=2), _x()
    g = widen(small, None, ffn=small.config.intermediate_size * 2)
    torch.testing.assert_close(_logits(g.model, x), _logits(small, x), rtol=0, atol=1e-12)
    g2 = widen(widen(small, 48).model, 64)
    torch.testing.assert_close(_logits(g2.model, x), _logits(small, x), rtol=1e-5, atol=1e-5)
    assert g2.model.widthscope_config["rms_eps_scale"] == pytest.approx(0.5, rel=1e-12)


def test_widen_bad_sizes():
    small = _llama(heads=2, kv=1)
    with pytest.raises(WidthscopeError, match="at least the old 32"):
        widen(small, 16)
    with pytest.raises(WidthscopeError, match="multiple of 32"):
        widen(small, 48)  # query groups of 2 heads of 16: widths in steps of 32
    with pytest.raises(WidthscopeError, match="MLP size"):
        widen(small, 64, ffn=8)


def test_new_zero_maps_get_gradient():
    """Zero writing maps beside random reading maps: the grown units are not dead."""
    small, x = _llama(), _x()
    g = widen(small, 64, ffn=small.config.intermediate_size + 32)
    g.model(x, labels=x).loss.backward()
    layer = g.model.model.layers[0]
    assert layer.mlp.down_proj.weight.grad[:, small.config.intermediate_size :].abs().max() > 0
    assert layer.self_attn.o_proj.weight.grad[32:, :].abs().max() > 0


# ----------------------------------------------------------------------------- training and optimiser state
@pytest.mark.parametrize("op", ["stack_zero", "stack_copy", "zero_block", "widen"])
def test_training_continues_after_growth(op):
    small, x = _llama().float(), _x()
    grow = {
        "stack_zero": lambda m: stack_depth(m, mode="zero"),
        "stack_copy": lambda m: stack_depth(m, mode="copy"),
        "zero_block": lambda m: zero_block(m, ["model.layers.1"]),
        "widen": lambda m: widen(m, 64),
    }[op]
    g = grow(small)
    model = g.model.train()
    opt = optimizer_after(g, small, None, lr=3e-3)
    losses = []
    for _ in range(15):
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 0.05


def test_optimizer_state_keep_and_reset():
    small, x = _llama().float().train(), _x()
    opt = torch.optim.AdamW(small.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        small(x, labels=x).loss.backward()
        opt.step()
    g = widen(small, 64, ffn=small.config.intermediate_size + 32)
    assert not optimizer_after(g, small, opt, lr=1e-3).state  # reset: fresh moments
    kept = optimizer_after(g, small, opt, lr=1e-3, mode="keep")
    old = dict(small.named_parameters())
    for name, p in g.model.named_parameters():
        src, sl = g.sources[name]
        st, st_old = kept.state[p], opt.state[old[src]]
        assert torch.equal(st["exp_avg"][sl], st_old["exp_avg"])  # a copy of the same values
        assert float(st["step"]) == float(st_old["step"])
        rest = st["exp_avg_sq"].clone()
        rest[sl] = 0
        assert not rest.any()
    gz = stack_depth(small, mode="zero")
    kz = optimizer_after(gz, small, opt, lr=1e-3, mode="keep")
    zeroed = dict(gz.model.named_parameters())["model.layers.2.mlp.down_proj.weight"]
    assert zeroed not in kz.state  # a new tensor: AdamW starts it at step 0
    with pytest.raises(WidthscopeError, match="old optimiser"):
        optimizer_after(g, small, None, lr=1e-3, mode="keep")
