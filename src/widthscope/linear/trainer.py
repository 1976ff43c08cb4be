"""Train a network and its linear model side by side, and the frozen-kernel recursion.

Both start from ``θ₀`` with the same optimizer, learning rate and batches. ``linear="weights"`` trains ``F_lin``
by ``jvp``, ``"kernel"`` by the closed-form recursion (full-batch SGD on MSE), ``"auto"`` picks;
``kernel_prediction`` adds the frozen-kernel GD prediction. Columns and maths: docs/linearization.md.

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
from typing import Any, Callable, Iterator, Sequence

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

__all__ = ["train_side_by_side", "function_space_gd"]

LOSSES = ("mse", "cross_entropy")
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def _loss(out: torch.Tensor, y: torch.Tensor, loss: str) -> torch.Tensor:
    """Mean loss of a batch: ``½‖f − y‖²`` per example (``"mse"``) or cross-entropy on class indices."""
    out = out.reshape(out.shape[0], -1)
    if loss == "mse":
        return 0.5 * (out - y.reshape(out.shape).to(out.dtype)).pow(2).sum(-1).mean()
    return torch.nn.functional.cross_entropy(out, y.long())


def _optimizer(name: str | Callable, params, lr: float) -> torch.optim.Optimizer:
    return name(params, lr) if callable(name) else OPTIMIZERS[name](params, lr=lr)


def _flat(ps) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in ps])


def _rows(pair: tuple[torch.Tensor, torch.Tensor], what: str) -> tuple[torch.Tensor, torch.Tensor]:
    X, Y = pair
    if X.shape[0] != Y.shape[0] or X.shape[0] == 0:
        raise WidthscopeError(
            f"train_side_by_side: {what}: X and Y need the same non-zero number of rows "
            f"(got {X.shape[0]} and {Y.shape[0]})"
        )
    return X, Y


def _targets(Y: torch.Tensor, n_out: int, loss: str, dtype: torch.dtype, what: str) -> torch.Tensor:
    """Targets checked against the model's ``n_out`` outputs; class indices become one-hot for MSE."""
    N = Y.shape[0]
    integral = not (Y.is_floating_point() or Y.is_complex())
    if loss == "cross_entropy" and (not integral or Y.dim() != 1):
        raise WidthscopeError(
            f"{what}: loss 'cross_entropy' needs class indices of shape ({N},), got {Y.dtype} of shape {tuple(Y.shape)}"
        )
    if loss == "cross_entropy" or (integral and Y.dim() == 1 and n_out > 1):  # class indices
        if N and (int(Y.min()) < 0 or int(Y.max()) >= n_out):
            raise WidthscopeError(
                f"{what}: class indices must lie in 0..{n_out - 1} (the model has "
                f"{n_out} outputs), got {int(Y.min())}..{int(Y.max())}"
            )
        return Y.long() if loss == "cross_entropy" else torch.nn.functional.one_hot(Y.long(), n_out).to(dtype)
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
    """Train ``model`` (a copy) and ``linearize(model)`` in lockstep on ``data = (X, Y)``; one dict per
    logged step (0, every ``log_every``-th and ``steps``, or ``log_steps``). ``batch_size=None``: full batch;
    ``test``: where the deviation is measured; ``probe``: kernel-drift inputs (first 8 of ``test``);
    ``on_nonfinite="stop"``: a ``diverged`` row ends the run; ``return_models``: ``(rows, net, lin)``."""
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
    X, Y = _rows(data, "data")
    Xt, Yt = _rows(test, "test") if test is not None else (X, Y)
    if batch_size is not None and batch_size > X.shape[0]:
        raise WidthscopeError(f"train_side_by_side: batch_size {batch_size} must be in 1..{X.shape[0]} or None")
    exact = batch_size is None and optimizer == "sgd" and loss == "mse"  # the kernel path is exact
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
    logged = set(log_steps) if log_steps is not None else set(range(0, steps + 1, log_every)) | {steps}
    logged = {s for s in logged if 0 <= s <= steps}
    X, Y, Xt, Yt, probe = _model_tensors(model, X, Y, Xt, Yt, probe, loss)
    if linear == "auto":
        linear = "kernel" if exact and not return_models and not uncovered(model) else "weights"
    run = _Lockstep(model, X, Y, Xt, probe, optimizer, lr, ridge, linear, kernel_prediction, kernel_drift)
    batches = _batches(X.shape[0], batch_size, seed)
    rows: list[dict[str, Any]] = []
    for step in _progress(range(steps + 1), desc="side-by-side", disable=not progress):
        if step in logged:
            rows.append(_row(run, step, X, Y, Xt, Yt, loss, kernel_prediction))
        if step == steps:
            break
        idx = next(batches)
        xb, yb = (X, Y) if idx is None else (X[idx], Y[idx])
        stop = _kernel_divergence(run.closed, step, on_nonfinite) if run.lin is None else None
        stop = stop or _train_step(run, xb, yb, step, loss=loss, lr=lr, on_nonfinite=on_nonfinite)
        if stop is not None:
            rows.append(stop)
            break
    return (rows, run.net, run.lin) if return_models else rows


