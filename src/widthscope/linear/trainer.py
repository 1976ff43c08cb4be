"""Train a network and its linear model side by side, and the frozen-kernel recursion.

Both start from ``θ₀`` with the same optimizer, learning rate and batches, so every difference is
non-linearity. Each step's row logs losses of both, ``dev_rms``/``dev_rel``/``dev_mse`` (``F − F_lin``
on held-out inputs), ``param_move`` and ``kernel_drift``; ``kernel_prediction=True`` adds the frozen-kernel
GD prediction. ``linear="weights"`` trains ``F_lin`` by ``jvp``, ``"kernel"`` uses the closed-form
recursion (full-batch SGD on MSE), ``"auto"`` picks. Columns and maths: docs/linearization.md.

Example::

    >>> import torch
    >>> from widthscope.linear import train_side_by_side
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    >>> X, Y = torch.randn(16, 4), torch.randn(16, 2)
    >>> rows = train_side_by_side(net, (X, Y), steps=5, lr=0.1)
    >>> sorted(rows[-1])[:3]
    ['dev_mse', 'dev_rel', 'dev_rms']
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from .. import _args
from .._io import progress as _progress
from ..errors import WidthscopeError
from ._core import as_param_dtype, first_output, model_output, params_and_buffers
from .empirical import ntk
from .model import linearize
from .predict import gd_weights, kernel_predict, spectral
from .structured import uncovered

__all__ = ["train_side_by_side", "function_space_gd", "loss_value"]

LOSSES = ("mse", "cross_entropy")
OPTIMIZERS = ("sgd", "adam", "adamw")


def loss_value(out: torch.Tensor, y: torch.Tensor, loss: str) -> torch.Tensor:
    """Mean loss of a batch (see module docstring for the exact convention)."""
    out = out.reshape(out.shape[0], -1)
    if loss == "mse":
        return 0.5 * (out - y.reshape(out.shape).to(out.dtype)).pow(2).sum(-1).mean()
    if loss == "cross_entropy":
        return torch.nn.functional.cross_entropy(out, y.long())
    raise WidthscopeError(f"loss {loss!r}: use one of {', '.join(LOSSES)}")


def _optimizer(name: str | Callable, params, lr: float) -> torch.optim.Optimizer:
    if callable(name):
        return name(params, lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    raise WidthscopeError(
        f"optimizer {name!r}: use one of {', '.join(OPTIMIZERS)} or a callable (params, lr) -> torch.optim.Optimizer"
    )


def _flat(ps) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in ps])


def _check_pair(data: Any, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data)):
        raise WidthscopeError(f"{what} must be a pair of tensors (X, Y)")
    X, Y = data
    if X.shape[0] != Y.shape[0] or X.shape[0] == 0:
        raise WidthscopeError(
            f"{what}: X and Y need the same non-zero number of rows (got {X.shape[0]} and {Y.shape[0]})"
        )
    return X, Y


def _targets(Y: torch.Tensor, n_out: int, loss: str, dtype: torch.dtype, what: str) -> torch.Tensor:
    """Targets checked against the model's ``n_out`` outputs; class indices become one-hot for MSE."""
    N = Y.shape[0]
    integral = not (Y.is_floating_point() or Y.is_complex())
    if loss == "cross_entropy":
        if not integral or Y.dim() != 1:
            raise WidthscopeError(
                f"{what}: loss 'cross_entropy' needs class indices of shape ({N},), "
                f"got {Y.dtype} of shape {tuple(Y.shape)}"
            )
        if N and (int(Y.min()) < 0 or int(Y.max()) >= n_out):
            raise WidthscopeError(
                f"{what}: class indices must lie in 0..{n_out - 1} (the model has "
                f"{n_out} outputs), got {int(Y.min())}..{int(Y.max())}"
            )
        return Y.long()
    if integral and Y.dim() == 1 and n_out > 1:  # class indices: one-hot targets (see docstring)
        if N and (int(Y.min()) < 0 or int(Y.max()) >= n_out):
            raise WidthscopeError(
                f"{what}: class indices must lie in 0..{n_out - 1} (the model has "
                f"{n_out} outputs), got {int(Y.min())}..{int(Y.max())}"
            )
        return torch.nn.functional.one_hot(Y.long(), n_out).to(dtype)
    if Y.numel() != N * n_out:
        raise WidthscopeError(
            f"{what}: Y has shape {tuple(Y.shape)} but the model gives {n_out} "
            f"output(s) per example; pass Y of shape ({N}, {n_out}) "
            "(or class indices)"
        )
    return Y.reshape(N, n_out).to(dtype)


