"""The empirical neural tangent kernel ``Θ(x, x') = J(x) J(x')ᵀ`` (all output pairs, shape
``(n1, n2, out, out)``): argument and model checks, the method choice (:mod:`.cost`) and the kernel
routes (:mod:`._core` for Jacobians and products, :mod:`.structured` for Grams)."""

from __future__ import annotations

import dataclasses
import math
import sys
import warnings
from typing import Any, Callable

import torch
from torch import nn

from .. import _args
from ..errors import WidthscopeError, WidthscopeTypeError
from . import checks, cost
from ._core import (
    as_param_dtype,
    cannot_run,
    first_output,
    flat_out,
    forward_ad_ok,
    ntk_jacobian,
    ntk_per_example,
    ntk_products,
    out_tensor,
    params_and_buffers,
    reraise_attention,
)
from .checks import COUPLED_FIX, as_module, batchnorm_coupling, check_stochastic, without_running_stats
from .probes import MISSING, cached, peek, session, store, versions
from .structured import plan as structured_plan
from .structured import structured_kernel

__all__ = ["ntk", "structured_ntk", "METHODS"]

METHODS = ("auto", "structured", "per_example", "jacobian", "products")


def _check_model(
    model: nn.Module, params, buffers, x1: torch.Tensor, x2: torch.Tensor, method: str
) -> tuple[str | None, nn.Module, dict]:
    """Refuse random layers, and batch-coupled examples for the per-example routes. Returns why the examples
    are coupled (``None``), and the model and buffers to use (for a coupled model, a copy without updates)."""
    check_stochastic(model, "ntk")
    coupled = batchnorm_coupling(model)
    if coupled is not None:
        model, dropped = without_running_stats(model)
        buffers = {k: v.clone() for k, v in buffers.items() if k not in dropped}
    probe = x1[:2] if x2 is x1 else torch.cat([x1[:1], x2[:1]])
    if coupled is None:  # the caller's own model and tensors: a plain call (functional_call costs more here)
        run = lambda x: out_tensor(model(x))  # noqa: E731
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
        raise cannot_run("ntk", probe, exc) from None
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

    ``trace``: the logit-averaged ``(n1, n2)`` kernel; ``diagonal``: only ``Θ(x_i, x_i)``; ``method``: one of
    :data:`METHODS` (``"auto"``: fastest within ``memory_budget``); ``info={}`` receives the choice and its costs.
    Options: docs/linearization.md "The NTK memory trade-off".

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
    _check_ntk_args(x1, x2, diagonal, memory_budget, chunk_size)
    with session(model):  # the probe cache's architecture key, computed once for this call
        return _ntk(model, x1, x2, trace, chunk_size, method, memory_budget, info, diagonal, batch_size, dtype, verbose)


@dataclasses.dataclass
class _Job:
    """One :func:`ntk` call after its checks: the model as run, its inputs and options."""

    model: nn.Module
    params: dict
    buffers: dict
    x1: torch.Tensor
    x2: torch.Tensor
    same: bool
    coupled: str | None
    n_out: int
    trace: bool
    diagonal: bool
    batch_size: int | None
    budget: float


