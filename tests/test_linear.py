"""Oracles for linearize / ntk / correlation / side-by-side training (float64, tiny nets).

References are explicit: Jacobians, Hessians and third-derivative tensors of a function of the
*flattened* parameter vector, built with torch.autograd.functional.
"""
import math

import pytest
import torch
from torch import nn
from torch.autograd.functional import hessian, jacobian
from torch.func import functional_call

from widthscope import WidthscopeError
from widthscope.linear import (correlation, correlation_summary, function_space_gd, linearize, ntk,
                               train_side_by_side)


def rn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def tiny_mlp(d_in=3, h=4, d_out=2, act=nn.Tanh):
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(d_in, h), act(), nn.Linear(h, h), act(), nn.Linear(h, d_out)).double()


def flat_fn(model):
    """(θ_flat, x) -> model output, plus θ₀ flat: the oracle's parametrisation."""
    names = [k for k, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    theta0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def unflat(t):
        out, i = {}, 0
        for k, s in zip(names, shapes):
            n = math.prod(s)
            out[k] = t[i:i + n].reshape(s)
            i += n
        return out

    def f(t, x):
        return functional_call(model, unflat(t), (x,))
    return f, theta0, unflat


def explicit_jac(model, X):
    f, t0, _ = flat_fn(model)
    return jacobian(lambda t: f(t, X), t0)  # (n, out, P)


# ----------------------------------------------------------------------------- linearize
def test_linearize_equals_taylor_model_and_gradients():
    net = tiny_mlp()
    X = rn(5, 3)
    lin = linearize(net)
    assert torch.allclose(lin(X), net(X), atol=1e-12)
    # move θ off θ₀ and compare with F(θ₀) + J (θ − θ₀)
    with torch.no_grad():
        for p in lin.parameters():
            p.add_(0.3 * torch.randn_like(p))
    delta = torch.cat([(p - p0).reshape(-1) for p, p0 in zip(lin.parameters(), lin.theta0().values())])
    J = explicit_jac(net, X)
    expected = net(X).detach() + torch.einsum("nop,p->no", J, delta)
    got = lin(X)
    assert torch.allclose(got, expected, atol=1e-10)
    assert not torch.allclose(got, net(X), atol=1e-3)  # the test can fail: F ≠ F_lin off θ₀
    # reverse-over-forward gradient of a loss equals Jᵀ ∂L/∂F
    W = torch.randn_like(got)
    (got * W).sum().backward()
    g = torch.cat([p.grad.reshape(-1) for p in lin.parameters()])
    assert torch.allclose(g, torch.einsum("nop,no->p", J, W), atol=1e-10)
    # the original model is untouched and not among the trainable parameters
    assert sum(p.numel() for p in lin.parameters()) == delta.numel()


def test_linearize_handles_buffers_and_frozen_parameters():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 2)).double()
    net.train()
    net(rn(32, 3))  # populate running statistics
    net.eval()
    net[0].bias.requires_grad_(False)
    lin = linearize(net).eval()
    X = rn(4, 3)
    assert torch.allclose(lin(X), net(X), atol=1e-12)
    names = [k for k, _ in lin.named_parameters()]
    assert "0__bias" not in names and len(names) == 5
    assert any("running_mean" in k for k, _ in lin.named_buffers())


def test_fused_attention_is_linearized_through_an_eager_copy():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                   max_position_embeddings=16)
    ids = torch.randint(0, 32, (2, 5))
    torch.manual_seed(0)
    sdpa = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").double()
    # jvp needs eager attention: linearize switches its private copy, not the caller's model.
    lin = linearize(sdpa)
    assert sdpa.config._attn_implementation == "sdpa"
    out = lin(ids)
    assert torch.allclose(out.logits, sdpa(ids).logits, atol=1e-10)
    import copy

    # _from_config writes the implementation into the config object it is given: use a copy.
    eager = transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="eager").double()
    out = linearize(eager)(ids)  # ModelOutput comes back with logits = F(θ₀)
    assert torch.allclose(out.logits, eager(ids).logits, atol=1e-10)
    from widthscope.linear import correlation

    c_sdpa = correlation(sdpa, ids[:1], ids[:1], D=0, d=1)
    assert sdpa.config._attn_implementation == "sdpa"  # restored after the nested jvp
    eager.load_state_dict(sdpa.state_dict())
    assert torch.allclose(c_sdpa, correlation(eager, ids[:1], ids[:1], D=0, d=1), atol=1e-10)