def train_side_by_side(
    model: nn.Module,
    data: tuple[torch.Tensor, torch.Tensor],
    *,
    steps: int,
    lr: float,
    optimizer: str | Callable = "sgd",
    batch_size: int | None = None,
    loss: str = "mse",
    test: tuple[torch.Tensor, torch.Tensor] | None = None,
    probe: torch.Tensor | None = None,
    log_every: int = 1,
    log_steps: Sequence[int] | None = None,
    seed: int = 0,
    on_nonfinite: str = "raise",
    kernel_drift: bool = True,
    return_models: bool = False,
    progress: bool = False,
    linear: str = "auto",
    kernel_prediction: bool = False,
    ridge: float = 0.0,
) -> Any:
    """Train ``model`` (a copy) and ``linearize(model)`` in lockstep; one dict per logged step.

    ``data = (X, Y)``; ``batch_size=None`` is full-batch gradient descent, otherwise batches
    come from a per-epoch permutation drawn from ``seed`` (identical for both models).
    Logged steps: 0, every ``log_every``-th, and ``steps``; or exactly ``log_steps``.
    ``test`` (held-out pair) is where the function deviation is measured (``data`` when
    absent); ``probe`` (inputs) is the kernel-drift probe set, default the first 8 held-out
    inputs. A non-finite loss at step ``s``: ``on_nonfinite="raise"`` raises
    :class:`WidthscopeError` naming ``s``; ``"stop"`` appends a row with ``diverged=True`` and
    ``diverged_at=s`` and stops. ``return_models=True`` returns ``(rows, net, lin)``.
    ``linear`` (``"auto"``, ``"weights"``, ``"kernel"``) and ``kernel_prediction`` (with
    ``ridge`` for its limit) are described in the module docstring.
    """
    fn = "train_side_by_side"
    _args.module(fn, "model", model)
    _args.tensor_pair(fn, "data", data)
    _args.integer(fn, "steps", steps, lo=0)
    _args.number(fn, "lr", lr, 0.0, lo_open=True, accepts="a positive number")
    if not callable(optimizer):
        _args.choice(fn, "optimizer", optimizer, OPTIMIZERS)
    _args.integer(fn, "batch_size", batch_size, lo=1, optional=True)
    _args.choice(fn, "loss", loss, LOSSES)
    _args.tensor_pair(fn, "test", test, optional=True)
    _args.tensor(fn, "probe", probe, min_ndim=1, optional=True, accepts="a batched tensor of inputs or None")
    _args.integer(fn, "log_every", log_every, lo=1)
    _args.int_list(fn, "log_steps", log_steps)
    _args.integer(fn, "seed", seed)
    _args.choice(fn, "on_nonfinite", on_nonfinite, ("raise", "stop"))
    for name, flag in (
        ("kernel_drift", kernel_drift),
        ("return_models", return_models),
        ("progress", progress),
        ("kernel_prediction", kernel_prediction),
    ):
        _args.boolean(fn, name, flag)
    _args.choice(fn, "linear", linear, ("auto", "weights", "kernel"))
    _args.number(fn, "ridge", ridge, 0.0)
    X, Y, Xt, Yt, exact, logged = _checked_args(
        data,
        test,
        steps=steps,
        lr=lr,
        optimizer=optimizer,
        batch_size=batch_size,
        loss=loss,
        log_every=log_every,
        log_steps=log_steps,
        on_nonfinite=on_nonfinite,
        return_models=return_models,
        linear=linear,
        kernel_prediction=kernel_prediction,
        ridge=ridge,
    )
    X, Y, Xt, Yt, probe = _model_tensors(model, X, Y, Xt, Yt, probe, loss)
    if linear == "auto":
        linear = "kernel" if exact and not return_models and not uncovered(model) else "weights"
    run = _start(
        model,
        X,
        Y,
        Xt,
        optimizer=optimizer,
        lr=lr,
        ridge=ridge,
        linear=linear,
        kernel_prediction=kernel_prediction,
        probe=probe,
        kernel_drift=kernel_drift,
    )
    next_batch = _batches(X.shape[0], batch_size, seed)
    rows: list[dict[str, Any]] = []
    for step in _progress(range(steps + 1), desc="side-by-side", disable=not progress):
        if step in logged:
            rows.append(_row(run, step, X, Y, Xt, Yt, loss, kernel_prediction))
        if step == steps:
            break
        idx = next_batch()
        xb, yb = (X, Y) if idx is None else (X[idx], Y[idx])
        if run.lin is None:
            stop = _kernel_divergence(run.closed, step, on_nonfinite)
            if stop is not None:
                rows.append(stop)
                return rows
        stop = _train_step(run, xb, yb, step, loss=loss, lr=lr, on_nonfinite=on_nonfinite)
        if stop is not None:
            rows.append(stop)
            return (rows, run.net, run.lin) if return_models else rows
    return (rows, run.net, run.lin) if return_models else rows