def _ntk(model, x1, x2, trace, chunk_size, method, memory_budget, info, diagonal, batch_size, dtype, verbose):
    """:func:`ntk` after its argument checks: the model checks, the method choice and the kernel."""
    params, buffers = params_and_buffers(model)
    if not params:
        raise WidthscopeError("ntk: the model has no trainable parameters")
    same = x2 is None
    x1 = as_param_dtype(x1, params)
    x2 = x1 if x2 is None else as_param_dtype(x2, params)
    coupled, model, buffers = _check_model(model, params, buffers, x1, x2, method)
    chunk_size = _coupled_options(coupled, same, batch_size, diagonal, info, method, chunk_size, x1.shape[0])
    if coupled:
        n_out = first_output(model, params, buffers, x1, "ntk").shape[1]
    else:
        n_out = cached(model, x1, ("n_out", 1), lambda: first_output(model, params, buffers, x1[:1], "ntk").shape[1])
    job = _Job(model, params, buffers, x1, x2, same, coupled, n_out, trace, diagonal, batch_size, memory_budget)
    asked = method
    method, costs, P = _choose_method(job, method, info, verbose)
    c = costs.get(method, {})
    try:
        if method == "structured":
            K = structured_kernel(
                model, x1, None if same else x2, P, trace, diagonal, batch_size, dtype, memory_budget, c
            )
            return K + _generic(job, P.generic, c).to(K.dtype) if P.generic else K
        try:
            K = _explicit_kernel(job, method, c, chunk_size)
        except RuntimeError as exc:
            # auto falls back on any failure of the vmapped forward (ops without a batching rule, in-place ops on
            # a batch of one: LSTM); a forced per_example says what to pass instead when it is vmap's
            if method != "per_example" or not (asked == "auto" or "vmap" in str(exc).lower()):
                raise
            fall = costs.get("jacobian") if asked == "auto" else None
            why = str(exc).splitlines()[0][:160]
            if fall is None or not fall["fits"]:
                raise WidthscopeError(
                    f"ntk: method='per_example' runs the model under vmap, which fails here ({why}); "
                    "pass method='jacobian' (only the backward pass is vmapped), 'structured' or 'products'"
                ) from exc
            if info is not None:
                info.update(
                    method="jacobian", reason=info.get("reason", "") + f"; per_example failed ({why}): jacobian"
                )
            K = _explicit_kernel(job, "jacobian", fall, chunk_size)
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
    """``ntk(model, x1, x2, method="structured", ...)``: ``Θ`` from Grams, uncovered parameters by Jacobians.

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
    kw: dict[str, Any] = dict(trace=trace, diagonal=diagonal, batch_size=batch_size, dtype=dtype, info=info)
    return ntk(model, x1, x2, method="structured", memory_budget=memory_budget, **kw)


def _check_ntk_args(x1, x2, diagonal: bool, memory_budget, chunk_size) -> None:
    """:func:`ntk`'s checks beyond the argument types, before any model call."""
    if x2 is not None and x2.shape[1:] != x1.shape[1:]:
        raise WidthscopeError(f"ntk: x2 must be a tensor shaped like x1 (n2, {tuple(x1.shape[1:])})")
    if x1.shape[0] == 0 or (x2 is not None and x2.shape[0] == 0):
        raise WidthscopeError(
            f"ntk: no inputs (x1 has {x1.shape[0]} rows"
            + (f", x2 has {x2.shape[0]}" if x2 is not None else "")
            + "); pass at least one"
        )
    if diagonal and x2 is not None:
        raise WidthscopeError("ntk: diagonal=True gives Θ(x_i, x_i) of one batch; pass x2=None")
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


def _coupled_options(coupled: str | None, same: bool, batch_size, diagonal: bool, info, method: str, chunk, n: int):
    """A batch-coupled model has one kernel, of the whole batch: refuse per-example options, record why in
    ``info["batch_coupled"]``, and return the chunk size (the Jacobian route takes all ``n`` rows at once)."""
    if coupled is None:
        return chunk
    bad = "x2 is given" if not same else "batch_size is set" if batch_size is not None else "diagonal=True" * diagonal
    if bad:
        raise WidthscopeError(
            f"ntk: {coupled}; the batch-coupled kernel exists only for one batch at once, "
            f"but {bad}: pass x2=None without batch_size or diagonal (for Θ(x1, x2) pass "
            "torch.cat([x1, x2]) and slice the blocks)"
        )
    if method == "jacobian" and chunk is not None and chunk < n:
        raise WidthscopeError(
            f"ntk: {coupled}; the batch-coupled kernel needs the Jacobian of the whole batch "
            f"at once: chunk_size={chunk} < {n} rows (pass chunk_size=None)"
        )
    if info is not None:
        info["batch_coupled"] = coupled
    return n if method == "jacobian" else chunk


