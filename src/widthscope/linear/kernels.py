r"""The empirical NNGP (last-layer feature) kernel ``K(x, x') = m² φ(x)·φ(x')``.

``φ`` is the input of the last dense readout run (``m`` its multiplier); for a function ``f(params, x)`` the
kernel is the readout parameter's NTK, checked to be a readout applied once. Maths: docs/linearization.md.

Example::

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    >>> x = torch.randn(4, 3)
    >>> phi = torch.tanh(net[0](x))
    >>> bool(torch.allclose(nngp(net, x), phi @ phi.T))
    True
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from .. import _args
from ..errors import WidthscopeError
from . import checks
from ._core import as_param_dtype, flat_out, out_tensor, params_and_buffers
from .checks import FunctionModel, as_module, batchnorm_coupling, check_stochastic
from .empirical import ntk
from .rules import multiplier
from .structured import first_input

__all__ = ["nngp"]


def _features(model: nn.Module, x: torch.Tensor, name: str | None) -> tuple[str, torch.Tensor, float]:
    """The readout (the dense layer ``name``, else the last one run) on ``x``: its name, input and multiplier."""
    runs: list[tuple[str, torch.Tensor]] = []
    mods = [(n, m) for n, m in model.named_modules() if multiplier(m) is not None and (name is None or n == name)]
    if name is not None and not mods:
        raise WidthscopeError(
            f"nngp: no dense layer (nn.Linear, ScaledLinear, Conv1D) named {name!r} in the "
            "model; pass readout=None to use the last one that runs, or a dense layer's name"
        )

    def hook(n):
        def f(_m, args, kwargs, out):
            runs.append((n, first_input(args, kwargs).detach()))

        return f

    handles = [m.register_forward_hook(hook(n), with_kwargs=True) for n, m in mods]
    try:
        with torch.no_grad():
            out_tensor(model(x))
    finally:
        for h in handles:
            h.remove()
    if not runs:
        raise WidthscopeError(
            "nngp: no dense layer (nn.Linear, ScaledLinear, Conv1D) ran in the forward pass; "
            "the NNGP kernel needs a dense readout (pass readout='name' of one)"
        )
    n, a = runs[-1]
    if sum(1 for r in runs if r[0] == n) != 1:
        raise WidthscopeError(
            f"nngp: the readout {n!r} ran more than once in one forward pass; "
            "pass readout='name' of a layer that runs once"
        )
    mult = multiplier(model.get_submodule(n))
    assert mult is not None  # mods holds dense layers only
    return n, a, mult


def _check(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None) -> None:
    check_stochastic(model, "nngp")
    coupled = batchnorm_coupling(model, jacobian_fix=False)
    if coupled is None:
        p, b = params_and_buffers(model)
        probe = x1[:2] if x2 is None else torch.cat([x1[:1], x2[:1]])
        found = checks.probe_checks(lambda x: flat_out(model, p, b, x), probe, "nngp")
        coupled = None if found is None else f"the examples are coupled: {found}"
    if coupled is not None:
        raise WidthscopeError(
            f"nngp: {coupled}; the features φ(x) of one example would "
            "depend on the rest of its batch (compute them yourself if that is what you want)"
        )


def _function_nngp(
    model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None, readout: str | None, dtype: torch.dtype | None
) -> torch.Tensor:
    """The readout parameter's NTK ``Θ^W`` of a :class:`FunctionModel` (module docstring)."""
    names = [n for n, _ in model.named_parameters()]
    with torch.no_grad():
        o = out_tensor(model(x1[:1])).shape[1]
    if readout is None:
        cands = [n for n, p in model.named_parameters() if p.dim() == 2 and p.shape[0] == o]
        if not cands:
            raise WidthscopeError(
                f"nngp: no 2-D parameter with {o} rows (the number of outputs) in params; pass "
                "readout='key' of the readout weight"
            )
        readout = cands[-1]
    key = readout.replace(".", "__")
    if key not in names:
        raise WidthscopeError(
            f"nngp: no parameter {readout!r} in params (keys: {', '.join(names[:8])}); pass "
            "readout='key' of the readout weight"
        )
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    try:
        for n, p in model.named_parameters():
            p.requires_grad_(n == key)
        K = ntk(model, x1, x2, method="jacobian")
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(flags[n])
    diag = torch.diagonal(K, dim1=2, dim2=3)
    scale = float(diag.abs().max()) or 1.0
    tol = min(0.05, 1e4 * torch.finfo(K.dtype).eps) * scale
    off = float((K - torch.diag_embed(diag)).abs().max())
    spread = float((diag - diag[..., :1]).abs().max())
    if off > tol or spread > tol:
        raise WidthscopeError(
            f"nngp: parameter {readout!r} is not a readout applied once (f = m·W φ(x) + …): its "
            f"kernel has output cross terms up to {off:.3g} and diagonal spread {spread:.3g} "
            f"(scale {scale:.3g}); pass readout='key' of the readout weight"
        )
    K = diag[..., 0]
    return K.contiguous() if dtype is None else K.to(dtype).contiguous()


def nngp(
    model: nn.Module | Callable[..., Any],
    x1: torch.Tensor,
    x2: torch.Tensor | None = None,
    *,
    readout: str | None = None,
    dtype: torch.dtype | None = None,
    params: Any = None,
) -> torch.Tensor:
    """``m² φ(x1)·φ(x2)``: ``(n1, n2)``, or ``(n1, n2, T, T)`` for a readout at ``T`` positions. ``readout``: a dense
    layer's name (default: the last one run), or for a function a key of ``params``; ``dtype``: the result's."""
    fn = "nngp"
    _args.model_or_function(fn, model)
    _args.tensor(fn, "x1", x1, min_ndim=1, accepts="a non-empty batched tensor (n1, ...) of inputs")
    _args.tensor(
        fn, "x2", x2, min_ndim=1, optional=True, accepts="a non-empty batched tensor (n2, ...) shaped like x1, or None"
    )
    _args.string(fn, "readout", readout, optional=True, accepts="a dense layer's name (str) or None")
    _args.dtype(fn, "dtype", dtype)
    model = as_module(model, params, "nngp")
    if x1.shape[0] == 0:
        raise WidthscopeError("nngp: x1 must be a non-empty batched tensor (n1, ...) of inputs")
    if x2 is not None and (x2.shape[1:] != x1.shape[1:] or x2.shape[0] == 0):
        raise WidthscopeError(f"nngp: x2 must be a non-empty tensor shaped like x1 (n2, {tuple(x1.shape[1:])})")
    params = dict(model.named_parameters())
    x1 = as_param_dtype(x1, params)
    x2 = None if x2 is None else as_param_dtype(x2, params)
    _check(model, x1, x2)
    if isinstance(model, FunctionModel):
        return _function_nngp(model, x1, x2, readout, dtype)
    name, a1, m = _features(model, x1, readout)
    a2 = a1 if x2 is None else _features(model, x2, name)[1]
    d = a1.shape[-1]
    n1, n2, T = a1.shape[0], a2.shape[0], a1[0].numel() // d
    K = (a1.reshape(-1, d) @ a2.reshape(-1, d).T).view(n1, T, n2, T).permute(0, 2, 1, 3) * (m**2)
    K = K[:, :, 0, 0] if T == 1 else K
    return K.contiguous() if dtype is None else K.to(dtype).contiguous()
