"""Closed-form predictions of squared-loss gradient descent with a fixed kernel."""

from __future__ import annotations

import math

import torch

from .. import _args
from ..errors import WidthscopeError, WidthscopeTypeError

__all__ = ["kernel_predict", "spectral", "gd_weights"]


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
