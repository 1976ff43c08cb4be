"""The empirical neural tangent kernel ``Θ(x, x') = J(x) J(x')ᵀ`` (all output pairs, shape
``(n1, n2, out, out)``): argument and model checks, the method choice (:mod:`.choose`) and the kernel
routes (:mod:`._core` for Jacobians and products, :mod:`.structured` for Grams)."""

from __future__ import annotations

import math
import sys
from typing import Any, Callable

import torch
from torch import nn

from .. import _args
from ..errors import WidthscopeError, WidthscopeTypeError
from . import checks
from ._core import (
    as_param_dtype,
    first_output,
    flat_out,
    model_output,
    ntk_jacobian,
    ntk_per_example,
    ntk_products,
    params_and_buffers,
    reraise_attention,
    vmap_failure,
)
from .checks import COUPLED_FIX, as_module, batchnorm_coupling, check_stochastic, without_running_stats
from .choose import plan_costs
from .probes import MISSING, cached, peek, session, store, versions
from .structured import plan as structured_plan
from .structured_kernel import structured_kernel

__all__ = ["ntk", "structured_ntk", "METHODS"]

METHODS = ("auto", "structured", "per_example", "jacobian", "products")


def _check_model(
    model: nn.Module, params, buffers, x1: torch.Tensor, x2: torch.Tensor, method: str
) -> tuple[str | None, nn.Module, dict]:
    """Refuse random layers; say why the examples are batch-coupled (``None``: they are not), refusing a
    coupled model for the per-example ``"auto"``/``"structured"`` routes (:mod:`.checks`). Returns the
    reason, the model and the buffers to use: for a coupled model a copy without running-statistics
    updates and copied buffers, so nothing of the caller's model changes."""
    check_stochastic(model, "ntk")
    coupled = batchnorm_coupling(model)
    if coupled is not None:
        model, dropped = without_running_stats(model)
        buffers = {k: v.clone() for k, v in buffers.items() if k not in dropped}
    probe = x1[:2] if x2 is x1 else torch.cat([x1[:1], x2[:1]])
    if coupled is None:  # the caller's own model and tensors: a plain call (functional_call costs more here)
        run = lambda x: _flat_out_plain(model, x)  # noqa: E731
    else:
        run = lambda x: flat_out(model, params, buffers, x)  # noqa: E731
    # both checks' forward passes once per model, probe shape and parameter values (probes.py)
    key = ("checks", probe.shape[0], versions(model))
    seen = MISSING if coupled is not None else peek(model, probe, key)
    try:
        if seen is MISSING:
            found = checks.probe_checks(run, probe, "ntk", coupling=coupled is None)
            if coupled is None:
                store(model, probe, key, found, latest=True)
        else:
            found = seen if isinstance(seen, str) else None
    except (RuntimeError, TypeError, IndexError) as exc:
        raise WidthscopeError(
            f"ntk: the model cannot run on inputs of shape {tuple(probe.shape)} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "pass inputs shaped like the model's training inputs"
        ) from None
    if found is not None:
        coupled = f"the examples are coupled: {found}; {COUPLED_FIX}"
    if coupled is not None and method in ("auto", "structured", "per_example"):
        raise WidthscopeError(
            f"ntk: {coupled}. A per-example kernel (method={method!r}) assumes each output "
            "depends on its own example only, which does not hold here"
        )
    return coupled, model, buffers