def _checked_args(
    data,
    test,
    *,
    steps: int,
    lr: float,
    optimizer: str | Callable,
    batch_size: int | None,
    loss: str,
    log_every: int,
    log_steps: Sequence[int] | None,
    on_nonfinite: str,
    return_models: bool,
    linear: str,
    kernel_prediction: bool,
    ridge: float,
):
    """Set-up, part 1: every argument checked before any work; ``(X, Y, Xt, Yt, exact, logged)``
    where ``exact`` says the kernel path is exact (full-batch ``sgd`` on ``mse``)."""
    X, Y = _check_pair(data, "train_side_by_side: data")
    Xt, Yt = _check_pair(test, "train_side_by_side: test") if test is not None else (X, Y)
    if loss not in LOSSES:
        raise WidthscopeError(f"train_side_by_side: loss {loss!r}; use one of {', '.join(LOSSES)}")
    if steps < 0 or log_every < 1:
        raise WidthscopeError(
            f"train_side_by_side: need steps >= 0 and log_every >= 1 (got steps={steps}, log_every={log_every})"
        )
    if on_nonfinite not in ("raise", "stop"):
        raise WidthscopeError("train_side_by_side: on_nonfinite must be 'raise' or 'stop'")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise WidthscopeError(f"train_side_by_side: lr must be a positive number (got {lr!r})")
    N = X.shape[0]
    if batch_size is not None and not (1 <= batch_size <= N):
        raise WidthscopeError(f"train_side_by_side: batch_size {batch_size} must be in 1..{N} or None")
    if linear not in ("auto", "weights", "kernel"):
        raise WidthscopeError(f"train_side_by_side: linear={linear!r}; use 'auto', 'weights' or 'kernel'")
    exact = batch_size is None and optimizer == "sgd" and loss == "mse"
    if linear == "kernel" and not exact:
        raise WidthscopeError(
            "train_side_by_side: linear='kernel' is exact only for full-batch 'sgd' on "
            "the 'mse' loss; use linear='weights' for batches, other optimizers or losses"
        )
    if linear == "kernel" and return_models:
        raise WidthscopeError(
            "train_side_by_side: linear='kernel' has no weight-space model to return; "
            "use linear='weights' with return_models=True"
        )
    if kernel_prediction and loss != "mse":
        raise WidthscopeError(
            "train_side_by_side: kernel_prediction needs the 'mse' loss (the closed form "
            "is squared-loss gradient descent)"
        )
    if not (isinstance(ridge, (int, float)) and math.isfinite(ridge) and ridge >= 0):
        raise WidthscopeError(f"train_side_by_side: ridge must be a number >= 0 (got {ridge!r})")
    logged = set(log_steps) if log_steps is not None else set(range(0, steps + 1, log_every)) | {steps}
    logged = {s for s in logged if 0 <= s <= steps}
    return X, Y, Xt, Yt, exact, logged


def _model_tensors(model: nn.Module, X, Y, Xt, Yt, probe, loss: str):
    """Set-up, part 2: inputs in the parameters' dtype, checked finite; targets shaped for the
    model's output width and ``loss``; ``(X, Y, Xt, Yt, probe)``."""
    params, buffers = params_and_buffers(model)
    if not params:
        raise WidthscopeError("train_side_by_side: the model has no trainable parameters")
    X, Xt = as_param_dtype(X, params), as_param_dtype(Xt, params)
    for name, T in (("data X", X), ("data Y", Y), ("test X", Xt), ("test Y", Yt)):
        if T.is_floating_point() and not bool(torch.isfinite(T).all()):
            rows_bad = (~torch.isfinite(T.reshape(T.shape[0], -1))).any(1).nonzero().flatten().tolist()
            raise WidthscopeError(
                f"train_side_by_side: {name} has NaN/Inf in {len(rows_bad)} row(s) "
                f"(first: {rows_bad[:5]}); drop or fix them"
            )
    dtype = next(iter(params.values())).dtype
    n_out = first_output(model, params, buffers, X[:1], "train_side_by_side").shape[1]
    Y = _targets(Y, n_out, loss, dtype, "train_side_by_side: data")
    Yt = _targets(Yt, n_out, loss, dtype, "train_side_by_side: test")
    if probe is not None:
        probe = as_param_dtype(probe, params)
    return X, Y, Xt, Yt, probe


