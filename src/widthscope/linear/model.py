"""Linearized models and the empirical neural tangent kernel.

The linear (first-order Taylor) model of a network ``F(x; θ)`` around ``θ₀`` is

    F_lin(x; θ) = F(x; θ₀) + J(x; θ₀)·(θ − θ₀),      J = ∂F/∂θ,

evaluated with one forward-mode product (``torch.func.jvp``) per call: the Jacobian is never
formed. The empirical NTK is ``Θ(x, x') = J(x) J(x')ᵀ`` with all output pairs kept,
shape ``(n1, n2, out, out)``.

Example::

    >>> import torch, widthscope
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    >>> lin = widthscope.linearize(net)
    >>> x = torch.randn(5, 3)
    >>> torch.allclose(lin(x), net(x))       # θ = θ₀ at the start
    True
    >>> widthscope.ntk(net, x).shape
    torch.Size([5, 5, 2, 2])
"""

from __future__ import annotations

import copy
import sys
from typing import Any, Callable

import torch
from torch import nn
from torch.func import functional_call, jvp
from torch.utils._pytree import tree_flatten, tree_unflatten

from .. import _args
from ..errors import WidthscopeError, WidthscopeTypeError
from ._core import (  # noqa: F401  (re-exported)
    _flat_out,
    _forward_ad_ok,
    _ntk_jacobian,
    _ntk_products,
    as_param_dtype,
    first_output,
    model_output,
    params_and_buffers,
)

__all__ = [
    "LinearizedModel",
    "linearize",
    "ntk",
    "structured_ntk",
    "model_output",
    "params_and_buffers",
    "as_param_dtype",
    "first_output",
    "ATTENTION_FIX",
]

ATTENTION_FIX = (
    'build or load the model with attn_implementation="eager" (e.g. '
    'AutoModelForCausalLM.from_config(cfg, attn_implementation="eager"), or '
    'model.set_attn_implementation("eager")): fused scaled-dot-product attention '
    "kernels have no forward-mode (jvp) derivative"
)


_STOCHASTIC_OPT_IN = (
    ", or pass allow_stochastic=True to linearise each call's random draw (primal and tangent share it)"
)


def _safe(name: str) -> str:
    # nn.Module attribute names may not contain dots.
    return name.replace(".", "__")


def _is_attention_ad_error(exc: BaseException) -> bool:
    msg = str(exc).lower()
    keys = ("scaled_dot_product", "flash", "efficient_attention", "sdpa", "_fused_sdp", "attention")
    return any(k in msg for k in keys)


def _uses_fused_attention(model: nn.Module) -> bool:
    cfg = getattr(model, "config", None)
    impl = getattr(cfg, "_attn_implementation", None) if cfg is not None else None
    return impl is not None and impl != "eager"


def _reraise_attention(exc: BaseException, model: nn.Module) -> None:
    if _is_attention_ad_error(exc) or _uses_fused_attention(model):
        raise WidthscopeError(
            f"forward-mode differentiation (jvp) failed inside attention "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); fix: "
            f"{ATTENTION_FIX}"
        ) from exc