def ntk(
    model: nn.Module | Callable[..., Any],
    x1: torch.Tensor,
    x2: torch.Tensor | None = None,
    *,
    trace: bool = False,
    chunk_size: int | None = None,
    method: str = "auto",
    memory_budget: float = 2e9,
    info: dict | None = None,
    diagonal: bool = False,
    batch_size: int | None = None,
    dtype: torch.dtype | None = None,
    params: Any = None,
    verbose: bool = False,
) -> torch.Tensor:
    r"""Empirical NTK ``Θ_{ab}(x, x') = Σ_θ ∂f_a(x)/∂θ · ∂f_b(x')/∂θ``, shape ``(n1, n2, out, out)``.

    ``trace=True`` gives the logit-averaged ``(n1, n2)`` kernel, ``diagonal=True`` only ``Θ(x_i, x_i)``;
    ``method`` is ``"auto"`` (fastest that fits ``memory_budget``), ``"structured"``, ``"per_example"``,
    ``"jacobian"`` or ``"products"``; ``info={}`` receives the choice and its costs. ``model`` may also be a
    function ``f(params, x)`` with ``params=``. Options, costs and refusals: docs/linearization.md
    "The NTK memory trade-off".

    Example::

        >>> import torch, widthscope
        >>> net = torch.nn.Linear(3, 2)
        >>> K = widthscope.ntk(net, torch.randn(4, 3), trace=True)   # (4, 4)
        >>> widthscope.ntk(net, torch.randn(4, 3), diagonal=True).shape
        torch.Size([4, 2, 2])
        >>> from torch.func import functional_call
        >>> f = lambda p, x: functional_call(net, p, (x,))
        >>> x = torch.randn(4, 3)
        >>> bool(torch.allclose(widthscope.ntk(f, x, params=dict(net.named_parameters())), widthscope.ntk(net, x)))
        True
    """
    fn = "ntk"
    _args.model_or_function(fn, model)
    _args.tensor(fn, "x1", x1, min_ndim=1, accepts="a batched tensor (n1, ...) of inputs")
    _args.tensor(fn, "x2", x2, min_ndim=1, optional=True, accepts="a batched tensor (n2, ...) shaped like x1, or None")
    for name, flag in (("trace", trace), ("diagonal", diagonal), ("verbose", verbose)):
        _args.boolean(fn, name, flag)
    _args.choice(fn, "method", method, METHODS)
    _args.mapping(fn, "info", info, mutable=True, accepts="a dict to fill, or None")
    _args.integer(fn, "batch_size", batch_size, lo=1, optional=True)
    _args.dtype(fn, "dtype", dtype)
    model = as_module(model, params, "ntk")
    _check_ntk_args(x1, x2, method, diagonal, batch_size, dtype, memory_budget, chunk_size)
    with session(model):  # the probe cache's architecture key, computed once for this call
        return _ntk(model, x1, x2, trace, chunk_size, method, memory_budget, info, diagonal, batch_size, dtype, verbose)


def _ntk(model, x1, x2, trace, chunk_size, method, memory_budget, info, diagonal, batch_size, dtype, verbose):
    """:func:`ntk` after its argument checks: the model checks, the method choice and the kernel."""
    params, buffers = params_and_buffers(model)
    if not params:
        raise WidthscopeError("ntk: the model has no trainable parameters")
    same = x2 is None
    x1 = as_param_dtype(x1, params)
    x2 = x1 if x2 is None else as_param_dtype(x2, params)
    coupled, model, buffers = _check_model(model, params, buffers, x1, x2, method)
    _check_coupled(coupled, same, batch_size, diagonal, info)
    n_params = sum(p.numel() for p in params.values())
    if coupled:
        n_out = first_output(model, params, buffers, x1, "ntk").shape[1]
    else:
        n_out = cached(model, x1, ("n_out", 1), lambda: first_output(model, params, buffers, x1[:1], "ntk").shape[1])
    itemsize = next(iter(params.values())).element_size()
    chunk_size = _coupled_chunk(coupled, method, chunk_size, x1.shape[0])
    asked = method
    method, costs, P = _choose_method(
        model,
        params,
        buffers,
        x1,
        x2,
        same,
        method,
        n_params,
        n_out,
        itemsize,
        memory_budget,
        trace,
        diagonal,
        batch_size,
        coupled,
        info,
        verbose,
    )
    c = costs.get(method, {})
    try:
        if method == "structured":
            K = structured_kernel(
                model,
                x1,
                None if same else x2,
                plan=P,
                trace=trace,
                diagonal=diagonal,
                batch_size=batch_size or c.get("batch_size"),
                dtype=dtype,
                memory_budget=memory_budget,
                info=info,
                generic_chunks=(c.get("generic_chunk"), c.get("generic_out_chunk")),
                reserved=c.get("bytes", 0.0),
            )
            return K.detach()
        try:
            K = _explicit_kernel(
                model, params, buffers, x1, x2, same, method, c, chunk_size, n_out, coupled, diagonal, batch_size
            )
        except RuntimeError as exc:
            # auto falls back on any failure of the vmapped forward (ops without a batching rule, in-place ops on
            # a batch of one: LSTM); a forced per_example says what to pass instead when it is vmap's
            if method != "per_example" or not (asked == "auto" or vmap_failure(exc)):
                raise
            fall = costs.get("jacobian") if asked == "auto" else None
            why = str(exc).splitlines()[0][:160]
            if fall is None or not fall["fits"]:
                raise WidthscopeError(
                    f"ntk: method='per_example' runs the model under vmap, which fails here ({why}); "
                    "pass method='jacobian' (only the backward pass is vmapped), 'structured' or 'products'"
                ) from exc
            # an op without a batching rule in the forward pass (e.g. RReLU): jacrev vmaps only the backward
            if info is not None:
                info.update(
                    method="jacobian", reason=info.get("reason", "") + f"; per_example failed ({why}): jacobian"
                )
            K = _explicit_kernel(
                model, params, buffers, x1, x2, same, "jacobian", fall, chunk_size, n_out, coupled, diagonal, batch_size
            )
    except (RuntimeError, NotImplementedError) as exc:
        reraise_attention(exc, model)
        raise
    K = K.detach()
    if trace:
        K = torch.diagonal(K, dim1=-2, dim2=-1).mean(-1)
    return K if dtype is None else K.to(dtype)


