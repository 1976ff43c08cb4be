"""The main stack of repeated blocks of a module tree, and eager attention for forward-mode AD."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn

from ..errors import WidthscopeError

__all__ = ["main_stack", "is_block", "eager_attention", "eager_attention_for"]


def is_block(m: nn.Module) -> bool:
    """A module with layers of its own (a leaf layer such as Linear is not a block)."""
    return any(True for _ in m.children()) and any(True for _ in m.parameters())


def main_stack(model: nn.Module) -> list[str]:
    """Block outputs of the main stack: the largest (then outermost) ``nn.ModuleList`` of same-class blocks."""
    best: tuple[int, str, nn.Module] | None = None
    for name, m in model.named_modules():
        kids = list(m.children())
        stack = isinstance(m, nn.ModuleList) and len({type(k) for k in kids}) == 1 and all(map(is_block, kids))
        if stack and (best is None or len(kids) > best[0]):
            best = (len(kids), name, m)
    if best is None:
        raise WidthscopeError(
            f"{type(model).__name__} has no stack of repeated blocks (an nn.ModuleList of "
            "same-class blocks); pass --points (list them with --list-points --all)"
        )
    _, name, m = best
    return [f"{name}.{c}" if name else c for c, _ in m.named_children()]


def eager_attention(model: nn.Module) -> nn.Module:
    """Switch a transformers model to eager attention (forward-mode AD cannot go through fused kernels)."""
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter) and getattr(getattr(model, "config", None), "_attn_implementation", "eager") != "eager":
        setter("eager")
    return model


@contextmanager
def eager_attention_for(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` with eager attention inside the block, then restore its implementation."""
    before = getattr(getattr(model, "config", None), "_attn_implementation", None)
    switch = before not in (None, "eager")
    if switch:
        eager_attention(model)
    try:
        yield model
    finally:
        setter = getattr(model, "set_attn_implementation", None)
        if switch and callable(setter):
            setter(before)