class LinearizedModel(nn.Module):
    """``F_lin(x; θ) = F(x; θ₀) + jvp(F(x; ·), θ₀, θ − θ₀)``, trainable like any module.

    Parameters are fresh copies of the model's trainable parameters (initially ``θ₀``),
    named like the originals with dots replaced by ``__``; ``θ₀`` and the model's buffers are
    buffers of this module. The wrapped model is *not* a registered submodule, so
    ``parameters()`` yields exactly the linear model's ``θ``; ``.to()``/``.double()`` still
    move it. Gradients with respect to ``θ`` flow through the jvp (reverse-over-forward).
    """

    _base: nn.Module  # the wrapped model, set with object.__setattr__ (unregistered)

    def __init__(self, model: nn.Module, *, allow_stochastic: bool = False):
        super().__init__()
        from ..models.hf import eager_attention
        from .checks import _is_candidate, check_running_stats, check_stochastic

        if not allow_stochastic:
            check_stochastic(model, "linearize", _STOCHASTIC_OPT_IN)
        check_running_stats(list(model.named_modules()), "linearize")

        # A private copy, so switching it to eager attention (jvp needs it) leaves the caller's
        # model and its kernels alone; eager and fused attention are the same function.
        base = eager_attention(copy.deepcopy(model))
        for p in base.parameters():
            # Only the module structure is needed: every call passes θ₀ (or the frozen values)
            # through functional_call, so the copy's own storage is freed (saves one copy of θ).
            p.requires_grad_(False)
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        object.__setattr__(self, "_base", base)  # unregistered on purpose (see docstring)
        self._allow_stochastic = bool(allow_stochastic)
        self._stochastic = [(n, m) for n, m in base.named_modules() if _is_candidate(m)]
        self._bn: list[tuple[str, nn.Module]] = [
            (n, m) for n, m in base.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
        ]
        params, buffers = params_and_buffers(model)
        if not params:
            raise WidthscopeError(
                "linearize: the model has no trainable parameters "
                "(set requires_grad=True on the parameters to linearize in)"
            )
        self._names = list(params)
        self._buffer_names = list(buffers)
        for k, v in params.items():
            self.register_parameter(_safe(k), nn.Parameter(v.clone()))
            self.register_buffer("theta0__" + _safe(k), v.clone())
        for k, v in buffers.items():
            self.register_buffer("buf__" + _safe(k), v.clone())
        self.train(model.training)

    # -- plumbing ---------------------------------------------------------------------------
    @property
    def base(self) -> nn.Module:
        return self._base

    def _apply(self, fn, recurse=True):  # keep the unregistered base on the same device/dtype
        super()._apply(fn, recurse)
        self._base._apply(fn, recurse)
        return self

    def train(self, mode: bool = True) -> LinearizedModel:
        super().train(mode)
        self._base.train(mode)
        return self

    def theta(self) -> dict[str, torch.Tensor]:
        """Current parameters keyed by the original model's names."""
        return {k: getattr(self, _safe(k)) for k in self._names}

    def theta0(self) -> dict[str, torch.Tensor]:
        return {k: getattr(self, "theta0__" + _safe(k)) for k in self._names}

    def model_buffers(self) -> dict[str, torch.Tensor]:
        return {k: getattr(self, "buf__" + _safe(k)) for k in self._buffer_names}

    # -- the linear model -------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if (self._stochastic and not self._allow_stochastic) or self._bn:  # lin.train() may have switched them on
            from .checks import check_running_stats, check_stochastic

            if not self._allow_stochastic:
                check_stochastic(self._base, "linearized model", _STOCHASTIC_OPT_IN, self._stochastic)
            check_running_stats(self._bn, "linearized model")
        theta, theta0, bufs = self.theta(), self.theta0(), self.model_buffers()
        delta = {k: theta[k] - theta0[k] for k in self._names}

        spec: list[Any] = []

        def f(p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
            # jvp accepts only tensor outputs: differentiate the tensor leaves of whatever the
            # model returns (tensor, tuple, HF ModelOutput) and drop the rest (e.g. KV caches).
            leaves, treedef = tree_flatten(functional_call(self._base, (p, bufs), args, kwargs))
            spec[:] = [treedef, [isinstance(v, torch.Tensor) for v in leaves]]
            return tuple(v for v in leaves if isinstance(v, torch.Tensor))

        try:
            # torch.func.jvp is typed as a 2- or 3-tuple whatever has_aux: here (no aux) it is 2
            out, tangent = jvp(f, (theta0,), (delta,))  # type: ignore[misc]
        except (RuntimeError, NotImplementedError) as exc:
            _reraise_attention(exc, self._base)
            raise
        summed = iter([a + b for a, b in zip(out, tangent)])
        treedef, is_tensor = spec
        return tree_unflatten([next(summed) if t else None for t in is_tensor], treedef)


def linearize(
    model: nn.Module | Callable[..., Any], *, params: Any = None, allow_stochastic: bool = False
) -> LinearizedModel:
    """Return the linear model of ``model`` around its current parameters ``θ₀``.

    ``F_lin(x; θ) = F(x; θ₀) + ∇_θF(x; θ₀)·(θ − θ₀)``, computed with ``torch.func.jvp``.
    ``model`` itself is not modified (a copy is wrapped). Train the result with any torch
    optimizer over ``lin.parameters()``.

    ``model`` may be a function ``f(params, x)`` with ``params=`` a dict or pytree of tensors
    (``θ₀``; :class:`widthscope.linear.checks.FunctionModel`); the result is called as ``lin(x)``.
    A model with dropout (or another random layer) in training mode is refused: each call would
    linearise a different random network. ``allow_stochastic=True`` accepts it (every call then
    linearises that call's random draw; the primal and tangent share it).

    Example::

        >>> import torch, widthscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        >>> lin = widthscope.linearize(net)
        >>> opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        >>> lin(torch.randn(3, 2)).sum().backward(); opt.step()
    """
    from .checks import as_module

    _args.model_or_function("linearize", model)
    _args.boolean("linearize", "allow_stochastic", allow_stochastic)
    return LinearizedModel(as_module(model, params, "linearize"), allow_stochastic=allow_stochastic)


# ---------------------------------------------------------------------------------------------
# Empirical NTK
# ---------------------------------------------------------------------------------------------


def _check_model(
    model: nn.Module, params, buffers, x1: torch.Tensor, x2: torch.Tensor, method: str
) -> tuple[str | None, nn.Module, dict]:
    """Refuse random layers; say why the examples are batch-coupled (``None``: they are not), refusing a
    coupled model for the per-example ``"auto"``/``"structured"`` routes (:mod:`.checks`). Returns the
    reason, the model and the buffers to use: for a coupled model a copy without running-statistics
    updates and copied buffers, so nothing of the caller's model changes."""
    from .checks import COUPLED_FIX, batchnorm_coupling, check_stochastic, probe_checks, without_running_stats

    check_stochastic(model, "ntk")
    coupled = batchnorm_coupling(model)
    if coupled is not None:
        model, dropped = without_running_stats(model)
        buffers = {k: v.clone() for k, v in buffers.items() if k not in dropped}
    probe = x1[:2] if x2 is x1 else torch.cat([x1[:1], x2[:1]])
    try:
        found = probe_checks(lambda x: _flat_out(model, params, buffers, x), probe, "ntk", coupling=coupled is None)
    except (RuntimeError, TypeError, IndexError) as exc:
        raise WidthscopeError(
            f"ntk: the model cannot run on inputs of shape {tuple(probe.shape)} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "pass inputs shaped like the model's training inputs"
        ) from None
    if found is not None:
        coupled = f"the examples are coupled: {found}; {COUPLED_FIX}"
    if coupled is not None and method in ("auto", "structured"):
        raise WidthscopeError(
            f"ntk: {coupled}. A per-example kernel (method={method!r}) assumes each output "
            "depends on its own example only, which does not hold here"
        )
    return coupled, model, buffers


def _plan_costs(
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
) -> dict[str, Any]:
    """Estimate every method's time and memory (:mod:`.cost`); pick the cheapest that fits for ``"auto"``,
    else check that the forced method fits ``budget``. One clear error when nothing fits."""
    from .cost import choose, estimates, measure

    pr = measure(lambda x: _flat_out(model, params, buffers, x), x1 if coupled else x1[:1], params)
    n1 = x1.shape[0]
    n2 = n1 if same else x2.shape[0]
    if batch_size is not None:  # blocks of batch_size examples, one pair at a time
        n1, n2 = min(n1, batch_size), min(n2, batch_size)
    mode = ("diagtrace" if trace else "diag") if diagonal else ("trace" if trace else "full")
    if diagonal and method != "structured":
        n2 = 1  # per-chunk diagonal blocks
    cands: tuple[str, ...] = ("structured", "jacobian", "products") if method == "auto" else (method,)
    if method == "auto" and not _forward_ad_ok(model, params, buffers, x1[:1]):
        cands = ("structured", "jacobian")  # e.g. a fused TransformerEncoder kernel: no forward-mode AD
    if coupled is not None:  # one batch at once: the Jacobian of the whole batch
        cands = tuple(m for m in cands if m != "structured")
    costs = estimates(
        pr=pr,
        plan=P,
        n_params=n_params,
        n_out=n_out,
        n1=n1,
        n2=n2,
        same=same,
        item=itemsize,
        budget=budget,
        mode=mode,
        methods=cands,
    )
    if P is not None and "structured" in costs and P.n_covered == 0:
        costs.pop("structured")  # nothing covered: it is the Jacobian route with extra steps
    if coupled is not None and "jacobian" in costs:  # forced whole-batch chunk
        costs["jacobian"].update(chunk=x1.shape[0], out_chunk=n_out)
    if method == "auto":
        best, reason = choose(costs, budget)
        if best is None:
            raise WidthscopeError(
                f"ntk: {reason}; raise memory_budget, or pass trace=True, diagonal=True or batch_size to need less"
            )
        return {"method": best, "reason": reason, "costs": costs}
    c = costs.get(method)
    if c is not None and not c["fits"]:
        raise WidthscopeError(
            f"ntk: method={method!r} needs about {c['bytes'] / 1e6:.4g} MB at its smallest chunks, "
            f"more than memory_budget={budget / 1e6:.4g} MB; raise memory_budget or let "
            "method='auto' pick one that fits"
        )
    return {"method": method, "reason": f"{method}: asked for", "costs": costs}


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
    r"""Empirical NTK ``Θ_{ab}(x, x') = Σ_θ ∂f_a(x)/∂θ · ∂f_b(x')/∂θ`` (``J(x) J(x')ᵀ``), all output pairs.

    Kernel shapes (outputs flattened to ``out`` components; the learning rate is not included: the
    spec's ``η·Θ`` is ``eta * ntk(...)``):

    - default: ``(n1, n2, out, out)``;
    - ``trace=True``: ``(n1, n2)``, the logit-averaged kernel ``(1/out) Σ_a Θ_aa``. The structured
      path forms only the ``a = b`` blocks: ``out``× fewer Gram flops and memory ``n1·n2``;
    - ``diagonal=True`` (``x2`` must be ``None``): ``(n1, out, out)``, only ``Θ(x_i, x_i)``, computed
      without any off-diagonal example pair (``n1``× fewer flops; memory ``n1·out²``); with
      ``trace=True`` too: ``(n1,)``.

    Memory and precision options:

    - ``batch_size=b``: inputs in blocks of ``b`` examples, so the per-layer signals and Grams held
      at once are those of two blocks (``O(b·out·width)`` and ``O(b²·out²)``) besides the result;
      with ``x2=None`` only the ``i ≤ j`` block pairs are computed. ``x2``'s blocks are kept when
      they fit ``memory_budget`` and recomputed otherwise (one more forward/backward per pair).
    - ``dtype``: the dtype of the accumulator and the result (default: the parameters'). The Gram
      products run in the parameters' dtype; ``dtype=torch.float64`` with a float32 model sums the
      layers' float32 contributions in float64 (to compute the products in float64 too, pass a
      float64 model).

    Algorithms (``method``):

    - ``"structured"`` (:mod:`widthscope.linear.structured`): each covered layer's contribution from
      the Grams of its inputs and of the back-propagated output signals — dense layers (``nn.Linear``,
      ``ScaledLinear``, transformers' ``Conv1D``), ``Conv1d``/``Conv2d``, ``Embedding``, elementwise
      affine norms (LayerNorm, RMSNorm, GroupNorm, eval BatchNorm). One batched backward pass and
      ``O(n1·n2·out²·width)`` products per layer, no Jacobian. Parameters it does not cover (other
      modules, tied/shared weights, layers run twice) are added by the ``"jacobian"`` route
      restricted to them (a hybrid).
    - ``"jacobian"``: per-example Jacobians of ``chunk_size`` inputs at a time (one vmapped
      reverse pass per output), contracted parameter block by parameter block,
      ``Σ_b J_b(x1) J_b(x2)ᵀ``. Memory ``≈ 2·chunk·out·P`` numbers, time ``O((n1+n2)·out)``
      backward passes — fastest when ``out·P`` per example fits.
    - ``"products"``: NTK-vector products, for each column ``(x2_j, b)`` one vjp gives
      ``g = J(x2_j)ᵀe_b`` and one jvp at all of ``x1`` gives ``Θ[:, j, :, b]``. Memory ``O(P)``
      plus activations, but ``n2·out`` jvp passes — for models whose Jacobian rows do not fit.

    ``"auto"`` picks by a cost model (:mod:`widthscope.linear.cost`): from one probe forward pass
    (FLOPs ``F`` and saved bytes ``S`` of one example), ``P``, ``out``, the example counts and the
    structured plan's layer shapes it estimates each method's seconds and peak bytes and takes the
    fastest that fits ``memory_budget`` (``"products"`` only where a jvp runs). ``memory_budget`` bounds
    every method: what ``ntk`` allocates, the returned kernel included, is planned within 85% of it
    by chunks of examples and of outputs (Jacobians), blocks of examples (structured, when
    ``batch_size`` is not given) or chunks of ``x1`` (products); a forced method that cannot fit is
    refused before any work, and an explicit ``chunk_size``/``batch_size`` is not resized. Pass
    ``info={}`` to learn what it did: ``info["method"]``, ``info["reason"]`` (the choice and every
    estimate; ``verbose=True`` prints it), ``info["costs"]`` (per method ``seconds``, ``bytes``,
    ``fits`` and chunking), ``info["covered"]``/``info["uncovered"]`` (parameter counts) and
    ``info["generic"]`` (names of the parameters on the Jacobian path). Floating inputs are cast to
    the parameters' dtype.

    Refused before any work (:mod:`widthscope.linear.checks`): ``memory_budget <= 0``; random layers in
    training mode (dropout: call ``model.eval()``), found by module type and by two forward calls on
    the probe rows; and, for ``"auto"``/``"structured"``, models whose examples are coupled within a
    batch (BatchNorm with batch statistics — training mode or ``track_running_stats=False`` — or any
    op that mixes examples, found by comparing the batched and one-row forward passes of two probe
    rows): a per-example kernel does not exist there. ``method="jacobian"`` or ``"products"`` with
    ``x2=None`` (no ``batch_size``, not ``diagonal``) then computes the batch-coupled kernel
    ``J(X) J(X)ᵀ`` of the batch ``x1`` in one piece, and ``info["batch_coupled"]`` says why.

    Functional API: ``model`` may be a function ``f(params, x)`` with ``params=`` a dict or pytree of
    tensors (every floating leaf is differentiated), as ``torch.func.functional_call`` users write it;
    it takes the ``"jacobian"``/``"products"`` routes (no module structure to exploit).

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
    from .checks import as_module

    fn = "ntk"
    _args.model_or_function(fn, model)
    _args.tensor(fn, "x1", x1, min_ndim=1, accepts="a batched tensor (n1, ...) of inputs")
    _args.tensor(fn, "x2", x2, min_ndim=1, optional=True, accepts="a batched tensor (n2, ...) shaped like x1, or None")
    for name, flag in (("trace", trace), ("diagonal", diagonal), ("verbose", verbose)):
        _args.boolean(fn, name, flag)
    _args.choice(fn, "method", method, ("auto", "structured", "jacobian", "products"))
    _args.mapping(fn, "info", info, mutable=True, accepts="a dict to fill, or None")
    _args.integer(fn, "batch_size", batch_size, lo=1, optional=True)
    _args.dtype(fn, "dtype", dtype)
    model = as_module(model, params, "ntk")
    _check_ntk_args(x1, x2, method, diagonal, batch_size, dtype, memory_budget, chunk_size)
    params, buffers = params_and_buffers(model)
    if not params:
        raise WidthscopeError("ntk: the model has no trainable parameters")
    same = x2 is None
    x1 = as_param_dtype(x1, params)
    x2 = x1 if x2 is None else as_param_dtype(x2, params)
    coupled, model, buffers = _check_model(model, params, buffers, x1, x2, method)
    _check_coupled(coupled, same, batch_size, diagonal, info)
    n_params = sum(p.numel() for p in params.values())
    n_out = first_output(model, params, buffers, x1 if coupled else x1[:1], "ntk").shape[1]
    itemsize = next(iter(params.values())).element_size()
    chunk_size = _coupled_chunk(coupled, method, chunk_size, x1.shape[0])
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
            from .structured import _structured_kernel

            K = _structured_kernel(
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
        K = _explicit_kernel(
            model, params, buffers, x1, x2, same, method, c, chunk_size, n_out, coupled, diagonal, batch_size
        )
    except (RuntimeError, NotImplementedError) as exc:
        _reraise_attention(exc, model)
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
    import math

    if not isinstance(x1, torch.Tensor) or x1.dim() < 1:
        raise WidthscopeError("ntk: x1 must be a batched tensor (n1, ...) of inputs")
    if x2 is not None and (not isinstance(x2, torch.Tensor) or x2.shape[1:] != x1.shape[1:]):
        raise WidthscopeError(f"ntk: x2 must be a tensor shaped like x1 (n2, {tuple(x1.shape[1:])})")
    if method not in ("auto", "structured", "jacobian", "products"):
        raise WidthscopeError(f"ntk: unknown method {method!r}; use 'auto', 'structured', 'jacobian' or 'products'")
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
    from .structured import plan as structured_plan

    P = None
    if method in ("auto", "structured"):
        try:
            P = structured_plan(model, x1 if same else torch.cat([x1[:1], x2[:1]]))
        except (RuntimeError, NotImplementedError) as exc:
            _reraise_attention(exc, model)
            raise
    plan_ = _plan_costs(
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
            return _ntk_jacobian(model, params, buffers, a, b, chunk_size, same_ab, out_chunk)
        return _ntk_products(model, params, buffers, a, b, None if coupled else c.get("chunk"), coupled is not None)

    if diagonal:  # Θ(x_i, x_i) from per-chunk blocks: the off-diagonal chunks are never formed
        step = min(chunk_size, batch_size or chunk_size) if method == "jacobian" else 1
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
