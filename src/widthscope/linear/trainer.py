"""Train a network and its linear model side by side; frozen-kernel GD in closed form (:func:`kernel_predict`).

Both start from ``θ₀`` with the same optimizer, learning rate and batches; ``F_lin`` trains by ``jvp`` or, for
full-batch SGD on MSE, in closed form. Columns and maths: docs/linearization.md.

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
from ..errors import WidthscopeError, WidthscopeTypeError
from ..probe.collect import logits_of
from ._core import as_param_dtype, first_output, out_tensor, params_and_buffers
from .empirical import ntk
from .model import linearize
from .structured import uncovered

__all__ = ["train_side_by_side", "function_space_gd", "kernel_predict"]

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
        f_tr, f_te = logits_of(net(X)), logits_of(net(Xt))
        if lin is not None:
            l_tr, l_te = logits_of(lin(X)), logits_of(lin(Xt))
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
        L = _loss(logits_of(m(xb)), yb, loss)
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
            self.f0, self.g0 = out_tensor(model(X)).double(), out_tensor(model(Xt)).double()
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
    """Frozen-kernel recursion ``F_{s+1} = F_s − (η/N) Θ₀(·, X)(F_s − Y)`` of full-batch GD on the MSE loss:
    ``{"train": (steps+1, N, out)}``, and ``"test"`` (the same on ``test`` inputs) when given."""
    N = X.shape[0]
    Xa = X if test is None else torch.cat([X, test])  # training rows first, then the held-out ones
    with torch.no_grad():
        F = out_tensor(model(Xa))
    out = F.shape[1]
    Y = Y.reshape(N, out).to(F.dtype)
    K = ntk(model, Xa, None if test is None else X).permute(0, 2, 1, 3).reshape(-1, N * out)  # Θ₀(X ∪ X_t, X)
    traj = [F]
    for _ in range(steps):
        F = F - lr * (K @ ((F[:N] - Y) / N).reshape(-1)).reshape(F.shape)
        traj.append(F)
    T = torch.stack(traj)
    return {"train": T[:, :N]} if test is None else {"train": T[:, :N], "test": T[:, N:]}


def spectral(K: torch.Tensor, r0: torch.Tensor, lr: float, N: int):
    """``(λ, V, a, c)``: ``Θ = V diag(λ) Vᵀ`` (``λ`` clamped at 0), ``a = (η/N) λ``, ``c = Vᵀ r0``."""
    lam, V = torch.linalg.eigh((K + K.T) / 2)
    lam = lam.clamp_min(0)
    return lam, V, (lr / N) * lam, V.T @ r0


def gd_weights(a: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """After ``s`` GD steps: ``decay = (1 − a)^s`` and ``w = Σ_{r<s} (1 − a)^r = (1 − decay)/a``
    (``s`` where ``a = 0``)."""
    decay = (1 - a) ** s
    return decay, torch.where(a.abs() > 1e-300, (1 - decay) / a.clamp_min(1e-300), torch.full_like(a, float(s)))


def _check_args(lr: float, steps, t, ridge: float) -> None:
    """One-line errors for the scalar options (``bool`` is no number here)."""

    def num(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def error(v, text: str) -> WidthscopeError:  # a wrong type is also a TypeError; the wording stays
        return (WidthscopeError if num(v) else WidthscopeTypeError)(f"kernel_predict: {text}, got {_args.describe(v)}")

    if (steps is None) == (t is None):
        raise WidthscopeError("kernel_predict: give exactly one of steps (discrete GD) or t (gradient flow)")
    if not (num(lr) and math.isfinite(lr) and lr > 0):
        raise error(lr, "lr must be a positive finite number")
    if not (num(ridge) and math.isfinite(ridge) and ridge >= 0):
        raise error(
            ridge,
            "ridge must be a finite number >= 0 (an absolute amount added to the kernel's diagonal); "
            "pass ridge=0 for plain gradient descent",
        )
    if steps is not None and not (num(steps) and steps >= 0 and (math.isinf(steps) or float(steps).is_integer())):
        raise error(
            steps, "steps must be a whole number >= 0 or float('inf') (for a fractional time use t=, gradient flow)"
        )
    if t is not None and not (num(t) and t >= 0 and not math.isnan(t)):
        raise error(t, "t must be a number >= 0 or float('inf')")


def kernel_predict(
    K_train: torch.Tensor,
    y_train: torch.Tensor,
    *,
    lr: float,
    steps: int | float | None = None,
    t: float | None = None,
    ridge: float = 0.0,
    K_test: torch.Tensor | None = None,
    f0_train: torch.Tensor | None = None,
    f0_test: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    r"""Outputs of squared-loss GD with a fixed kernel: ``f_s − y = (I − (η/N) Θ)^s (f_0 − y)`` after ``steps``, or
    gradient flow to time ``t`` (``inf``: the limit), with ``ridge`` added to the kernel's diagonal. Kernels
    ``(N, N, o, o)`` / ``(N·o, N·o)``; returns ``{"train", "test"}``. Maths: docs/linearization.md.

    Example::

        >>> import torch
        >>> K = torch.eye(3, dtype=torch.float64)[:, :, None, None] * 2.0
        >>> y = torch.ones(3, 1, dtype=torch.float64)
        >>> kernel_predict(K, y, lr=0.5, steps=float("inf"))["train"].flatten().tolist()
        [1.0, 1.0, 1.0]
        >>> kernel_predict(K, y, lr=0.5, t=float("inf"), ridge=2.0)["train"].flatten().tolist()  # 2/(2+2)
        [0.5, 0.5, 0.5]
    """
    fn = "kernel_predict"
    _args.tensor(fn, "K_train", K_train, ndim=(2, 4), accepts="an (N, N, o, o) or (N·o, N·o) kernel tensor")
    _args.tensor(fn, "y_train", y_train, min_ndim=1, accepts="an (N, o) tensor of targets")
    _args.tensor(
        fn, "K_test", K_test, ndim=(2, 4), optional=True, accepts="an (M, N, o, o) or (M·o, N·o) kernel tensor or None"
    )
    _args.tensor(fn, "f0_train", f0_train, optional=True, accepts="an (N, o) tensor of initial outputs or None")
    _args.tensor(fn, "f0_test", f0_test, optional=True, accepts="an (M, o) tensor of initial outputs or None")
    _check_args(lr, steps, t, ridge)
    N = y_train.shape[0]
    o = y_train.reshape(N, -1).shape[1]

    def flat(K: torch.Tensor, rows: int) -> torch.Tensor:
        return (K.permute(0, 2, 1, 3).reshape(rows * o, N * o) if K.dim() == 4 else K).double()

    if tuple(K_train.shape) not in ((N, N, o, o), (N * o, N * o)):
        raise WidthscopeError(
            f"kernel_predict: K_train has shape {tuple(K_train.shape)}; for y_train of shape "
            f"({N}, {o}) it must be ({N}, {N}, {o}, {o}) or ({N * o}, {N * o})"
        )
    if K_test is not None and not (
        (K_test.dim() == 4 and tuple(K_test.shape[1:]) == (N, o, o))
        or (K_test.dim() == 2 and K_test.shape[1] == N * o and K_test.shape[0] % o == 0)
    ):
        raise WidthscopeError(
            f"kernel_predict: K_test has shape {tuple(K_test.shape)}; it must be (M, {N}, {o}, {o}) or (M·{o}, {N * o})"
        )
    Kf = flat(K_train, N)
    y = y_train.reshape(-1).double()
    f0 = torch.zeros_like(y) if f0_train is None else f0_train.reshape(-1).double()
    r0 = f0 - y
    limit = (steps is not None and math.isinf(steps)) or (t is not None and math.isinf(t))
    if limit and ridge > 0:
        if steps is not None:  # discrete GD on L_λ converges iff (η/N)(λ_max + λ) < 2
            lam_max = float(torch.linalg.eigvalsh((Kf + Kf.T) / 2).max().clamp_min(0))
            if lr / N * (lam_max + ridge) >= 2:
                raise WidthscopeError(
                    "kernel_predict: lr is too large for GD to converge "
                    "(η (λ_max + ridge) / N >= 2); lower lr or use t= (gradient flow)"
                )
        coef = torch.linalg.solve(Kf + ridge * torch.eye(len(Kf), dtype=Kf.dtype), r0)  # Θ⁻¹-like weights
        train = f0 - Kf @ coef
    else:
        _, V, a, c = spectral(Kf, r0, lr, N)
        ar = a + (lr / N) * ridge  # the regularised rates: eigenvalues of B = (η/N)(Θ + λI)
        if limit:
            if steps is not None and bool((a >= 2).any()):
                raise WidthscopeError("kernel_predict: lr is too large for GD to converge (η λ_max / N >= 2)")
            w = torch.where(a > 1e-12 * a.max().clamp_min(1e-300), 1.0 / a.clamp_min(1e-300), torch.zeros_like(a))
            decay = torch.where(a > 1e-12 * a.max().clamp_min(1e-300), torch.zeros_like(a), torch.ones_like(a))
        elif steps is not None:
            decay, w = gd_weights(ar, int(steps))
        else:
            assert t is not None  # _check_args: exactly one of steps and t
            decay = torch.exp(-float(t) * ar)
            w = torch.where(ar > 1e-300, (1 - decay) / ar.clamp_min(1e-300), torch.full_like(ar, float(t)))
        # f − f_0 = −Θ C (f_0 − y); without ridge a·w = 1 − decay, so f = y + V decay c exactly
        train = y + V @ (decay * c) if ridge == 0 else f0 - V @ (a * w * c)
        coef = (lr / N) * (V @ (w * c))  # f_test = f0_test − Θ_t · coef
    out = {"train": train.reshape(N, o)}
    if K_test is not None:
        M = K_test.shape[0] if K_test.dim() == 4 else K_test.shape[0] // o
        g0 = torch.zeros(M * o, dtype=torch.float64) if f0_test is None else f0_test.reshape(-1).double()
        out["test"] = (g0 - flat(K_test, M) @ coef).reshape(M, o)
    return out
