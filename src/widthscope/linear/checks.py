r"""What the kernel tools check before they compute: random layers, batch-coupled examples, and plain
functions ``f(params, x)`` as modules (:class:`FunctionModel`).

Example::

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.1), torch.nn.Linear(4, 1))
    >>> stochastic_modules(net)
    ["Dropout '1' (p=0.1)"]
    >>> stochastic_modules(net.eval())
    []
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import WidthscopeError

__all__ = [
    "stochastic_modules",
    "check_stochastic",
    "batchnorm_coupling",
    "probe_checks",
    "FunctionModel",
    "as_module",
    "without_running_stats",
    "check_running_stats",
    "COUPLED_FIX",
]

COUPLED_FIX = "method='jacobian' (x2=None, no batch_size) gives the batch-coupled kernel J(X) J(X)ᵀ of this one batch"


def _dropout_attrs(m: nn.Module) -> list[tuple[str, float]]:
    return [
        (k, float(v))
        for k, v in vars(m).items()
        if "dropout" in k.lower() and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    ]


def is_candidate(m: nn.Module) -> bool:
    """Could ``m`` draw random numbers in training mode (whatever its mode now)?"""
    return isinstance(m, (nn.modules.dropout._DropoutNd, nn.RReLU)) or bool(_dropout_attrs(m))


def _active(name: str, m: nn.Module) -> str | None:
    if not m.training:
        return None
    if isinstance(m, nn.modules.dropout._DropoutNd):
        return f"{type(m).__name__} {name!r} (p={m.p})" if m.p > 0 else None
    if isinstance(m, nn.RReLU):
        return f"RReLU {name!r} (random slopes)" if m.lower != m.upper else None
    attrs = _dropout_attrs(m)
    return f"{type(m).__name__} {name!r} ({attrs[0][0]}={attrs[0][1]})" if attrs else None


def stochastic_modules(model: nn.Module, candidates: list[tuple[str, nn.Module]] | None = None) -> list[str]:
    """Descriptions of the modules that draw random numbers in the next forward pass (training mode)."""
    mods = candidates if candidates is not None else [(n, m) for n, m in model.named_modules() if is_candidate(m)]
    return [d for n, m in mods if (d := _active(n, m)) is not None]


def check_stochastic(
    model: nn.Module, who: str, opt_in: str = "", candidates: list[tuple[str, nn.Module]] | None = None
) -> None:
    """Raise when a module of ``model`` would draw random numbers (module docstring)."""
    found = stochastic_modules(model, candidates)
    if found:
        more = f" and {len(found) - 1} more" if len(found) > 1 else ""
        raise WidthscopeError(
            f"{who}: {found[0]}{more} is in training mode and draws new random numbers on every "
            "call, so the result would change from call to call; call model.eval() first" + opt_in
        )


def batchnorm_coupling(model: nn.Module, jacobian_fix: bool = True) -> str | None:
    """Why a BatchNorm couples the examples of a batch (``None``: none does); ``jacobian_fix``: the
    message ends with the ``method='jacobian'`` alternative (``ntk`` has one, ``nngp`` not)."""
    alt = f", or {COUPLED_FIX}" if jacobian_fix else ""
    for name, m in model.named_modules():
        if not isinstance(m, nn.modules.batchnorm._BatchNorm):
            continue
        kind = type(m).__name__
        if not m.track_running_stats:
            return (
                f"{kind} {name!r} uses batch statistics: it has track_running_stats=False, so it normalises "
                "with the batch's mean and variance even in eval mode (model.eval() does not change this) "
                "and each example's output depends on the whole batch; build it with "
                "track_running_stats=True (running statistics in eval mode) or use a norm that does not "
                f"couple examples (LayerNorm, GroupNorm){alt}"
            )
        if m.training:
            return (
                f"{kind} {name!r} uses batch statistics (training mode), which couple the examples (each "
                f"example's output depends on the whole batch); call model.eval() first (running statistics){alt}"
            )
    return None


def _updates_running_stats(m: nn.Module) -> bool:
    return isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats


def without_running_stats(model: nn.Module) -> tuple[nn.Module, set[str]]:
    """A copy of ``model`` (parameters shared) whose training-mode BatchNorms keep no running statistics (the
    same function, without the in-place updates ``torch.func`` refuses), and the dropped buffers' names."""
    bns = [(n, m) for n, m in model.named_modules() if _updates_running_stats(m)]
    if not bns:
        return model, set()
    memo = {id(p): p for p in model.parameters()}
    copy_ = copy.deepcopy(model, memo)
    dropped = set()
    for n, _ in bns:
        m = copy_.get_submodule(n)
        assert isinstance(m, nn.modules.batchnorm._BatchNorm)  # the copy of the BatchNorm named n
        m.track_running_stats = False
        for b in ("running_mean", "running_var", "num_batches_tracked"):
            if getattr(m, b, None) is not None:
                setattr(m, b, None)
                dropped.add(f"{n}.{b}" if n else b)
    return copy_, dropped