# ----------------------------------------------------------------------------- ntk
@pytest.mark.parametrize("method,chunk", [("jacobian", None), ("jacobian", 2), ("products", None)])
def test_ntk_equals_JJt(method, chunk):
    net = tiny_mlp()
    X1, X2 = rn(5, 3), rn(3, 3)
    J1, J2 = explicit_jac(net, X1), explicit_jac(net, X2)
    K = ntk(net, X1, X2, method=method, chunk_size=chunk)
    assert K.shape == (5, 3, 2, 2)
    assert torch.allclose(K, torch.einsum("iap,jbp->ijab", J1, J2), atol=1e-10)
    Ks = ntk(net, X1, method=method, chunk_size=chunk)
    assert torch.allclose(Ks, torch.einsum("iap,jbp->ijab", J1, J1), atol=1e-10)
    Kt = ntk(net, X1, X2, trace=True, method=method, chunk_size=chunk)
    assert torch.allclose(Kt, torch.einsum("iap,jap->ij", J1, J2) / 2, atol=1e-10)


def test_ntk_auto_falls_back_to_what_fits_when_memory_is_short():
    net = tiny_mlp()
    X = rn(4, 3)
    info: dict = {}
    b = ntk(net, X, method="jacobian")
    ntk(net, X, info=info)  # auto: every method's estimate
    need = {m: c["bytes"] for m, c in info["costs"].items()}
    from widthscope.linear.cost import SAFETY

    small = min(need.values()) / SAFETY  # at most the leanest method fits (others may fit in smaller chunks)
    info = {}
    a = ntk(net, X, memory_budget=small, info=info)
    fits = {m: c for m, c in info["costs"].items() if c["fits"]}
    assert all(c["bytes"] <= SAFETY * small for c in fits.values())
    assert info["method"] == min(fits, key=lambda m: fits[m]["seconds"]) and torch.allclose(a, b, atol=1e-12)
    with pytest.raises(WidthscopeError, match="no method fits memory_budget"):
        ntk(net, X, memory_budget=1)
    with pytest.raises(WidthscopeError, match="method"):
        ntk(net, X, method="nope")


# ----------------------------------------------------------------------------- correlations
def _oracle_tensors(net, x, u):
    f, t0, _ = flat_fn(net)
    F = lambda t: (f(t, x[None]).reshape(-1) * u).sum()  # noqa: E731
    H = hessian(F, t0, vectorize=True)
    T = jacobian(lambda t: hessian(F, t, create_graph=True, vectorize=True), t0, vectorize=True)  # (P,P,P)
    return F, t0, H, T


@pytest.mark.parametrize("output", [1, "random"])
def test_correlations_match_explicit_derivative_tensors(output):
    net = tiny_mlp(h=3)
    X = rn(4, 3)
    eta = 0.7
    u = torch.zeros(2, dtype=torch.float64)
    if output == "random":
        gen = torch.Generator().manual_seed(5)
        u = torch.randn(2, generator=gen, dtype=torch.float64)
        u = u / u.norm()
    else:
        u[output] = 1
    f, t0, _ = flat_fn(net)
    g = [jacobian(lambda t, i=i: (f(t, X[i:i + 1]).reshape(-1) * u).sum(), t0) for i in range(1, 4)]
    F, _, H, T = _oracle_tensors(net, X[0], u)
    gradF = jacobian(F, t0)
    c = lambda D, d: correlation(net, X[0], X[1:1 + d], D=D, d=d, eta=eta, output=output, seed=5)  # noqa: E731
    assert torch.allclose(c(0, 1), eta * gradF @ g[0], atol=1e-10)
    assert torch.allclose(c(0, 2), eta ** 2 / 2 * g[0] @ H @ g[1], atol=1e-10)
    assert torch.allclose(c(0, 3), eta ** 3 / 6 * torch.einsum("abc,a,b,c->", T, g[0], g[1], g[2]), atol=1e-10)
    assert torch.allclose(c(1, 1), eta ** 1.5 * H @ g[0], atol=1e-10)
    assert torch.allclose(c(1, 2), eta ** 2.5 / 2 * torch.einsum("abc,b,c->a", T, g[0], g[1]), atol=1e-10)
    assert c(0, 2).abs() > 1e-6  # non-trivial, so the comparison can fail


