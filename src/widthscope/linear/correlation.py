"""Exact derivative correlations ``C_{D,d}`` by nested forward-mode differentiation.

With learning rate ``η``, training inputs ``x_1..x_d`` and ``g_i = ∇_θF(x_i; θ₀)``:

    C_{D,d}(x; x_1..x_d) = η^{D/2+d} / (D! d!) · ∇^{D+d}F(x; θ₀)[g_1, …, g_d, ·, …, ·]

The ``d`` contractions are nested jvps ``h_k(θ) = jvp(h_{k-1}, θ, g_k)``, ``h_0 = F(x; ·)``; ``D = 0`` gives
``h_d(θ₀)``, ``D = 1`` the gradient ``∇_θ h_d(θ₀)`` (flattened). The scalar ``F`` is one logit (``output=k``)
or a random unit combination ``uᵀF`` (``output="random"``, ``u`` from ``seed``).

Example::

    >>> import torch, widthscope
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).double()
    >>> X = torch.randn(4, 3, dtype=torch.float64)
    >>> c02 = widthscope.correlation(net, X[0], X[1:3], D=0, d=2)          # scalar tensor
    >>> c11 = widthscope.correlation(net, X[0], X[1:2], D=1, d=1)          # (P,) vector
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad, jvp

from .. import _args
from .._io import progress as _progress
from ..errors import WidthscopeError
from ..probe.collect import logits_of
from ..probe.structure import eager_attention_for
from ._core import as_param_dtype, first_output, params_and_buffers, reraise_attention

__all__ = ["correlation", "correlation_summary", "parse_correlation_name"]

MAX_ORDER = 4


def parse_correlation_name(name: str) -> tuple[int, int]:
    """``"C02"`` / ``"C_{1,2}"`` / ``"1,2"`` -> ``(D, d)``."""
    s = str(name).strip().upper().replace("C_", "C").replace("{", "").replace("}", "")
    s = s[1:] if s.startswith("C") else s
    try:
        if "," in s:
            D, d = (int(t) for t in s.split(","))
        elif len(s) == 2 and s.isdigit():
            D, d = int(s[0]), int(s[1])
        else:
            raise ValueError
    except ValueError:
        raise WidthscopeError(
            f"correlation name {name!r}: use the form C02, C11, C12 (C<D><d>, free slots D, contracted inputs d)"
        ) from None
    _check_order(D, d)
    return D, d


def _check_order(D: int, d: int) -> None:
    if D not in (0, 1):
        raise WidthscopeError(
            f"correlation: D={D} is not supported (D=0 gives a scalar, D=1 a "
            "parameter vector; D=2 would be a P×P matrix)"
        )
    if d < 0 or D + d > MAX_ORDER:
        raise WidthscopeError(f"correlation: need d >= 0 and D + d <= {MAX_ORDER} (got D={D}, d={d})")


def _direction(n_out: int, output: int | str, seed: int) -> torch.Tensor:
    """Unit vector ``u`` (float64) selecting the scalar ``uᵀF``."""
    if output == "random":
        u = torch.randn(n_out, generator=torch.Generator().manual_seed(int(seed)), dtype=torch.float64)
        return u / u.norm()
    if isinstance(output, bool) or not isinstance(output, int) or not (0 <= output < n_out):
        raise WidthscopeError(f"correlation: output={output!r}; use a logit index 0..{n_out - 1} or 'random'")
    return torch.eye(n_out, dtype=torch.float64)[output]


def correlation(
    model: nn.Module,
    x: torch.Tensor,
    xs: torch.Tensor,
    *,
    D: int,
    d: int,
    eta: float = 1.0,
    output: int | str = 0,
    seed: int = 0,
) -> torch.Tensor:
    """Exact ``C_{D,d}(x; x_1..x_d)`` at the current ``θ₀``: a 0-dim tensor (``D = 0``) or a ``(P,)`` vector
    (``D = 1``). ``x``: one input, ``S`` or ``(1, *S)``; ``xs``: the ``d`` inputs stacked, ``(d, *S)``."""
    fn = "correlation"
    _args.module(fn, "model", model)
    _args.tensor(fn, "x", x, accepts="a tensor (one input, shape S or (1, *S))")
    _args.tensor(fn, "xs", xs, min_ndim=1, accepts="a tensor (d, *S) of the d inputs stacked")
    _args.integer(fn, "D", D, accepts="0 or 1 (an integer)")  # the ranges: _check_order's wording
    _args.integer(fn, "d", d, accepts="an integer >= 0")
    _args.number(fn, "eta", eta, 0.0, lo_open=True, accepts="a positive learning rate")
    if output != "random":
        _args.integer(fn, "output", output, lo=0, accepts="a logit index (an integer >= 0) or 'random'")
    _args.integer(fn, "seed", seed)
    _check_order(D, d)
    if xs.shape[0] != d:
        raise WidthscopeError(
            f"correlation: xs holds {xs.shape[0]} inputs but d={d}; pass exactly "
            "d inputs stacked along the first dimension"
        )
    if x.dim() == xs.dim():
        if x.shape[0] != 1:
            raise WidthscopeError(
                f"correlation: x must be one input (shape {tuple(xs.shape[1:])} or (1, ...)), got {tuple(x.shape)}"
            )
    elif x.dim() == xs.dim() - 1:
        x = x.unsqueeze(0)
    else:
        raise WidthscopeError(f"correlation: x shape {tuple(x.shape)} does not match the inputs xs {tuple(xs.shape)}")
    params, buffers = params_and_buffers(model)
    if not params:
        raise WidthscopeError("correlation: the model has no trainable parameters")
    p0 = next(iter(params.values()))
    x, xs = as_param_dtype(x, params), as_param_dtype(xs, params)
    n_out = first_output(model, params, buffers, x, "correlation").numel()
    u = _direction(n_out, output, seed).to(dtype=p0.dtype, device=p0.device)

    def f(params, x):  # x: one example with a batch dim of 1
        return (logits_of(functional_call(model, (params, buffers), (x,))).reshape(-1) * u).sum()

    try:
        with eager_attention_for(model):  # nested jvp: fused attention kernels have no forward mode
            gs = [grad(f)(params, xs[i : i + 1]) for i in range(d)]

            def along(prev, g):  # the derivative of prev along g, as a function of the parameters
                return lambda p: jvp(prev, (p,), (g,))[1]

            h = lambda p: f(p, x)  # noqa: E731
            for g in gs:
                h = along(h, g)
            if D == 0:
                value = h(params).detach()
            else:
                gv = grad(h)(params)
                value = torch.cat([gv[k].reshape(-1) for k in params]).detach()
    except (RuntimeError, NotImplementedError) as exc:
        reraise_attention(exc, model)
        raise
    scale = eta ** (D / 2 + d) / (math.factorial(D) * math.factorial(d))
    return value * scale


def correlation_summary(
    model: nn.Module,
    data: Any,
    *,
    D: int,
    d: int,
    n_tuples: int = 32,
    eta: float = 1.0,
    output: int | str = 0,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Size of ``C_{D,d}`` (``|C|``, or ``‖C‖₂`` for ``D = 1``) over ``n_tuples`` random input tuples from
    ``data`` (inputs ``(n, ...)`` or an ``(X, Y)`` pair): ``mean``, ``rms``, ``sem``, ``values`` and the settings."""
    _check_order(D, d)
    X = data[0] if isinstance(data, (tuple, list)) else data
    if not isinstance(X, torch.Tensor) or X.dim() < 1:
        raise WidthscopeError("correlation_summary: data must be a tensor (n, ...) or an (X, Y) pair")
    n = X.shape[0]
    if n < 1 or n_tuples < 1:
        raise WidthscopeError(f"correlation_summary: need data and n_tuples >= 1 (n={n}, n_tuples={n_tuples})")
    gen = torch.Generator().manual_seed(int(seed) + 7919)
    vals = []
    for _ in _progress(range(n_tuples), desc=f"C{D}{d}", disable=not progress):
        idx = torch.randperm(n, generator=gen)[: d + 1] if n > d else torch.randint(n, (d + 1,), generator=gen)
        c = correlation(model, X[idx[0]], X[idx[1:]], D=D, d=d, eta=eta, output=output, seed=seed)
        vals.append(float(c.abs()) if D == 0 else float(c.norm()))
    v = torch.tensor(vals, dtype=torch.float64)
    desc = f"random unit combination (seed {seed})" if output == "random" else f"logit {output}"
    return {
        "D": D,
        "d": d,
        "eta": eta,
        "output": desc,
        "n_tuples": n_tuples,
        "mean": float(v.mean()),
        "rms": float(v.pow(2).mean().sqrt()),
        "sem": float(v.std(unbiased=True) / math.sqrt(len(v))) if len(v) > 1 else float("nan"),
        "values": vals,
    }
