r"""The empirical NNGP (last-layer feature) kernel.

For a readout ``f(x) = m · W φ(x) + b`` (the last dense layer the forward pass runs: ``nn.Linear``,
widthscope's ``ScaledLinear`` with multiplier ``m``, transformers' ``Conv1D``) with input features
``φ(x) ∈ ℝ^d``,

.. math::  K_{NNGP}(x, x') = m² φ(x)·φ(x')

the readout *weights'* contribution to the NTK (``Θ_{ab} ⊇ δ_{ab} m² φ·φ'``) and, when the readout
weights are i.i.d. ``N(0, 1)`` (NTK parametrisation), the covariance ``Cov_W[f_a(x), f_a(x')]``
given the features — the empirical NNGP kernel. (For weights of variance ``s²`` multiply by
``s²``; the bias variance is not included.) A readout applied at positions ``t`` (a sequence
model) gives ``(n1, n2, T, T)``: ``m² φ_t(x)·φ_s(x')``. Cost: one forward pass per batch and one
``(n1·T, d) @ (d, n2·T)`` product; no backward pass.

Example::

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    >>> x = torch.randn(4, 3)
    >>> phi = torch.tanh(net[0](x))
    >>> bool(torch.allclose(nngp(net, x), phi @ phi.T))
    True
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import WidthscopeError
from .rules import multiplier

__all__ = ["nngp", "readout"]


def _features(model: nn.Module, x: torch.Tensor, name: str | None) -> tuple[str, torch.Tensor, float]:
    from .structured import _first_input, _out_tensor

    runs: list[tuple[str, torch.Tensor]] = []
    mods = [(n, m) for n, m in model.named_modules() if multiplier(m) is not None and (name is None or n == name)]
    if name is not None and not mods:
        raise WidthscopeError(f"nngp: no dense layer (nn.Linear, ScaledLinear, Conv1D) named {name!r} in the "
                              "model; pass readout=None to use the last one that runs, or a dense layer's name")

    def hook(n):
        def f(_m, args, kwargs, out):
            runs.append((n, _first_input(args, kwargs).detach()))
        return f

    handles = [m.register_forward_hook(hook(n), with_kwargs=True) for n, m in mods]
    try:
        with torch.no_grad():
            _out_tensor(model(x))
    finally:
        for h in handles:
            h.remove()
    if not runs:
        raise WidthscopeError("nngp: no dense layer (nn.Linear, ScaledLinear, Conv1D) ran in the forward pass; "
                              "the NNGP kernel needs a dense readout (pass readout='name' of one)")
    n, a = runs[-1]
    if sum(1 for r in runs if r[0] == n) != 1:
        raise WidthscopeError(f"nngp: the readout {n!r} ran more than once in one forward pass; "
                              "pass readout='name' of a layer that runs once")
    return n, a, multiplier(model.get_submodule(n))


def readout(model: nn.Module, x: torch.Tensor) -> str:
    """Name of the last dense layer the forward pass on ``x`` runs (the NNGP readout)."""
    return _features(model, x, None)[0]


def nngp(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, *, readout: str | None = None,
         dtype: torch.dtype | None = None) -> torch.Tensor:
    """``m² φ(x1)·φ(x2)`` (module docstring): ``(n1, n2)``, or ``(n1, n2, T, T)`` for a readout applied at
    ``T`` positions. ``readout``: a dense layer's name (default: the last one run); ``dtype``: of the result
    (the product runs in the model's dtype)."""
    from .model import as_param_dtype

    if not isinstance(x1, torch.Tensor) or x1.dim() < 1 or x1.shape[0] == 0:
        raise WidthscopeError("nngp: x1 must be a non-empty batched tensor (n1, ...) of inputs")
    if x2 is not None and (not isinstance(x2, torch.Tensor) or x2.shape[1:] != x1.shape[1:] or x2.shape[0] == 0):
        raise WidthscopeError(f"nngp: x2 must be a non-empty tensor shaped like x1 (n2, {tuple(x1.shape[1:])})")
    params = {k: v for k, v in model.named_parameters()}
    x1 = as_param_dtype(x1, params)
    name, a1, m = _features(model, x1, readout)
    a2 = a1 if x2 is None else _features(model, as_param_dtype(x2, params), name)[1]
    d = a1.shape[-1]
    A1, A2 = a1.reshape(a1.shape[0], -1, d), a2.reshape(a2.shape[0], -1, d)
    n1, T = A1.shape[:2]
    n2 = A2.shape[0]
    K = (A1.reshape(n1 * T, d) @ A2.reshape(n2 * T, d).T).view(n1, T, n2, T).permute(0, 2, 1, 3) * (m ** 2)
    K = K[:, :, 0, 0] if T == 1 else K
    return K.contiguous() if dtype is None else K.to(dtype).contiguous()