def _model_tensors(model: nn.Module, X, Y, Xt, Yt, probe, loss: str):
    """Inputs in the parameters' dtype, checked finite; targets shaped for the model and ``loss``."""
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


class _Lockstep:
    """The network copy, its linear model (``lin``, or the closed form ``closed``), ``θ₀`` and the kernel ``K0``
    on ``probe``."""

    def __init__(self, model, X, Y, Xt, probe, optimizer, lr, ridge, linear, kernel_prediction, kernel_drift):
        self.linear = linear
        self.net = copy.deepcopy(model)
        self.net_params = [p for p in self.net.parameters() if p.requires_grad]
        self.theta0 = _flat(self.net_params)
        self.theta0_norm = float(self.theta0.norm()) or 1.0
        self.opt_net = _optimizer(optimizer, self.net_params, lr)
        kernel = linear == "kernel" or kernel_prediction
        self.closed = _KernelGD(model, X, Y, Xt, lr, ridge, kernel_prediction) if kernel else None
        self.lin = linearize(model) if linear == "weights" else None
        self.opt_lin = None if self.lin is None else _optimizer(optimizer, list(self.lin.parameters()), lr)
        self.probe = Xt[: min(8, Xt.shape[0])] if probe is None else probe
        self.K0 = ntk(self.net, self.probe) if kernel_drift else None
        self.K0_norm = float(self.K0.norm()) if self.K0 is not None else float("nan")


def _batches(N: int, batch_size: int | None, seed: int) -> Iterator[torch.Tensor | None]:
    """The batch indices of each step (``None``: full batch), from per-epoch permutations drawn from ``seed``."""
    gen = torch.Generator().manual_seed(int(seed))
    order: list[int] = []
    while True:
        if batch_size is not None and len(order) < batch_size:
            order = order + torch.randperm(N, generator=gen).tolist()
        yield None if batch_size is None else torch.tensor(order[:batch_size])
        order = order[batch_size or 0 :]


def _row(run: _Lockstep, step: int, X, Y, Xt, Yt, loss: str, kernel_prediction: bool) -> dict[str, Any]:
    """The logged row of ``step``: losses of both models, their gap, ``F − F_lin``, parameter move, kernel drift."""
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
    for part, f, g, target in (("train", f_tr, l_tr, Y), ("test", f_te, l_te, Yt)):
        row[f"{part}_loss"] = float(_loss(f, target, loss))
        row[f"{part}_loss_lin"] = float(_loss(g, target, loss))
        row[f"{part}_gap"] = abs(row[f"{part}_loss"] - row[f"{part}_loss_lin"])
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
        for part, target in (("train", Y), ("test", Yt)):
            row[f"{part}_loss_kernel"] = float(_loss(kp[part], target, loss))
            row[f"{part}_loss_kernel_inf"] = float(_loss(kp[part + "_inf"], target, loss))
    if run.K0 is not None:
        row["kernel_drift"] = (
            float((ntk(net, run.probe) - run.K0).norm()) / run.K0_norm if run.K0_norm > 0 else float("nan")
        )
    return row


