"""The structured NTK equals the explicit-Jacobian oracle in float64, and auto picks it."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from widthscope.errors import WidthscopeError
from widthscope.linear import ntk
from widthscope.linear.structured import structured_ntk, uncovered
from widthscope.models import build


def _oracle(model, x1, x2):
    """J(x1) J(x2)ᵀ from explicit per-example Jacobians (torch.func.jacrev), all outputs."""
    from torch.func import functional_call, jacrev, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}

    def f(p, x):
        return functional_call(model, p, (x[None],)).reshape(-1)

    J1 = vmap(jacrev(f), (None, 0))(params, x1)
    J2 = vmap(jacrev(f), (None, 0))(params, x2)
    return sum(torch.einsum("iap,jbp->ijab", J1[k].flatten(2), J2[k].flatten(2)) for k in params)


class SeqNet(nn.Module):
    """Dense layers applied at every position of a sequence, mean-pooled: the position sum."""

    def __init__(self, d=3, h=6, o=2):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(d, h), nn.Linear(h, h, bias=False), nn.Linear(h, o)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x))))).mean(1)


@pytest.mark.parametrize("kind", ["mlp", "widthscope-ntk", "widthscope-mup", "sequence", "frozen"])
def test_structured_equals_explicit_jacobians(kind):
    torch.manual_seed(0)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3)).double()
        x1, x2 = torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    elif kind.startswith("widthscope"):
        model = build("mlp", 16, in_dim=4, out_dim=3, depth=2, parametrization=kind.split("-")[1],
                      activation="tanh").double()
        x1, x2 = torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    elif kind == "sequence":
        model = SeqNet().double()
        x1, x2 = torch.randn(4, 5, 3, dtype=torch.float64), torch.randn(3, 5, 3, dtype=torch.float64)
    else:
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()
        model[0].bias.requires_grad_(False)  # a frozen parameter is a constant of the kernel
        x1, x2 = torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    want = _oracle(model, x1, x2) if kind != "frozen" else None
    if kind == "frozen":
        want = ntk(model, x1, x2, method="jacobian")
    got = structured_ntk(model, x1, x2)
    assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    info = {}
    K = ntk(model, x1, x2, info=info)
    assert info["method"] == "structured" and torch.allclose(K, want, rtol=1e-10, atol=1e-12)
    assert torch.allclose(ntk(model, x1, trace=True), torch.diagonal(_oracle(model, x1, x1) if kind != "frozen"
                                                                      else ntk(model, x1, method="jacobian"),
                                                                      dim1=2, dim2=3).mean(-1))


def test_auto_falls_back_when_a_parameter_is_not_covered():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 6), nn.LayerNorm(6), nn.Linear(6, 2)).double()
    assert uncovered(model) == ["1.weight", "1.bias"]
    x = torch.randn(4, 3, dtype=torch.float64)
    info = {}
    K = ntk(model, x, info=info)
    assert info["method"] == "jacobian" and torch.allclose(K, _oracle(model, x, x))
    with pytest.raises(WidthscopeError, match="not weights/biases of dense layers"):
        structured_ntk(model, x)


def test_kernel_predictions_equal_the_function_space_recursion():
    from widthscope.linear import function_space_gd
    from widthscope.linear.structured import kernel_predict

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 32), nn.Tanh(), nn.Linear(32, 2)).double()
    X, Xt = torch.randn(12, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    Y = torch.randn(12, 2, dtype=torch.float64)
    lr, steps = 0.5, 40
    rec = function_space_gd(net, X, Y, steps=steps, lr=lr, test=Xt)
    with torch.no_grad():
        f0, g0 = net(X), net(Xt)
    K, Kt = ntk(net, X), ntk(net, Xt, X)
    got = kernel_predict(K, Y, lr=lr, steps=steps, K_test=Kt, f0_train=f0, f0_test=g0)
    assert torch.allclose(got["train"], rec["train"][-1], atol=1e-10)
    assert torch.allclose(got["test"], rec["test"][-1], atol=1e-10)
    # many steps: the recursion and the closed form still agree; the limit is the interpolant
    far = function_space_gd(net, X, Y, steps=3000, lr=lr, test=Xt)
    at = kernel_predict(K, Y, lr=lr, steps=3000, K_test=Kt, f0_train=f0, f0_test=g0)
    assert torch.allclose(at["test"], far["test"][-1], atol=1e-8)
    lim = kernel_predict(K, Y, lr=lr, steps=float("inf"), K_test=Kt, f0_train=f0, f0_test=g0)
    assert torch.allclose(lim["train"], Y, atol=1e-6)  # 12·2 = 24 outputs, full-rank kernel: interpolates
    Kf = K.permute(0, 2, 1, 3).reshape(24, 24)
    Ktf = Kt.permute(0, 2, 1, 3).reshape(10, 24)
    exact = g0.reshape(-1) - Ktf @ torch.linalg.solve(Kf, (f0 - Y).reshape(-1))
    assert torch.allclose(lim["test"].reshape(-1), exact, rtol=1e-6, atol=1e-6)
    # the recursion moves toward the limit as the steps grow
    assert (at["test"] - lim["test"]).norm() < (got["test"] - lim["test"]).norm()
    flow = kernel_predict(K, Y, lr=lr, t=1e9, K_test=Kt, f0_train=f0, f0_test=g0)
    assert torch.allclose(flow["test"], lim["test"], atol=1e-6)
    ridge = kernel_predict(K, Y, lr=lr, steps=float("inf"), ridge=1e-9, K_test=Kt, f0_train=f0, f0_test=g0)
    assert torch.allclose(ridge["test"], lim["test"], atol=1e-4)
    big = kernel_predict(K, Y, lr=lr, steps=float("inf"), ridge=10.0, K_test=Kt, f0_train=f0, f0_test=g0)
    want = g0.reshape(-1) - Kt.permute(0, 2, 1, 3).reshape(10, 24) @ torch.linalg.solve(
        Kf + 10.0 * torch.eye(24, dtype=torch.float64), (f0 - Y).reshape(-1))
    assert torch.allclose(big["test"].reshape(-1), want)
    with pytest.raises(WidthscopeError, match="exactly one"):
        kernel_predict(K, Y, lr=lr)