def check_running_stats(mods: list[tuple[str, nn.Module]], who: str) -> None:
    """Refuse a training-mode BatchNorm that updates running statistics in place (the jvp cannot)."""
    for name, m in mods:
        if _updates_running_stats(m):
            raise WidthscopeError(
                f"{who}: {type(m).__name__} {name!r} is in training mode and updates its running "
                "statistics in place on every call, which the linear model's forward-mode "
                "derivative (jvp) cannot run through; call model.eval() first (running "
                "statistics), or build it with track_running_stats=False (batch statistics, "
                "no updates)"
            )


def _tol(t: torch.Tensor) -> float:
    return min(0.05, 1e4 * torch.finfo(t.dtype).eps) if t.is_floating_point() else 0.0


def probe_checks(run: Callable[[Any], torch.Tensor], probe: Any, who: str, *, coupling: bool = True) -> str | None:
    """Run ``run`` (inputs → ``(n, out)``) on the probe rows: raise when two identical calls differ; return why
    the examples are coupled when batched and one-row outputs differ (``None``: they agree)."""
    with torch.no_grad():
        a, b = run(probe), run(probe)
        scale = float(a.abs().max()) if a.numel() else 0.0
        tol = _tol(a) * max(scale, 1e-30)
        if a.shape != b.shape or bool(((a - b).abs() > tol).any()):
            raise WidthscopeError(
                f"{who}: two calls of the forward pass on the same inputs differ (by up to "
                f"{float((a - b).abs().max()):.3g}): the model draws random numbers (e.g. "
                "functional dropout in training mode); call model.eval() first, or make the "
                "forward pass deterministic"
            )
        if not coupling or probe.shape[0] < 2:
            return None
        try:
            one = torch.cat([run(probe[i : i + 1]) for i in range(probe.shape[0])])
        except (RuntimeError, ValueError) as exc:
            return (
                f"the model fails on a single example ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}), "
                "so its outputs depend on the batch"
            )
        dev = float((one - a).abs().max())
        if dev > tol:
            return (
                f"an example's output changes when other examples share its batch (by up to {dev:.3g}, "
                f"outputs up to {scale:.3g}): some operation mixes examples (batch statistics, "
                "x - x.mean(0), attention across the batch dimension)"
            )
    return None


def _leaf_names(params: Any, leaves: list) -> list[str]:
    if isinstance(params, dict) and all(isinstance(k, str) for k in params) and len(params) == len(leaves):
        return [k.replace(".", "__") or "_" for k in params]
    return [f"p{i}" for i in range(len(leaves))]


class _Shared:
    """Holds the function and the pytree layout: shared by copies (``linearize`` deep-copies its model)."""

    def __init__(self, f: Callable[..., Any], spec: Any):
        self.f, self.spec = f, spec

    def __deepcopy__(self, memo: dict) -> _Shared:
        return self


class FunctionModel(nn.Module):
    """``f(params, x)`` as a module: the floating tensor leaves of ``params`` are its parameters (named by the
    dict's keys, ``.`` → ``__``, else ``p0, p1, …``), other tensors buffers, other leaves constants (shared)."""

    def __init__(self, f: Callable[..., Any], params: Any):
        super().__init__()
        leaves, spec = tree_flatten(params)
        if not any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in leaves):
            raise WidthscopeError(
                "params must be a dict (or pytree) holding at least one floating tensor, "
                f"got {type(params).__name__}; pass e.g. dict(model.named_parameters())"
            )
        self._fn = _Shared(f, spec)
        self._slots: list[tuple[str, Any]] = []
        for name, v in zip(_leaf_names(params, leaves), leaves):
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                self.register_parameter(name, nn.Parameter(v.detach(), requires_grad=True))
            elif isinstance(v, torch.Tensor):
                self.register_buffer(name, v.detach())
            self._slots.append(("attr", name) if isinstance(v, torch.Tensor) else ("const", v))

    def pytree(self) -> Any:
        """The ``params`` pytree built from this module's current parameters and buffers."""
        return tree_unflatten([getattr(self, v) if k == "attr" else v for k, v in self._slots], self._fn.spec)

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        return self._fn.f(self.pytree(), x, *args, **kwargs)


def as_module(model: Any, params: Any, who: str) -> nn.Module:
    """``model`` itself (an ``nn.Module``, ``params`` must be ``None``) or ``FunctionModel(model, params)``."""
    if isinstance(model, nn.Module):
        if params is not None:
            raise WidthscopeError(
                f"{who}: params= is for a plain function f(params, x); an nn.Module carries its "
                "own parameters: drop params= (or pass the function instead of the module)"
            )
        return model
    if callable(model):
        if params is None:
            raise WidthscopeError(
                f"{who}: got a function, not an nn.Module: pass its parameters as params= (a dict "
                "or pytree of tensors; it is called as f(params, x)), or pass an nn.Module"
            )
        try:
            return FunctionModel(model, params)
        except WidthscopeError as exc:
            raise WidthscopeError(f"{who}: {exc}") from None
    raise WidthscopeError(f"{who}: expected an nn.Module or a function f(params, x), got {type(model).__name__}")