def _diverged(step: int, which: str, msg: str, on_nonfinite: str) -> dict[str, Any]:
    """Raise ``msg`` (``on_nonfinite="raise"``), or the ``diverged`` row that ends the run."""
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


def _kernel_divergence(closed: _KernelGD | None, step: int, on_nonfinite: str) -> dict[str, Any] | None:
    """The closed-form path's divergence before step ``step + 1`` (:func:`_diverged`); ``None`` while finite."""
    if closed is None or closed.diverge_step is None or step + 1 < closed.diverge_step:
        return None
    msg = (
        f"the linear model diverges (lr·λ_max(Θ₀)/N = {float(closed.a.max()):.3g} > 2; its loss "
        f"passes 1e30 at step {step + 1}); lower the learning rate (or its width exponent alpha)"
    )
    return _diverged(step, "linear model", msg, on_nonfinite)


def _train_step(run: _Lockstep, xb, yb, step: int, *, loss: str, lr: float, on_nonfinite: str) -> dict[str, Any] | None:
    """One optimizer step of the network, then of the weight-space linear model (if any); a non-finite loss
    raises, or returns the ``diverged`` row."""
    for which, m, opt in (("network", run.net, run.opt_net), ("linear model", run.lin, run.opt_lin)):
        if m is None or opt is None:  # no weight-space linear model
            continue
        opt.zero_grad(set_to_none=True)
        L = _loss(model_output(m(xb)), yb, loss)
        if not torch.isfinite(L):
            msg = (
                f"non-finite training loss ({float(L.detach())}) of the {which} at step {step} "
                f"(lr={lr}); lower the learning rate (or its width exponent alpha)"
            )
            return _diverged(step, which, msg, on_nonfinite)
        L.backward()
        opt.step()
    return None


class _KernelGD:
    r"""Full-batch GD on ``(1/2N)Σ‖f − y‖²`` with the frozen kernel ``Θ₀``, in closed form (float64).

    With ``(η/N) Θ₀(X, X) = V diag(a) Vᵀ``, ``c = Vᵀ(f_0 − y)`` and ``w_s = (1 − (1 − a)^s)/a``: train outputs
    ``y + V (1 − a)^s c``, test outputs ``g_0 − (η/N) Θ₀(X_t, X) V (w_s ⊙ c)``, weight move ``(η/N)² Σ λ (w_s c)²``
    squared. ``limit``: also the ``t = ∞`` outputs (``*_inf``, kernel ridge regression with ``ridge``)."""

    def __init__(self, model: nn.Module, X, Y, Xt, lr: float, ridge: float, limit: bool):
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
        # GD diverges iff some a > 2; the step where its loss passes 1e30 is reported like a non-finite loss
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
    """Frozen-kernel recursion ``F_{s+1} = F_s − (η/N) Θ₀(·, X)(F_s − Y)`` of full-batch GD on the MSE loss.

    Returns ``{"train": (steps+1, N, out)}``, and ``"test"`` (the same on ``test`` inputs) when given."""
    N = X.shape[0]
    Xa = X if test is None else torch.cat([X, test])  # training rows first, then the held-out ones
    with torch.no_grad():
        F = model_output(model(Xa)).reshape(Xa.shape[0], -1)
    out = F.shape[1]
    Y = Y.reshape(N, out).to(F.dtype)
    K = ntk(model, Xa, None if test is None else X).permute(0, 2, 1, 3).reshape(-1, N * out)  # Θ₀(X ∪ X_t, X)
    traj = [F]
    for _ in range(steps):
        F = F - lr * (K @ ((F[:N] - Y) / N).reshape(-1)).reshape(F.shape)
        traj.append(F)
    T = torch.stack(traj)
    return {"train": T[:, :N]} if test is None else {"train": T[:, :N], "test": T[:, N:]}