def _choose_method(job: _Job, method: str, info: dict | None, verbose: bool) -> tuple[str, dict, Any]:
    """(method, costs, plan or None): the cheapest method that fits for ``"auto"`` (else the forced one, checked
    to fit), reported in ``info`` and, with ``verbose``, on stderr."""
    j, P = job, None
    if method in ("auto", "structured"):
        px = j.x1[:2] if j.same else torch.cat([j.x1[:1], j.x2[:1]])
        P = peek(j.model, px, ("plan", px.shape[0]))
        if P is MISSING:
            try:
                P = structured_plan(j.model, px)
            except (RuntimeError, NotImplementedError) as exc:
                reraise_attention(exc, j.model)
                raise
            # a plan holding the model itself (a bare nn.Linear) would keep its weak cache key alive
            if all(e[1] is not j.model for e in P.entries):
                store(j.model, px, ("plan", px.shape[0]), P)
    px = j.x1 if j.coupled else j.x1[:1]
    pr = cached(j.model, px, ("measure", px.shape[0]), lambda: _measure(j, px))
    n1, n2 = j.x1.shape[0], j.x2.shape[0]
    if j.batch_size is not None:  # blocks of batch_size examples, one pair at a time
        n1, n2 = min(n1, j.batch_size), min(n2, j.batch_size)
    mode = ("diagtrace" if j.trace else "diag") if j.diagonal else ("trace" if j.trace else "full")
    if j.diagonal and method != "structured":
        n2 = 1  # per-chunk diagonal blocks
    cands: tuple[str, ...] = cost.AUTO_METHODS if method == "auto" else (method,)
    if j.coupled is not None:  # one batch at once: the Jacobian of the whole batch
        cands = tuple(m for m in cands if m not in ("structured", "per_example"))
    n_params = sum(p.numel() for p in j.params.values())
    item = next(iter(j.params.values())).element_size()
    kw = dict(n_params=n_params, n_out=j.n_out, n1=n1, n2=n2, same=j.same)
    costs = cost.estimates(pr=pr, plan=P, item=item, budget=j.budget, mode=mode, methods=cands, **kw)
    if P is not None and "structured" in costs and P.n_covered == 0:
        costs.pop("structured")  # nothing covered: it is the Jacobian route with extra steps
    if j.coupled is not None and "jacobian" in costs:  # forced whole-batch chunk
        costs["jacobian"].update(chunk=j.x1.shape[0], out_chunk=j.n_out)
    cost.price(costs, pr, P, n_params, j.n_out, n1, n2, j.same, mode)
    if method != "auto":
        c = costs.get(method)
        if c is not None and not c["fits"]:
            raise WidthscopeError(
                f"ntk: method={method!r} needs about {c['bytes'] / 1e6:.4g} MB at its smallest chunks, more than "
                f"the {cost.SAFETY:.0%} of memory_budget={j.budget / 1e6:.4g} MB it plans within (the rest is "
                "the allocator's slack); raise memory_budget or let method='auto' pick one that fits"
            )
        reason = f"{method}: asked for"
    else:
        best, reason = cost.choose(costs, j.budget)
        # a jvp is tried only when products would win (a fused TransformerEncoder kernel has no forward-mode AD)
        if best == "products" and not cached(
            j.model, j.x1, ("jvp", 1), lambda: forward_ad_ok(j.model, j.params, j.buffers, j.x1[:1])
        ):
            costs.pop("products")
            best, reason = cost.choose(costs, j.budget)
            reason += "; products: no forward-mode AD through this model"
        if best is None:
            raise WidthscopeError(
                f"ntk: {reason}; raise memory_budget, or pass trace=True, diagonal=True or batch_size to need less"
            )
        method = best
    if info is not None:
        info.update(method=method, reason=reason, costs=costs)
        if method == "structured" and P is not None:
            info.update(covered=P.n_covered, uncovered=P.n_generic, generic=list(P.generic))
        else:  # nothing on the structured path
            info.update(covered=0, uncovered=n_params, generic=list(j.params))
    if verbose:
        print(f"ntk: method={method!r} ({reason})", file=sys.stderr)
    return method, costs, P