@dataclass
class _Lockstep:
    """What :func:`train_side_by_side` trains and measures: the network copy, its linear model
    (``lin`` in weight space, or ``closed``, the closed-form kernel path), the start ``θ₀`` and
    the kernel-drift reference ``K0`` on ``probe``."""

    linear: str
    net: nn.Module
    net_params: list
    theta0: torch.Tensor
    theta0_norm: float
    opt_net: torch.optim.Optimizer
    closed: Any
    lin: nn.Module | None
    opt_lin: torch.optim.Optimizer | None
    probe: torch.Tensor
    K0: torch.Tensor | None
    K0_norm: float


def _start(
    model: nn.Module,
    X,
    Y,
    Xt,
    *,
    optimizer: str | Callable,
    lr: float,
    ridge: float,
    linear: str,
    kernel_prediction: bool,
    probe,
    kernel_drift: bool,
) -> _Lockstep:
    """Set-up, part 3: the network copy and its optimizer, the weight-space linear model (``linear
    == "weights"``) or the closed-form kernel path, and the kernel at the start on the probe."""
    net = copy.deepcopy(model)
    net_params = [p for p in net.parameters() if p.requires_grad]
    theta0 = _flat(net_params)
    theta0_norm = float(theta0.norm()) or 1.0
    opt_net = _optimizer(optimizer, net_params, lr)
    closed = (
        _KernelGD(model, X, Y, Xt, lr, ridge=ridge, limit=kernel_prediction)
        if linear == "kernel" or kernel_prediction
        else None
    )
    lin = linearize(model) if linear == "weights" else None
    opt_lin = _optimizer(optimizer, list(lin.parameters()), lr) if lin is not None else None
    if probe is None:
        probe = Xt[: min(8, Xt.shape[0])]
    K0 = ntk(net, probe) if kernel_drift else None
    K0_norm = float(K0.norm()) if K0 is not None else float("nan")
    return _Lockstep(linear, net, net_params, theta0, theta0_norm, opt_net, closed, lin, opt_lin, probe, K0, K0_norm)


def _batches(N: int, batch_size: int | None, seed: int) -> Callable[[], torch.Tensor | None]:
    """The batch indices of each step (``None``: full batch), from a per-epoch permutation of
    ``range(N)`` drawn from ``seed``."""
    gen = torch.Generator().manual_seed(int(seed))
    order: list[int] = []

    def next_batch() -> torch.Tensor | None:
        nonlocal order
        if batch_size is None:
            return None
        if len(order) < batch_size:
            order = order + torch.randperm(N, generator=gen).tolist()
        idx, order = order[:batch_size], order[batch_size:]
        return torch.tensor(idx)

    return next_batch


def _row(run: _Lockstep, step: int, X, Y, Xt, Yt, loss: str, kernel_prediction: bool) -> dict[str, Any]:
    """The logged row of ``step``: losses of both models, their gap, the held-out deviation
    ``F − F_lin``, parameter movement and kernel drift."""
    net, lin, closed = run.net, run.lin, run.closed
    with torch.no_grad():
        f_tr, f_te = model_output(net(X)), model_output(net(Xt))
        if lin is not None:
            l_tr, l_te = model_output(lin(X)), model_output(lin(Xt))
    kp = closed.at(step) if closed is not None else None
    if lin is None:
        assert kp is not None  # no weight-space model: the closed form is the linear model
        l_tr, l_te, move_lin = kp["train"], kp["test"], kp["move"]
    row: dict[str, Any] = {"kind": "linearization", "step": step, "linear": run.linear}
    row["train_loss"] = float(loss_value(f_tr, Y, loss))
    row["train_loss_lin"] = float(loss_value(l_tr, Y, loss))
    row["train_gap"] = abs(row["train_loss"] - row["train_loss_lin"])
    row["test_loss"] = float(loss_value(f_te, Yt, loss))
    row["test_loss_lin"] = float(loss_value(l_te, Yt, loss))
    row["test_gap"] = abs(row["test_loss"] - row["test_loss_lin"])
    dev = (f_te - l_te).double()
    row["dev_rms"] = float(dev.pow(2).mean().sqrt())
    row["dev_mse"] = row["dev_rms"] ** 2
    f_rms = float(f_te.double().pow(2).mean().sqrt())
    row["dev_rel"] = row["dev_rms"] / f_rms if f_rms > 0 else float("nan")
    row["param_move"] = float((_flat(run.net_params) - run.theta0).norm()) / run.theta0_norm
    row["param_move_lin"] = (
        float((_flat(lin.parameters()) - run.theta0).norm()) if lin is not None else move_lin
    ) / run.theta0_norm
    if kernel_prediction:
        assert kp is not None  # kernel_prediction runs the closed form
        for part, Yp, key in (("train", Y, "train"), ("test", Yt, "test")):
            row[f"{part}_loss_kernel"] = float(loss_value(kp[key], Yp, loss))
            row[f"{part}_loss_kernel_inf"] = float(loss_value(kp[key + "_inf"], Yp, loss))
    if run.K0 is not None:
        row["kernel_drift"] = (
            float((ntk(net, run.probe) - run.K0).norm()) / run.K0_norm if run.K0_norm > 0 else float("nan")
        )
    return row