def test_correlation_bad_inputs():
    net = tiny_mlp()
    X = rn(4, 3)
    with pytest.raises(WidthscopeError, match="D=2"):
        correlation(net, X[0], X[1:3], D=2, d=2)
    with pytest.raises(WidthscopeError, match="D \\+ d"):
        correlation(net, X[0], X[1:4], D=1, d=4)
    with pytest.raises(WidthscopeError, match="d=2"):
        correlation(net, X[0], X[1:4], D=0, d=2)
    with pytest.raises(WidthscopeError, match="logit index"):
        correlation(net, X[0], X[1:3], D=0, d=2, output=7)


class RandomFeatures(nn.Module):
    """Fixed random tanh features + trainable linear readout: linear in its parameters."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(3, 16), nn.Tanh())
        for p in self.features.parameters():
            p.requires_grad_(False)
        self.readout = nn.Linear(16, 2)

    def forward(self, x):
        return self.readout(self.features(x))


def test_model_linear_in_parameters_has_no_deviation_and_no_higher_correlations():
    torch.manual_seed(0)
    net = RandomFeatures().double()
    X, Y = rn(12, 3), rn(12, 2)
    for D, d in [(0, 2), (0, 3), (1, 1), (1, 2)]:
        c = correlation(net, X[0], X[1:1 + d], D=D, d=d, output="random")
        assert float(c.abs().max()) < 1e-12
    assert float(correlation(net, X[0], X[1:2], D=0, d=1).abs()) > 1e-3  # the NTK itself is not zero
    rows = train_side_by_side(net, (X, Y), steps=20, lr=0.5, test=(X[:6], Y[:6]), log_every=5)
    assert max(r["dev_rms"] for r in rows) < 1e-12
    assert max(r["kernel_drift"] for r in rows) < 1e-12
    assert rows[-1]["param_move"] > 1e-3 and rows[-1]["train_loss"] < rows[0]["train_loss"]


def test_correlation_summary_statistics():
    net = tiny_mlp()
    X = rn(10, 3)
    s = correlation_summary(net, (X, None), D=1, d=1, n_tuples=5, output="random", seed=3)
    v = torch.tensor(s["values"], dtype=torch.float64)
    assert s["n_tuples"] == 5 and "random" in s["output"]
    assert math.isclose(s["mean"], float(v.mean())) and math.isclose(s["rms"], float(v.pow(2).mean().sqrt()))
    assert math.isclose(s["sem"], float(v.std() / math.sqrt(5)))


# ----------------------------------------------------------------------------- training
def test_full_batch_gd_linear_model_equals_function_space_recursion():
    net = tiny_mlp()
    X, Y, Xt = rn(8, 3), rn(8, 2), rn(5, 3)
    steps, lr = 15, 0.4
    fs = function_space_gd(net, X, Y, steps=steps, lr=lr, test=Xt)
    rows, trained, lin = train_side_by_side(net, (X, Y), steps=steps, lr=lr, test=(Xt, torch.zeros(5, 2, dtype=torch.float64)),
                                            return_models=True)
    with torch.no_grad():
        assert torch.allclose(lin(X), fs["train"][-1], atol=1e-10)
        assert torch.allclose(lin(Xt), fs["test"][-1], atol=1e-10)
        assert not torch.allclose(fs["train"][-1], fs["train"][0], atol=1e-3)
    # losses in the rows are the mse convention L = ||F − Y||² / (2N)
    assert math.isclose(rows[-1]["train_loss_lin"], float(0.5 * (fs["train"][-1] - Y).pow(2).sum(1).mean()),
                        rel_tol=1e-9)


def test_side_by_side_metrics_against_direct_computation():
    net = tiny_mlp(act=nn.Tanh)
    X, Y = rn(16, 3), rn(16, 2)
    Xt, Yt = rn(6, 3), rn(6, 2)
    rows, trained, lin = train_side_by_side(net, (X, Y), steps=12, lr=0.3, batch_size=4, test=(Xt, Yt),
                                            log_steps=[0, 5, 12], seed=3, return_models=True,
                                            optimizer="adam")
    assert [r["step"] for r in rows] == [0, 5, 12]
    assert rows[0]["dev_rms"] < 1e-12 and rows[0]["kernel_drift"] == 0
    with torch.no_grad():
        dev = trained(Xt) - lin(Xt)
    last = rows[-1]
    assert math.isclose(last["dev_rms"], float(dev.pow(2).mean().sqrt()), rel_tol=1e-9)
    assert math.isclose(last["dev_rel"], last["dev_rms"] / float(trained(Xt).detach().pow(2).mean().sqrt()), rel_tol=1e-9)
    t0 = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    t = torch.cat([p.reshape(-1) for p in trained.parameters()]).detach()
    assert math.isclose(last["param_move"], float((t - t0).norm() / t0.norm()), rel_tol=1e-9)
    K0, Ks = ntk(net, Xt), ntk(trained, Xt)
    assert math.isclose(last["kernel_drift"], float((Ks - K0).norm() / K0.norm()), rel_tol=1e-9)
    assert last["dev_rms"] > 1e-6  # a nonlinear net deviates
    # same batch order: rerunning with the same seed reproduces the rows exactly
    again = train_side_by_side(net, (X, Y), steps=12, lr=0.3, batch_size=4, test=(Xt, Yt),
                               log_steps=[0, 5, 12], seed=3, optimizer="adam")
    assert again[-1]["dev_rms"] == last["dev_rms"]


def test_nonfinite_loss_names_the_step():
    net = tiny_mlp(act=nn.ReLU)
    X, Y = rn(8, 3) * 10, rn(8, 2)
    with pytest.raises(WidthscopeError, match=r"at step \d+"):
        train_side_by_side(net, (X, Y), steps=200, lr=1e6)
    rows = train_side_by_side(net, (X, Y), steps=200, lr=1e6, on_nonfinite="stop")
    assert rows[-1]["diverged"] and rows[-1]["diverged_at"] < 200
    with pytest.raises(WidthscopeError, match="batch_size"):
        train_side_by_side(net, (X, Y), steps=2, lr=0.1, batch_size=100)
    with pytest.raises(WidthscopeError, match="pair of tensors"):
        train_side_by_side(net, X, steps=2, lr=0.1)


def test_bad_inputs_raise_widthscope_errors_not_torch_errors():
    net = tiny_mlp()                              # 3 inputs, 2 outputs, float64
    X, Y = rn(8, 3), rn(8, 2)
    with pytest.raises(WidthscopeError, match=r"cannot run on inputs of shape \(2, 5\)"):  # the probe rows
        ntk(net, rn(4, 5))
    with pytest.raises(WidthscopeError, match="no inputs"):
        ntk(net, rn(0, 3))
    for eta in (0.0, -0.1, math.nan):             # eta^(D/2+d): a negative eta gives NaN for D=1
        with pytest.raises(WidthscopeError, match="eta must be a positive"):
            correlation(net, X[0], X[1:2], D=1, d=1, eta=eta)
    with pytest.raises(WidthscopeError, match=r"Y has shape \(8, 7\).*2 output"):
        train_side_by_side(net, (X, rn(8, 7)), steps=1, lr=0.1)
    with pytest.raises(WidthscopeError, match=r"class indices must lie in 0..1"):
        train_side_by_side(net, (X, torch.arange(8) % 3), steps=1, lr=0.1, loss="cross_entropy")
    Xn = X.clone()
    Xn[5, 1] = math.nan
    with pytest.raises(WidthscopeError, match=r"data X has NaN/Inf in 1 row\(s\) \(first: \[5\]\)"):
        train_side_by_side(net, (Xn, Y), steps=1, lr=0.1)


def test_float32_data_with_float64_model_and_class_index_targets():
    # data.load gives float32 inputs and int64 labels; a float64 model must accept them, and
    # integer labels under MSE are the documented one-hot targets.
    net = tiny_mlp()
    X, y = rn(8, 3), torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])
    onehot = torch.nn.functional.one_hot(y, 2).double()
    ref = train_side_by_side(net, (X, onehot), steps=3, lr=0.1)
    got = train_side_by_side(net, (X.float(), y), steps=3, lr=0.1)
    X32 = X.float().double()                      # the same rounded inputs, in float64
    ref32 = train_side_by_side(net, (X32, onehot), steps=3, lr=0.1)
    assert got[-1]["train_loss"] == ref32[-1]["train_loss"]
    assert math.isclose(got[-1]["train_loss"], ref[-1]["train_loss"], rel_tol=1e-5)
    assert torch.equal(ntk(net, X.float()), ntk(net, X32))
    assert torch.equal(correlation(net, X.float()[0], X.float()[1:3], D=0, d=2, eta=0.1),
                       correlation(net, X32[0], X32[1:3], D=0, d=2, eta=0.1))