def structured_ntk(
    model: nn.Module,
    x1: torch.Tensor,
    x2: torch.Tensor | None = None,
    *,
    trace: bool = False,
    diagonal: bool = False,
    batch_size: int | None = None,
    dtype: torch.dtype | None = None,
    memory_budget: float = 2e9,
    info: dict | None = None,
) -> torch.Tensor:
    """``Θ`` of shape ``(n1, n2, out, out)`` (outputs flattened) by the structured path
    (:mod:`widthscope.linear.structured`); ``trace`` → ``(n1, n2)``, the mean of ``Θ_oo`` over ``o``;
    ``diagonal`` → ``(n1, out, out)``, ``Θ(x_i, x_i)`` only (``x2`` must be ``None``); both → ``(n1,)``.
    Options as in :func:`ntk` (``batch_size``: examples per block; ``dtype``: the accumulator's and
    result's dtype, default the parameters'). Parameters the structured path does not cover are added
    from explicit Jacobians of just those parameters.

    The same as ``ntk(model, x1, x2, method="structured", ...)``, which checks the inputs and makes the
    :func:`~widthscope.linear.structured.plan`.

    Example::

        >>> import torch
        >>> from widthscope.linear import structured_ntk
        >>> info = {}
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
        >>> structured_ntk(net, torch.randn(5, 3), trace=True, info=info).shape
        torch.Size([5, 5])
        >>> info["method"], info["uncovered"]
        ('structured', 0)
    """
    return ntk(
        model,
        x1,
        x2,
        method="structured",
        trace=trace,
        diagonal=diagonal,
        batch_size=batch_size,
        dtype=dtype,
        memory_budget=memory_budget,
        info=info,
    )


def _check_ntk_args(x1, x2, method: str, diagonal: bool, batch_size, dtype, memory_budget, chunk_size) -> None:
    """:func:`ntk`'s argument checks, one clear error each, before any model call."""

    if not isinstance(x1, torch.Tensor) or x1.dim() < 1:
        raise WidthscopeError("ntk: x1 must be a batched tensor (n1, ...) of inputs")
    if x2 is not None and (not isinstance(x2, torch.Tensor) or x2.shape[1:] != x1.shape[1:]):
        raise WidthscopeError(f"ntk: x2 must be a tensor shaped like x1 (n2, {tuple(x1.shape[1:])})")
    if method not in METHODS:
        raise WidthscopeError(
            f"ntk: unknown method {method!r}; use 'auto', 'structured', 'per_example', 'jacobian' or 'products'"
        )
    if x1.shape[0] == 0 or (x2 is not None and x2.shape[0] == 0):
        raise WidthscopeError(
            f"ntk: no inputs (x1 has {x1.shape[0]} rows"
            + (f", x2 has {x2.shape[0]}" if x2 is not None else "")
            + "); pass at least one"
        )
    if diagonal and x2 is not None:
        raise WidthscopeError("ntk: diagonal=True gives Θ(x_i, x_i) of one batch; pass x2=None")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise WidthscopeError(f"ntk: batch_size must be a positive integer or None, got {batch_size!r}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise WidthscopeError(f"ntk: dtype must be a floating torch.dtype (e.g. torch.float64), got {dtype!r}")
    # Wrong types raise the TypeError subclass; the wording (matched by tests) stays.
    bad_type = isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, float))
    if bad_type or not (memory_budget > 0 and not math.isnan(memory_budget)):
        raise (WidthscopeTypeError if bad_type else WidthscopeError)(
            f"ntk: memory_budget must be a positive number of bytes (e.g. 2e9), got {_args.describe(memory_budget)}; "
            "to force a method pass method='jacobian' or 'products'"
        )
    bad_type = chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int))
    if bad_type or (chunk_size is not None and chunk_size < 1):
        raise (WidthscopeTypeError if bad_type else WidthscopeError)(
            f"ntk: chunk_size must be a positive integer or None, got {_args.describe(chunk_size)}"
        )


