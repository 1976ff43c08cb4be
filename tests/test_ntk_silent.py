"""No silent options in the kernel tools: ridge at finite time (against parameter-space oracles),
refused bad options, stochastic and batch-coupled models, and the functional ``f(params, x)`` API."""
import pytest
import torch
from torch import nn

from widthscope.errors import WidthscopeError
from widthscope.linear import kernel_predict

F64 = torch.float64


def _linear_problem(seed: int, N: int = 7, M: int = 4, o: int = 2, P: int = 30):
    """An explicit linear model f(θ) = f_0 + J θ (θ₀ = 0): its kernel is J Jᵀ."""
    g = torch.Generator().manual_seed(seed)
    J = torch.randn(N * o, P, generator=g, dtype=F64) / P ** 0.5
    Jt = torch.randn(M * o, P, generator=g, dtype=F64) / P ** 0.5
    f0, g0 = torch.randn(N * o, generator=g, dtype=F64), torch.randn(M * o, generator=g, dtype=F64)
    y = torch.randn(N * o, generator=g, dtype=F64)
    K = (J @ J.T).reshape(N, o, N, o).permute(0, 2, 1, 3)
    Kt = (Jt @ J.T).reshape(M, o, N, o).permute(0, 2, 1, 3)
    return J, Jt, f0, g0, y, K, Kt, (N, M, o)


def _predict(K, Kt, y, f0, g0, shape, **kw):
    N, M, o = shape
    return kernel_predict(K, y.reshape(N, o), K_test=Kt, f0_train=f0.reshape(N, o), f0_test=g0.reshape(M, o), **kw)


@pytest.mark.parametrize("seed,ridge", [(0, 0.3), (1, 2.0), (2, 0.0), (3, 1e-3)])
def test_ridge_discrete_gd_equals_weight_space_gd_on_the_regularised_loss(seed, ridge):
    J, Jt, f0, g0, y, K, Kt, shape = _linear_problem(seed)
    N = shape[0]
    lr, steps = 0.7, 25
    theta = torch.zeros(J.shape[1], dtype=F64)
    for _ in range(steps):  # GD on (1/2N)(‖f0 + Jθ − y‖² + λ‖θ‖²)
        theta = theta - (lr / N) * (J.T @ (f0 + J @ theta - y) + ridge * theta)
    got = _predict(K, Kt, y, f0, g0, shape, lr=lr, steps=steps, ridge=ridge)
    assert (got["train"].reshape(-1) - (f0 + J @ theta)).abs().max() < 1e-10
    assert (got["test"].reshape(-1) - (g0 + Jt @ theta)).abs().max() < 1e-10


@pytest.mark.parametrize("seed,ridge,t", [(0, 0.3, 5.0), (1, 2.0, 40.0), (2, 0.05, 0.7), (3, 0.0, 12.0)])
def test_ridge_flow_equals_the_weight_space_flow(seed, ridge, t):
    """dθ/dt = −(η/N)(Jᵀ(f0 + Jθ − y) + λθ), solved exactly by the matrix exponential of the
    augmented linear system in parameter space (no eigendecomposition of the kernel)."""
    J, Jt, f0, g0, y, K, Kt, shape = _linear_problem(seed)
    N, P = shape[0], J.shape[1]
    lr = 0.9
    Mx = torch.zeros(P + 1, P + 1, dtype=F64)
    Mx[:P, :P] = -(lr / N) * (J.T @ J + ridge * torch.eye(P, dtype=F64))
    Mx[:P, P] = -(lr / N) * (J.T @ (f0 - y))
    theta = torch.linalg.matrix_exp(Mx * t)[:P, P]
    got = _predict(K, Kt, y, f0, g0, shape, lr=lr, t=t, ridge=ridge)
    assert (got["train"].reshape(-1) - (f0 + J @ theta)).abs().max() < 1e-10
    assert (got["test"].reshape(-1) - (g0 + Jt @ theta)).abs().max() < 1e-10


def test_ridge_changes_the_finite_time_answer_and_tends_to_kernel_ridge_regression():
    J, Jt, f0, g0, y, K, Kt, shape = _linear_problem(4)
    plain = _predict(K, Kt, y, f0, g0, shape, lr=1.0, t=30.0)
    reg = _predict(K, Kt, y, f0, g0, shape, lr=1.0, t=30.0, ridge=0.5)
    assert (plain["test"] - reg["test"]).abs().max() > 1e-2
    late = _predict(K, Kt, y, f0, g0, shape, lr=1.0, t=1e6, ridge=0.5)
    inf = _predict(K, Kt, y, f0, g0, shape, lr=1.0, t=float("inf"), ridge=0.5)
    gd_inf = _predict(K, Kt, y, f0, g0, shape, lr=1.0, steps=float("inf"), ridge=0.5)
    for k in ("train", "test"):
        assert (late[k] - inf[k]).abs().max() < 1e-9 and (gd_inf[k] - inf[k]).abs().max() < 1e-12


def test_kernel_predict_refuses_bad_options():
    J, Jt, f0, g0, y, K, Kt, shape = _linear_problem(5)
    N, M, o = shape
    Y = y.reshape(N, o)
    for r in (-0.1, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="kernel_predict: ridge must be a finite number >= 0"):
            kernel_predict(K, Y, lr=0.5, t=1.0, ridge=r)
    for s in (-1, 2.5, float("nan")):
        with pytest.raises(WidthscopeError, match="kernel_predict: steps must be a whole number"):
            kernel_predict(K, Y, lr=0.5, steps=s)
    with pytest.raises(WidthscopeError, match="kernel_predict: t must be a number >= 0"):
        kernel_predict(K, Y, lr=0.5, t=-1.0)
    with pytest.raises(WidthscopeError, match=r"lr is too large .*ridge"):
        kernel_predict(K, Y, lr=1e4, steps=float("inf"), ridge=1.0)