def _kernel_divergence(closed: _KernelGD, step: int, on_nonfinite: str) -> dict[str, Any] | None:
    """The divergence check of the closed-form path before step ``step + 1``: raise, or the
    ``diverged`` row (``on_nonfinite="stop"``); ``None`` while it stays finite."""
    if closed.diverge_step is None or step + 1 < closed.diverge_step:
        return None
    msg = (
        f"the linear model diverges (lr·λ_max(Θ₀)/N = {float(closed.a.max()):.3g} > 2; its loss "
        f"passes 1e30 at step {step + 1}); lower the learning rate (or its width exponent alpha)"
    )
    if on_nonfinite == "raise":
        raise WidthscopeError(msg)
    return {
        "kind": "linearization",
        "step": step,
        "diverged": True,
        "diverged_at": step,
        "diverged_model": "linear model",
        "message": msg,
    }


def _train_step(run: _Lockstep, xb, yb, step: int, *, loss: str, lr: float, on_nonfinite: str) -> dict[str, Any] | None:
    """One optimizer step of the network, then of the weight-space linear model (if any), on the
    batch ``(xb, yb)``; a non-finite loss raises, or returns the ``diverged`` row."""
    pairs: list[tuple[str, nn.Module, torch.optim.Optimizer]] = [("network", run.net, run.opt_net)]
    if run.lin is not None:
        assert run.opt_lin is not None  # made with lin
        pairs.append(("linear model", run.lin, run.opt_lin))
    for which, m, opt in pairs:
        opt.zero_grad(set_to_none=True)
        L = loss_value(model_output(m(xb)), yb, loss)
        if not torch.isfinite(L):
            msg = (
                f"non-finite training loss ({float(L.detach())}) of the {which} at step {step} "
                f"(lr={lr}); lower the learning rate (or its width exponent alpha)"
            )
            if on_nonfinite == "raise":
                raise WidthscopeError(msg)
            return {
                "kind": "linearization",
                "step": step,
                "diverged": True,
                "diverged_at": step,
                "diverged_model": which,
                "message": msg,
            }
        L.backward()
        opt.step()
    return None


