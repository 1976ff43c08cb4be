"""Width-controlled model families: ``mlp``, ``resnet20``, ``llama``, ``pythia``.

:func:`build` returns an ``nn.Module`` with ``widthscope_config`` (``build(**config)`` rebuilds the
architecture) and ``widthscope_points`` (its insertion points). Options: docs/models-data.md.

Example::

    >>> import torch
    >>> from widthscope.models import build, count_parameters, describe
    >>> _ = torch.manual_seed(0)
    >>> m = build("mlp", 64, in_dim=40, out_dim=10, depth=2)
    >>> count_parameters(m)        # (40*64+64) + (64*64+64) + (64*10+10)
    7434
    >>> m2 = build(**m.widthscope_config)
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from ..errors import WidthscopeError
from .lm import build_llama, build_pythia
from .mlp import build_mlp
from .resnet import build_resnet20

_BUILDERS: dict[str, Callable[..., tuple[nn.Module, dict, list[str]]]] = {
    "mlp": build_mlp,
    "resnet20": build_resnet20,
    "llama": build_llama,
    "pythia": build_pythia,
}
FAMILIES = tuple(_BUILDERS)

__all__ = ["FAMILIES", "build", "count_parameters", "describe"]


def build(family: str, width: int | float | None = None, **options: Any) -> nn.Module:
    """Build a model of ``family`` at ``width`` (hidden units, channel multiplier or hidden size) with the
    family builder's keyword ``options``."""
    if family not in FAMILIES:
        raise WidthscopeError(f"unknown model family {family!r}; valid: {', '.join(FAMILIES)}")
    if family == "mlp":
        if width is None:
            raise WidthscopeError("mlp needs a width (hidden units), e.g. build('mlp', 128, in_dim=..., out_dim=...)")
        missing = [k for k in ("in_dim", "out_dim") if k not in options]
        if missing:
            raise WidthscopeError(f"mlp needs option(s) {', '.join(missing)} (input features, outputs)")
    fn = _BUILDERS[family]  # the family's builder; each checks its width
    try:
        model, config, points = fn(width, **options)
    except TypeError as exc:
        if "unexpected keyword" not in str(exc):
            raise
        raise WidthscopeError(
            f"bad option for model family {family!r}: {exc}; see help(widthscope.models.build)"
        ) from None
    model.widthscope_config = config  # type: ignore[assignment]
    model.widthscope_points = points  # type: ignore[assignment]
    return model


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of distinct parameter entries (``parameters()`` counts tied tensors once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def describe(model: nn.Module) -> str:
    """One line: family, width, depth, parameter count, e.g. ``mlp width=64 depth=2 params=7,434``."""
    cfg = getattr(model, "widthscope_config", None) or {}
    family = cfg.get("family", type(model).__name__)
    parts = [str(family), f"width={cfg.get('width', '?')}"]
    points = getattr(model, "widthscope_points", None)
    depth = 20 if family == "resnet20" else cfg.get("depth", len(points) if points else None)
    if depth is not None:
        parts.append(f"depth={int(depth)}")
    if cfg.get("parametrization"):
        parts.append(f"param={cfg['parametrization']}")
    parts.append(f"params={count_parameters(model):,}")
    return " ".join(parts)