def _measure(j: _Job, x: torch.Tensor) -> cost.Probe:
    """:func:`.cost.measure` of the forward pass on parameters that require grad, as the kernels run it."""
    tracked = {k: v.detach().requires_grad_() for k, v in j.params.items()}
    return cost.measure(lambda x: flat_out(j.model, tracked, j.buffers, x), x, tracked)


def _explicit_kernel(j: _Job, method: str, c: dict, chunk_size: int | None) -> torch.Tensor:
    """The ``"jacobian"``/``"per_example"``/``"products"`` kernel, in blocks of ``batch_size`` examples, with the
    cost model's chunks ``c`` unless ``chunk_size`` is set."""
    out_chunk = None
    if chunk_size is None:
        chunk_size, oc = c.get("chunk", 1), c.get("out_chunk")
        out_chunk = oc if oc and oc < j.n_out else None
    args = (j.model, j.params, j.buffers)

    def block(a: torch.Tensor, b: torch.Tensor, same_ab: bool) -> torch.Tensor:
        if method == "jacobian":
            return ntk_jacobian(*args, a, b, chunk_size, same_ab, out_chunk)
        if method == "per_example":
            return ntk_per_example(*args, a, b, chunk_size, same_ab, out_chunk, j.n_out)
        return ntk_products(*args, a, b, None if j.coupled else c.get("chunk"), j.coupled is not None)

    x1, x2, bs = j.x1, j.x2, j.batch_size
    if j.diagonal:  # Θ(x_i, x_i) from per-chunk blocks: the off-diagonal chunks are never formed
        step = min(chunk_size, bs or chunk_size) if method in ("jacobian", "per_example") else 1
        blocks = [block(x1[i : i + step], x1[i : i + step], True) for i in range(0, x1.shape[0], step)]
        return torch.cat([torch.diagonal(b, dim1=0, dim2=1).permute(2, 0, 1) for b in blocks])
    if bs is None:
        return block(x1, x2, j.same)
    rows = [
        torch.cat([block(x1[i : i + bs], x2[j2 : j2 + bs], j.same and i == j2) for j2 in range(0, x2.shape[0], bs)], 1)
        for i in range(0, x1.shape[0], bs)
    ]
    return torch.cat(rows, dim=0)


def _generic(j: _Job, names: list[str], c: dict) -> torch.Tensor:
    """The structured path's remainder: the explicit kernel of just the parameters ``names``."""
    gp = {k: j.params[k] for k in names}
    rest = {**j.buffers, **{k: v for k, v in j.params.items() if k not in gp}}
    per_example = j.n_out * sum(v.numel() for v in gp.values()) * gp[names[0]].element_size()
    sizes = {"chunk": c.get("generic_chunk") or max(1, int(j.budget // (2 * per_example)))}
    sizes["out_chunk"] = c.get("generic_out_chunk")
    job = dataclasses.replace(j, params=gp, buffers=rest, batch_size=None)
    with warnings.catch_warnings():  # vmapped ops without a batching rule fall back to a loop: fine
        warnings.filterwarnings("ignore", message="There is a performance drop")
        try:
            K = _explicit_kernel(job, "per_example", sizes, None)
        except RuntimeError:  # the vmapped forward failed (no batching rule, in-place ops): jacrev vmaps
            K = _explicit_kernel(job, "jacobian", sizes, None)
    return torch.diagonal(K, dim1=-2, dim2=-1).mean(-1) if j.trace else K