class _KernelGD:
    r"""Full-batch GD on ``(1/2N)Σ‖f − y‖²`` with the frozen kernel ``Θ₀``, in closed form.

    ``A = (η/N) Θ₀(X, X) = V diag(a) Vᵀ`` and ``c = Vᵀ(f_0 − y)``: after ``s`` steps the training
    outputs are ``y + V (1 − a)^s c``, the test outputs ``g_0 − (η/N) Θ₀(X_t, X) V (w_s ⊙ c)`` with
    ``w_s = (1 − (1 − a)^s)/a`` (``s`` where ``a = 0``), and the linear model's weights moved
    ``θ_s − θ₀ = −(η/N) J(X)ᵀ V (w_s ⊙ c)``, of squared norm ``(η/N)² Σ λ (w_s c)²`` (``λ`` the
    eigenvalues of ``Θ₀(X, X)``). One eigendecomposition serves every step (float64 throughout).
    ``limit=True`` adds the ``t = ∞`` outputs (``*_inf``): gradient flow's limit, the minimum-norm
    kernel interpolant, or kernel ridge regression with ``ridge > 0``.
    """

    def __init__(
        self,
        model: nn.Module,
        X: torch.Tensor,
        Y: torch.Tensor,
        Xt: torch.Tensor,
        lr: float,
        *,
        ridge: float = 0.0,
        limit: bool = False,
    ):
        N, Nt = X.shape[0], Xt.shape[0]
        with torch.no_grad():
            self.f0 = model_output(model(X)).reshape(N, -1).double()
            self.g0 = model_output(model(Xt)).reshape(Nt, -1).double()
        o = self.f0.shape[1]
        K = ntk(model, torch.cat([X, Xt]), X, dtype=torch.float64)  # Θ₀(X ∪ X_t, X), float64 Grams
        K = K.permute(0, 2, 1, 3).reshape((N + Nt) * o, N * o)
        Ktr, Kte = K[: N * o], K[N * o :]
        self.y = Y.reshape(-1).double()
        self.lam, self.V, self.a, self.c = spectral(Ktr, self.f0.reshape(-1) - self.y, lr, N)
        self.KteV = Kte @ self.V
        self.scale, self.shape, self.tshape = lr / N, (N, o), (Nt, o)
        # GD on the linear model diverges iff some a > 2; its loss passes 1e30 (where the weight-space
        # run would overflow) at this step, which the training loop reports like a non-finite loss.
        grow = (1 - self.a).abs().max()
        c_max = float(self.c.abs().max()) or 1.0
        self.diverge_step = math.ceil(math.log(1e15 / c_max) / math.log(float(grow))) if float(grow) > 1 else None
        self.inf: dict[str, torch.Tensor] = {}
        if limit:
            pred = kernel_predict(
                Ktr, Y.reshape(N, o), lr=lr, t=float("inf"), ridge=ridge, K_test=Kte, f0_train=self.f0, f0_test=self.g0
            )
            self.inf = {"train_inf": pred["train"], "test_inf": pred["test"]}

    def at(self, s: int) -> dict[str, Any]:
        if s == 0:  # exactly the network at θ₀
            return {"train": self.f0, "test": self.g0, "move": 0.0, **self.inf}
        decay, w = gd_weights(self.a, s)
        train = (self.y + self.V @ (decay * self.c)).reshape(self.shape)
        test = (self.g0.reshape(-1) - self.scale * (self.KteV @ (w * self.c))).reshape(self.tshape)
        move = self.scale * float((self.lam * (w * self.c) ** 2).sum().clamp_min(0).sqrt())
        return {"train": train, "test": test, "move": move, **self.inf}


def function_space_gd(
    model: nn.Module, X: torch.Tensor, Y: torch.Tensor, *, steps: int, lr: float, test: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Frozen-kernel recursion ``F_{s+1} = F_s − η Θ₀ ∇_F L`` for full-batch GD on the MSE loss.

    With ``L = (1/2N) Σ‖F(x_i) − y_i‖²`` the gradient is ``∇_F L = (F − Y)/N``, so on the training
    inputs ``F_{s+1} = F_s − (η/N) Θ₀(X, X)(F_s − Y)`` and on held-out inputs
    ``F^t_{s+1} = F^t_s − (η/N) Θ₀(X_t, X)(F_s − Y)``. Equal (up to rounding) to the outputs of the
    weight-space linear model trained by full-batch GD. Returns ``{"train": (steps+1, N, out)}``
    and ``"test"`` when ``test`` inputs are given.
    """
    N = X.shape[0]
    with torch.no_grad():
        F = model_output(model(X)).reshape(N, -1).clone()
    out = F.shape[1]
    Y = Y.reshape(N, out).to(F.dtype)
    K = ntk(model, X).permute(0, 2, 1, 3).reshape(N * out, N * out)
    traj = [F.clone()]
    if test is not None:
        Nt = test.shape[0]
        with torch.no_grad():
            Ft = model_output(model(test)).reshape(Nt, out).clone()
        Kt = ntk(model, test, X).permute(0, 2, 1, 3).reshape(Nt * out, N * out)
        traj_t = [Ft.clone()]
    for _ in range(steps):
        r = ((F - Y) / N).reshape(-1)
        if test is not None:
            Ft = Ft - lr * (Kt @ r).reshape(Nt, out)
            traj_t.append(Ft.clone())
        F = F - lr * (K @ r).reshape(N, out)
        traj.append(F.clone())
    res = {"train": torch.stack(traj)}
    if test is not None:
        res["test"] = torch.stack(traj_t)
    return res
