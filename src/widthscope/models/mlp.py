"""Fully connected networks in standard, NTK and μP parametrisation.

Every layer is a :class:`ScaledLinear`; the parametrisations differ in how ``init_std`` and
``multiplier`` depend on the fan-in (table in docs/models-data.md).

Example::

    >>> import torch
    >>> from widthscope.models import build
    >>> m = build("mlp", 128, in_dim=64, out_dim=10, parametrization="ntk")
    >>> m(torch.randn(5, 64)).shape
    torch.Size([5, 10])
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable

import torch
from torch import nn

from ..errors import WidthscopeError

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "erf": torch.erf,
    "gelu": nn.functional.gelu,
    "sigmoid": torch.sigmoid,
}
PARAMETRIZATIONS = ("standard", "ntk", "mup")


class ScaledLinear(nn.Module):
    """``y = multiplier · x wᵀ + b`` with ``w ~ N(0, init_std²)``, ``b ~ N(0, bias_std²)``."""

    def __init__(
        self, n_in: int, n_out: int, *, init_std: float, multiplier: float, bias: bool = True, bias_std: float = 0.0
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = n_in, n_out
        self.init_std, self.multiplier, self.bias_std = float(init_std), float(multiplier), float(bias_std)
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.bias = nn.Parameter(torch.empty(n_out)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.normal_(0.0, self.init_std)
            if self.bias is not None:
                self.bias.normal_(0.0, self.bias_std) if self.bias_std > 0 else self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(x, self.weight) * self.multiplier
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (
            f"{self.in_features}, {self.out_features}, init_std={self.init_std:.4g}, "
            f"multiplier={self.multiplier:.4g}, bias={self.bias is not None}"
        )


class Activation(nn.Module):
    """Wraps an activation function so hooks and ``get_submodule`` see it."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], name: str) -> None:
        super().__init__()
        self.fn, self.name = fn, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return self.name


class Block(nn.Module):
    """One hidden layer: ``act(linear(x))``; its output is an insertion point."""

    def __init__(self, linear: ScaledLinear, act: Activation) -> None:
        super().__init__()
        self.linear, self.act = linear, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.linear(x))


class MLP(nn.Module):
    """``depth`` hidden layers of ``width`` units, then a linear read-out (inputs are flattened)."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        width: int,
        depth: int,
        act: Activation,
        parametrization: str,
        sigma_w: float,
        bias: bool,
        sigma_b: float,
    ) -> None:
        super().__init__()
        self.in_dim = in_dim
        dims = [in_dim] + [width] * depth
        blocks = []
        for i in range(depth):
            std, mult = _scales(parametrization, "input" if i == 0 else "hidden", dims[i], width, sigma_w)
            blocks.append(
                Block(ScaledLinear(dims[i], width, init_std=std, multiplier=mult, bias=bias, bias_std=sigma_b), act)
            )
        self.blocks = nn.Sequential(*blocks)
        std, mult = _scales(parametrization, "output", width, width, sigma_w)
        self.head = ScaledLinear(width, out_dim, init_std=std, multiplier=mult, bias=bias, bias_std=sigma_b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_floating_point():
            raise WidthscopeError(
                f"mlp expects float features, got {x.dtype} of shape {tuple(x.shape)} "
                "(integer token ids belong to a llama/pythia model; convert other "
                "inputs with x.float())"
            )
        if x.dim() != 2:
            x = x.flatten(1)
        if x.shape[1] != self.in_dim:
            raise WidthscopeError(
                f"mlp expects inputs with {self.in_dim} features per example, "
                f"got shape {tuple(x.shape)}; build it with in_dim={x.shape[1]}"
            )
        return self.head(self.blocks(x))


def _scales(parametrization: str, kind: str, n_in: int, width: int, sigma_w: float) -> tuple[float, float]:
    """(init_std, multiplier) of one layer (the table of docs/models-data.md)."""
    if parametrization == "standard":
        return sigma_w / math.sqrt(n_in), 1.0
    if parametrization == "ntk":
        return 1.0, sigma_w / math.sqrt(n_in)
    if kind == "input":
        return 1.0 / math.sqrt(width), sigma_w * math.sqrt(width / n_in)
    if kind == "hidden":
        return sigma_w / math.sqrt(n_in), 1.0
    return 1.0 / math.sqrt(n_in), sigma_w / math.sqrt(n_in)


def build_mlp(
    width: int,
    *,
    in_dim: int,
    out_dim: int,
    depth: int = 2,
    activation: str | Callable[[torch.Tensor], torch.Tensor] = "relu",
    parametrization: str = "standard",
    sigma_w: float = 1.0,
    bias: bool = True,
    sigma_b: float = 0.0,
) -> tuple[nn.Module, dict, list[str]]:
    if callable(activation):
        fn, act_name = activation, f"<callable {getattr(activation, '__name__', type(activation).__name__)}>"
    else:
        if activation not in ACTIVATIONS:
            raise WidthscopeError(
                f"unknown activation {activation!r}; valid: {', '.join(ACTIVATIONS)} (or pass a callable from Python)"
            )
        fn, act_name = ACTIVATIONS[activation], activation
    if parametrization not in PARAMETRIZATIONS:
        raise WidthscopeError(f"unknown parametrization {parametrization!r}; valid: {', '.join(PARAMETRIZATIONS)}")
    for name, v in (("width", width), ("in_dim", in_dim), ("out_dim", out_dim), ("depth", depth)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise WidthscopeError(f"mlp option {name} must be a positive integer, got {v!r}")
    if not (sigma_w > 0):
        raise WidthscopeError(f"mlp option sigma_w must be > 0, got {sigma_w!r}")
    activation, sigma_w, bias, sigma_b = act_name, float(sigma_w), bool(bias), float(sigma_b)
    values = locals()  # the recorded options: every parameter, in signature order
    config: dict[str, Any] = {"family": "mlp"} | {k: values[k] for k in inspect.signature(build_mlp).parameters}
    model = MLP(act=Activation(fn, act_name), **{k: v for k, v in config.items() if k not in ("family", "activation")})
    return model, config, [f"blocks.{i}" for i in range(depth)]
