r"""Structured empirical NTK for dense layers: the kernel from Grams, never a Jacobian.

For a layer ``z = m · a Wᵀ + b`` (``nn.Linear``: ``m = 1``; widthscope's ``ScaledLinear``: its
``multiplier``) applied at positions ``t`` (sequences) or once (an MLP), the parameters'
contribution to ``Θ_{oo'}(x, x') = Σ_θ ∂f_o(x)/∂θ · ∂f_{o'}(x')/∂θ`` is

.. math::  m² Σ_{t,s} (δ_{o,t}·δ'_{o',s}) (a_t·a'_s)  +  (Σ_t δ_{o,t})·(Σ_s δ'_{o',s})

with ``δ_o = ∂f_o/∂z`` the back-propagated signal of output component ``o`` and ``a`` the
layer's input: the second term is the bias. Summing over layers gives the NTK. One backward pass
per output component gives every ``δ_o`` at every layer for the whole batch (examples do not
interact in eval mode), so the cost is ``out`` backward passes plus Gram products —
``O(n² · width)`` per layer instead of ``O(n · out · P)`` for Jacobians. The position sum is
:func:`widthscope.probe.intervene.block_gram` (the block-probe Gram: the same identity).

Covered parameters: the weights and biases of ``nn.Linear`` and ``ScaledLinear`` layers that run
once per forward pass. :func:`uncovered` lists what is not; :func:`widthscope.linear.ntk` uses
this path (``method="structured"``, or ``"auto"`` when everything is covered).

Example::

    >>> import torch
    >>> from widthscope.linear.structured import structured_ntk
    >>> from widthscope.linear import ntk
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    >>> x = torch.randn(5, 3, dtype=torch.float64)
    >>> bool(torch.allclose(structured_ntk(net, x), ntk(net, x, method="jacobian")))
    True
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import WidthscopeError

__all__ = ["structured_ntk", "uncovered", "dense_layers", "kernel_predict"]


def _multiplier(m: nn.Module) -> float | None:
    if isinstance(m, nn.Linear):
        return 1.0
    if type(m).__name__ == "ScaledLinear" and hasattr(m, "multiplier"):
        return float(m.multiplier)
    return None


def dense_layers(model: nn.Module) -> list[tuple[str, nn.Module, float]]:
    """(name, module, multiplier) of the dense layers with a trainable weight or bias."""
    out = []
    for name, m in model.named_modules():
        mult = _multiplier(m)
        if mult is None:
            continue
        w, b = getattr(m, "weight", None), getattr(m, "bias", None)
        if (isinstance(w, nn.Parameter) and w.requires_grad) or (isinstance(b, nn.Parameter) and b.requires_grad):
            out.append((name, m, mult))
    return out


def uncovered(model: nn.Module) -> list[str]:
    """Trainable parameters the structured kernel does not cover (empty: it covers the model)."""
    covered = set()
    for _, m, _ in dense_layers(model):
        for p in (getattr(m, "weight", None), getattr(m, "bias", None)):
            if isinstance(p, nn.Parameter):
                covered.add(id(p))
    return [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in covered]


def structured_ntk(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None) -> torch.Tensor:
    """``Θ`` of shape ``(n1, n2, out, out)`` (outputs flattened), float64, for a model whose
    trainable parameters are all dense layers (:func:`uncovered` is empty)."""
    missing = uncovered(model)
    if missing:
        raise WidthscopeError(f"structured NTK: parameters {', '.join(missing[:4])}"
                              f"{' ...' if len(missing) > 4 else ''} are not weights/biases of dense layers; "
                              "use method='jacobian' or 'products'")
    layers = dense_layers(model)
    n1 = x1.shape[0]
    X = x1 if x2 is None else torch.cat([x1, x2])
    store: dict[str, list[Any]] = {}

    def hook(name: str):
        def f(_m: nn.Module, inputs: Any, out: torch.Tensor) -> None:
            if name in store:
                raise WidthscopeError(f"structured NTK: layer {name!r} ran twice in one forward pass (a shared "
                                      "layer); use method='jacobian'")
            store[name] = [inputs[0].detach(), out]
        return f

    handles = [m.register_forward_hook(hook(name)) for name, m, _ in layers]
    try:
        with torch.enable_grad():
            out = model(X)
            out = out if isinstance(out, torch.Tensor) else getattr(out, "logits", out[0])
            out = out.reshape(out.shape[0], -1)
    finally:
        for h in handles:
            h.remove()
    O = out.shape[1]
    zs = [store[name][1] for name, _, _ in layers]
    deltas: list[list[torch.Tensor]] = [[] for _ in layers]  # per layer: O tensors (n, ..., out_l)
    for o in range(O):
        grads = torch.autograd.grad(out[:, o].sum(), zs, retain_graph=o < O - 1, allow_unused=True)
        for li, (g, z) in enumerate(zip(grads, zs)):
            deltas[li].append(torch.zeros_like(z) if g is None else g.detach())
    n2 = X.shape[0] - n1 if x2 is not None else n1
    K = torch.zeros(n1, n2, O, O, dtype=torch.float64, device=X.device)
    from ..probe.intervene import block_gram

    for (name, m, mult), D in zip(layers, deltas):
        a = store[name][0].double()
        d = torch.stack(D).double()  # (O, n, ..., out_l)
        a = a.reshape(a.shape[0], -1, a.shape[-1])  # (n, T, in): Linear acts on the last dim
        d = d.reshape(O, d.shape[1], -1, d.shape[-1])  # (O, n, T, out)
        a1, a2 = a[:n1], (a[n1:] if x2 is not None else a[:n1])
        d1, d2 = d[:, :n1], (d[:, n1:] if x2 is not None else d[:, :n1])
        w_on = isinstance(m.weight, nn.Parameter) and m.weight.requires_grad
        b_on = isinstance(getattr(m, "bias", None), nn.Parameter) and m.bias.requires_grad
        if b_on:
            s1, s2 = d1.sum(2), d2.sum(2)  # (O, n, out): Σ_t δ_t, the bias gradient
            K += torch.einsum("oid,pjd->ijop", s1, s2)
        if not w_on:
            continue
        if a.shape[1] == 1:  # one position (an MLP): (δδ'ᵀ) ⊙ (aa'ᵀ)
            ga = a1[:, 0] @ a2[:, 0].T
            K += (mult ** 2) * torch.einsum("oid,pjd->ijop", d1[:, :, 0], d2[:, :, 0]) * ga[:, :, None, None]
        else:  # positions: Σ_{t,s} (δ_t·δ'_s)(a_t·a'_s), the block-probe Gram
            for o in range(O):
                for p in range(O):
                    K[:, :, o, p] += (mult ** 2) * block_gram(d1[o], a1, d2[p], a2)
    return K


def kernel_predict(K_train: torch.Tensor, y_train: torch.Tensor, *, lr: float,
                   steps: int | float | None = None, t: float | None = None, ridge: float = 0.0,
                   K_test: torch.Tensor | None = None, f0_train: torch.Tensor | None = None,
                   f0_test: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    r"""Closed-form outputs of squared-loss gradient descent with a fixed kernel.

    With ``L = (1/2N) Σ‖f(x_i) − y_i‖²`` and ``A = (η/N) Θ(X, X)`` (the :func:`function_space_gd`
    convention), full-batch GD gives ``f_s − y = (I − A)^s (f_0 − y)`` on the training inputs and
    ``f^t_s = f^t_0 − (η/N) Θ(X_t, X) Σ_{r<s} (I − A)^r (f_0 − y)`` on test inputs. In the
    eigenbasis ``A = V diag(a) Vᵀ`` the sum is ``V diag((1 − (1 − a)^s)/a) Vᵀ`` (``s`` at ``a = 0``).
    Gradient flow for time ``t`` replaces ``(1 − a)^s`` by ``exp(−t a)``; ``steps = inf`` or
    ``t = inf`` is the limit (``f^t_∞ = f^t_0 − Θ_t Θ⁺ (f_0 − y)``, the minimum-norm interpolant);
    with ``ridge > 0`` the kernel ridge solution ``f^t_0 − Θ_t (Θ + ridge I)^{-1} (f_0 − y)``.

    ``K_train``: ``(N, N, o, o)`` or ``(N·o, N·o)``; ``K_test``: ``(M, N, o, o)`` or ``(M·o, N·o)``;
    ``y_train``, ``f0_*``: ``(N, o)`` / ``(M, o)`` (``f0`` default 0). Returns ``{"train", "test"}``.

    Example::

        >>> import torch
        >>> K = torch.eye(3, dtype=torch.float64)[:, :, None, None] * 2.0
        >>> y = torch.ones(3, 1, dtype=torch.float64)
        >>> kernel_predict(K, y, lr=0.5, steps=float("inf"))["train"].flatten().tolist()
        [1.0, 1.0, 1.0]
    """
    import math

    if (steps is None) == (t is None):
        raise WidthscopeError("kernel_predict: give exactly one of steps (discrete GD) or t (gradient flow)")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise WidthscopeError(f"kernel_predict: lr must be positive, got {lr!r}")
    N = y_train.shape[0]
    o = y_train.reshape(N, -1).shape[1]

    def flat(K: torch.Tensor, rows: int) -> torch.Tensor:
        if K.dim() == 4:
            return K.permute(0, 2, 1, 3).reshape(rows * o, N * o).double()
        return K.double()

    Kf = flat(K_train, N)
    y = y_train.reshape(-1).double()
    f0 = torch.zeros_like(y) if f0_train is None else f0_train.reshape(-1).double()
    r0 = f0 - y
    limit = (steps is not None and math.isinf(steps)) or (t is not None and math.isinf(t))
    if limit and ridge > 0:
        coef = torch.linalg.solve(Kf + ridge * torch.eye(len(Kf), dtype=Kf.dtype), r0)  # Θ⁻¹-like weights
        train = f0 - Kf @ coef
    else:
        lam, V = torch.linalg.eigh((Kf + Kf.T) / 2)
        a = (lr / N) * lam.clamp_min(0)
        if limit:
            if steps is not None and bool((a >= 2).any()):
                raise WidthscopeError("kernel_predict: lr is too large for GD to converge (η λ_max / N >= 2)")
            w = torch.where(a > 1e-12 * a.max().clamp_min(1e-300), 1.0 / a.clamp_min(1e-300), torch.zeros_like(a))
            decay = torch.where(a > 1e-12 * a.max().clamp_min(1e-300), torch.zeros_like(a), torch.ones_like(a))
        elif steps is not None:
            s = int(steps)
            decay = (1 - a) ** s
            w = torch.where(a.abs() > 1e-300, (1 - decay) / a.clamp_min(1e-300), torch.full_like(a, float(s)))
        else:
            decay = torch.exp(-float(t) * a)
            w = torch.where(a > 1e-300, (1 - decay) / a.clamp_min(1e-300), torch.full_like(a, float(t)))
        c = V.T @ r0
        train = y + V @ (decay * c)
        coef = (lr / N) * (V @ (w * c))  # f_test = f0_test − Θ_t · coef
    out = {"train": train.reshape(N, o)}
    if K_test is not None:
        M = K_test.shape[0] if K_test.dim() == 4 else K_test.shape[0] // o
        g0 = torch.zeros(M * o, dtype=torch.float64) if f0_test is None else f0_test.reshape(-1).double()
        out["test"] = (g0 - flat(K_test, M) @ coef).reshape(M, o)
    return out
