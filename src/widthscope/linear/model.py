"""The linear (first-order Taylor) model of a network ``F(x; θ)`` around ``θ₀``,
``F_lin(x; θ) = F(x; θ₀) + J(x; θ₀)·(θ − θ₀)``, evaluated with one ``torch.func.jvp`` per call.

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
from typing import Any, Callable

import torch
from torch import nn
from torch.func import functional_call, jvp
from torch.utils._pytree import tree_flatten, tree_unflatten

from .. import _args
from ..errors import WidthscopeError
from ..probe.structure import eager_attention
from ._core import params_and_buffers, reraise_attention
from .checks import as_module, check_running_stats, check_stochastic, is_candidate

__all__ = ["LinearizedModel", "linearize"]

_STOCHASTIC_OPT_IN = (
    ", or pass allow_stochastic=True to linearise each call's random draw (primal and tangent share it)"
)


def _safe(name: str) -> str:
    return name.replace(".", "__")  # module attribute names have no dots


class LinearizedModel(nn.Module):
    """``F_lin(x; θ) = F(x; θ₀) + jvp(F(x; ·), θ₀, θ − θ₀)``, trainable like any module.

    Its parameters ``θ`` start as copies of the model's (dots in names → ``__``); ``θ₀`` and the model's
    buffers are buffers. The wrapped model is not a registered submodule, so ``parameters()`` is ``θ``."""

    _base: nn.Module  # the wrapped model, set with object.__setattr__ (unregistered)

    def __init__(self, model: nn.Module, *, allow_stochastic: bool = False):
        super().__init__()

        if not allow_stochastic:
            check_stochastic(model, "linearize", _STOCHASTIC_OPT_IN)
        check_running_stats(list(model.named_modules()), "linearize")

        # a private copy in eager attention (jvp needs it); only its structure is used, so its storage is freed
        base = eager_attention(copy.deepcopy(model))
        for p in base.parameters():
            p.requires_grad_(False)
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        object.__setattr__(self, "_base", base)  # unregistered on purpose (see docstring)
        self._allow_stochastic = bool(allow_stochastic)
        self._stochastic = [(n, m) for n, m in base.named_modules() if is_candidate(m)]
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

    def _apply(self, fn, recurse=True):  # keep the unregistered base on the same device/dtype
        super()._apply(fn, recurse)
        self._base._apply(fn, recurse)
        return self

    def train(self, mode: bool = True) -> LinearizedModel:
        super().train(mode)
        self._base.train(mode)
        return self

    def _tensors(self, prefix: str, names: list[str]) -> dict[str, torch.Tensor]:
        return {k: getattr(self, prefix + _safe(k)) for k in names}

    def theta0(self) -> dict[str, torch.Tensor]:
        """The start ``θ₀``, keyed by the original model's names."""
        return self._tensors("theta0__", self._names)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self._allow_stochastic:  # lin.train() may have switched random layers on
            check_stochastic(self._base, "linearized model", _STOCHASTIC_OPT_IN, self._stochastic)
        check_running_stats(self._bn, "linearized model")
        theta, theta0, bufs = self._tensors("", self._names), self.theta0(), self._tensors("buf__", self._buffer_names)
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
            reraise_attention(exc, self._base)
            raise
        summed = iter([a + b for a, b in zip(out, tangent)])
        treedef, is_tensor = spec
        return tree_unflatten([next(summed) if t else None for t in is_tensor], treedef)


def linearize(
    model: nn.Module | Callable[..., Any], *, params: Any = None, allow_stochastic: bool = False
) -> LinearizedModel:
    """The linear model ``F(x; θ₀) + ∇_θF(x; θ₀)·(θ − θ₀)`` of ``model`` (a copy; or a function ``f(params, x)``
    with ``params=``) around its current parameters. Random layers in training mode are refused unless
    ``allow_stochastic=True`` (each call then linearises its own random draw).

    Example::

        >>> import torch, widthscope
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        >>> lin = widthscope.linearize(net)
        >>> opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        >>> lin(torch.randn(3, 2)).sum().backward(); opt.step()
    """
    _args.model_or_function("linearize", model)
    _args.boolean("linearize", "allow_stochastic", allow_stochastic)
    return LinearizedModel(as_module(model, params, "linearize"), allow_stochastic=allow_stochastic)