def _check_coupled(coupled: str | None, same: bool, batch_size, diagonal: bool, info: dict | None) -> None:
    """A batch-coupled model (``coupled``: why) has one kernel, of the whole batch ``x1``: refuse the options
    that need per-example blocks; record the reason in ``info["batch_coupled"]``."""
    if coupled is None:
        return
    bad = (
        "x2 is given"
        if not same
        else "batch_size is set"
        if batch_size is not None
        else "diagonal=True"
        if diagonal
        else ""
    )
    if bad:
        raise WidthscopeError(
            f"ntk: {coupled}; the batch-coupled kernel exists only for one batch at once, "
            f"but {bad}: pass x2=None without batch_size or diagonal (for Θ(x1, x2) pass "
            "torch.cat([x1, x2]) and slice the blocks)"
        )
    if info is not None:
        info["batch_coupled"] = coupled


def _coupled_chunk(coupled: str | None, method: str, chunk_size: int | None, n: int) -> int | None:
    """The Jacobian route on a batch-coupled model takes the whole batch of ``n`` rows as one chunk."""
    if coupled is not None and method == "jacobian":
        if chunk_size is not None and chunk_size < n:
            raise WidthscopeError(
                f"ntk: {coupled}; the batch-coupled kernel needs the Jacobian of the whole batch "
                f"at once: chunk_size={chunk_size} < {n} rows (pass chunk_size=None)"
            )
        return n
    return chunk_size


def _choose_method(
    model,
    params,
    buffers,
    x1,
    x2,
    same,
    method,
    n_params,
    n_out,
    itemsize,
    budget,
    trace,
    diagonal,
    batch_size,
    coupled,
    info,
    verbose,
) -> tuple[str, dict, Any]:
    """The structured plan (for ``"auto"``/``"structured"``), the cost estimates and the method they pick;
    reported in ``info`` and, with ``verbose``, on stderr. Returns (method, costs, plan or None)."""
    P = None
    if method in ("auto", "structured"):
        try:
            px = x1[:2] if same else torch.cat([x1[:1], x2[:1]])
            key = ("plan", px.shape[0])
            P = peek(model, px, key)
            if P is MISSING:
                P = structured_plan(model, px)
                # a plan holding the model itself (a bare nn.Linear) would keep its weak cache key alive
                if all(e[1] is not model for e in P.entries):
                    store(model, px, key, P)
        except (RuntimeError, NotImplementedError) as exc:
            reraise_attention(exc, model)
            raise
    plan_ = plan_costs(
        model,
        params,
        buffers,
        x1,
        x2,
        same,
        P,
        method,
        n_params,
        n_out,
        itemsize,
        budget,
        trace,
        diagonal,
        batch_size,
        coupled,
    )
    method, costs = plan_["method"], plan_["costs"]
    if info is not None:
        info.update(method=method, reason=plan_["reason"], costs=costs)
        if method != "structured":  # nothing on the structured path
            info.update(covered=0, uncovered=n_params, generic=list(params))
    if verbose:
        print(f"ntk: method={method!r} ({plan_['reason']})", file=sys.stderr)
    return method, costs, P


def _flat_out_plain(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model_output(model(x))
    return out.reshape(out.shape[0], -1)


def _explicit_kernel(
    model, params, buffers, x1, x2, same, method, c, chunk_size, n_out, coupled, diagonal, batch_size
) -> torch.Tensor:
    """The ``"jacobian"``/``"products"`` kernel ``(n1, n2, out, out)`` (``diagonal``: ``(n1, out, out)``), in
    blocks of ``batch_size`` examples when given, with the chunks the cost model chose (``c``) unless
    ``chunk_size`` is set."""
    out_chunk = None
    if chunk_size is None:
        chunk_size = c.get("chunk", 1)
        out_chunk = c.get("out_chunk") if c.get("out_chunk", n_out) < n_out else None

    def block(a: torch.Tensor, b: torch.Tensor, same_ab: bool) -> torch.Tensor:
        if method == "jacobian":
            return ntk_jacobian(model, params, buffers, a, b, chunk_size, same_ab, out_chunk)
        if method == "per_example":
            return ntk_per_example(model, params, buffers, a, b, chunk_size, same_ab, out_chunk, n_out)
        return ntk_products(model, params, buffers, a, b, None if coupled else c.get("chunk"), coupled is not None)

    if diagonal:  # Θ(x_i, x_i) from per-chunk blocks: the off-diagonal chunks are never formed
        step = min(chunk_size, batch_size or chunk_size) if method in ("jacobian", "per_example") else 1
        return torch.cat(
            [
                torch.diagonal(block(x1[i : i + step], x1[i : i + step], True), dim1=0, dim2=1).permute(2, 0, 1)
                for i in range(0, x1.shape[0], step)
            ]
        )
    if batch_size is None:
        return block(x1, x2, same)
    b = batch_size
    return torch.cat(
        [
            torch.cat([block(x1[i : i + b], x2[j : j + b], same and i == j) for j in range(0, x2.shape[0], b)], dim=1)
            for i in range(0, x1.shape[0], b)
        ],
        dim=0,
    )
