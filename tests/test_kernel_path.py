"""The closed-form (kernel) linear model equals the weight-space linear model, column by column."""
from __future__ import annotations

import math

import pytest
import torch
from widthscope.errors import WidthscopeError
from widthscope.linear import kernel_predict, ntk, train_side_by_side
from widthscope.models import build

COLUMNS = ("train_loss", "train_loss_lin", "test_loss", "test_loss_lin", "test_gap", "dev_rms", "dev_rel",
           "param_move", "param_move_lin", "kernel_drift")


def _setup(parametrization="ntk", frozen=False):
    torch.manual_seed(0)
    net = build("mlp", 24, in_dim=5, out_dim=3, depth=2, parametrization=parametrization,
                activation="tanh").double()
    if frozen:
        next(net.parameters()).requires_grad_(False)
    X, Y = torch.randn(12, 5, dtype=torch.float64), torch.randn(12, 3, dtype=torch.float64)
    Xt, Yt = torch.randn(7, 5, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64)
    return net, (X, Y), (Xt, Yt)


@pytest.mark.parametrize("case", ["ntk", "mup", "frozen"])
def test_kernel_path_equals_weight_space_training(case):
    net, data, test = _setup("mup" if case == "mup" else "ntk", frozen=case == "frozen")
    kw = dict(steps=25, lr=0.7, test=test, log_steps=[0, 1, 7, 25])
    ref = train_side_by_side(net, data, linear="weights", **kw)
    got = train_side_by_side(net, data, linear="kernel", **kw)
    auto = train_side_by_side(net, data, **kw)
    assert [r["linear"] for r in ref] == ["weights"] * 4 and [r["linear"] for r in auto] == ["kernel"] * 4
    assert ref[-1]["dev_rms"] > 1e-4  # the network has left its linearization: the check has teeth
    for a, b in zip(ref, got):
        for k in COLUMNS:
            assert math.isclose(a[k], b[k], rel_tol=1e-8, abs_tol=1e-13), (k, a["step"], a[k], b[k])


def test_kernel_prediction_columns_match_the_linear_model_and_the_closed_form_limit():
    net, (X, Y), (Xt, Yt) = _setup()
    rows = train_side_by_side(net, (X, Y), steps=30, lr=0.5, test=(Xt, Yt), log_steps=[0, 10, 30],
                              linear="weights", kernel_prediction=True)
    for r in rows:  # full-batch GD: the kernel prediction *is* the linear model
        assert math.isclose(r["test_loss_kernel"], r["test_loss_lin"], rel_tol=1e-9)
        assert math.isclose(r["train_loss_kernel"], r["train_loss_lin"], rel_tol=1e-9)
    with torch.no_grad():
        f0, g0 = net(X), net(Xt)
    lim = kernel_predict(ntk(net, X), Y, lr=0.5, t=float("inf"), K_test=ntk(net, Xt, X), f0_train=f0, f0_test=g0)
    assert math.isclose(rows[-1]["test_loss_kernel_inf"], float(0.5 * (lim["test"] - Yt).pow(2).sum(1).mean()),
                        rel_tol=1e-9)
    assert rows[-1]["train_loss_kernel_inf"] < 1e-12  # 36 outputs, 1.2k parameters: it interpolates
    # with Adam on batches the linear model is no longer the kernel GD prediction, and the rows say so
    adam = train_side_by_side(net, (X, Y), steps=30, lr=0.05, test=(Xt, Yt), log_steps=[30], batch_size=4,
                              optimizer="adam", kernel_prediction=True)
    assert adam[0]["linear"] == "weights"
    assert not math.isclose(adam[0]["test_loss_kernel"], adam[0]["test_loss_lin"], rel_tol=1e-3)


def test_kernel_path_reports_divergence_like_the_weight_path():
    net, data, test = _setup()
    with pytest.raises(WidthscopeError, match="linear model diverges"):
        train_side_by_side(net, data, steps=500, lr=500.0, test=test, linear="kernel")
    rows = train_side_by_side(net, data, steps=500, lr=500.0, test=test, linear="kernel", on_nonfinite="stop",
                              log_every=1)
    assert rows[-1]["diverged"] and all(math.isfinite(r["test_loss_lin"]) for r in rows[:-1])


def test_kernel_path_refuses_what_it_cannot_compute_exactly():
    net, data, test = _setup()
    with pytest.raises(WidthscopeError, match="full-batch 'sgd'"):
        train_side_by_side(net, data, steps=2, lr=0.1, linear="kernel", optimizer="adam")
    with pytest.raises(WidthscopeError, match="full-batch 'sgd'"):
        train_side_by_side(net, data, steps=2, lr=0.1, linear="kernel", batch_size=4)
    with pytest.raises(WidthscopeError, match="return_models"):
        train_side_by_side(net, data, steps=2, lr=0.1, linear="kernel", return_models=True)
    with pytest.raises(WidthscopeError, match="linear="):
        train_side_by_side(net, data, steps=2, lr=0.1, linear="closed")
    X, y = data[0], torch.arange(12) % 3
    with pytest.raises(WidthscopeError, match="mse"):
        train_side_by_side(net, (X, y), steps=2, lr=0.1, loss="cross_entropy", kernel_prediction=True)
    # where the closed form is not exact, auto keeps the weight-space model
    assert train_side_by_side(net, data, steps=1, lr=0.1, batch_size=4)[0]["linear"] == "weights"
    assert train_side_by_side(net, data, steps=1, lr=0.1, optimizer="adam")[0]["linear"] == "weights"


def test_sweep_config_refuses_a_closed_form_it_cannot_compute_before_any_cell():
    from widthscope.linearization.config import validate_config

    base = {"widths": [8, 16, 32, 64, 128], "train": {"linear": "kernel"}}
    assert validate_config(base)["train"]["linear"] == "kernel"
    for bad in ({"batch_size": 4}, {"optimizer": "adam"}, {"loss": "cross_entropy"}):
        with pytest.raises(WidthscopeError, match="exact only for full-batch"):
            validate_config({**base, "train": {"linear": "kernel", **bad}})
    with pytest.raises(WidthscopeError, match="train.linear must be"):
        validate_config({**base, "train": {"linear": "closed"}})
