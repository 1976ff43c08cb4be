"""Structure of a module tree that the maths needs and any model has: the main stack of repeated
blocks (the default insertion points) and eager attention for forward-mode AD (fused attention
kernels have no jvp). No I/O; :mod:`widthscope.models.hf` re-exports these for checkpoint code."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import WidthscopeError

__all__ = ["main_stack", "is_block", "eager_attention", "eager_attention_for"]


def is_block(m: nn.Module) -> bool:
    """A module with layers of its own (a leaf layer such as Linear is not a block)."""
    return any(True for _ in m.children()) and any(True for _ in m.parameters())


def main_stack(model: nn.Module) -> list[str]:
    """Block outputs of the main stack: the largest ``nn.ModuleList`` of same-class blocks.

    Ties go to the outermost (first in module order). Raises when the model has none.
    """
    best: tuple[int, str, nn.Module] | None = None
    for name, m in model.named_modules():
        if not isinstance(m, nn.ModuleList) or len(m) < 1:
            continue
        kids = list(m.children())
        if len({type(k) for k in kids}) != 1:
            continue
        if not all(is_block(k) for k in kids):
            continue
        if best is None or len(kids) > best[0]:
            best = (len(kids), name, m)
    if best is None:
        raise WidthscopeError(
            f"{type(model).__name__} has no stack of repeated blocks (an nn.ModuleList of "
            "same-class blocks); pass --points (list them with --list-points --all)"
        )
    _, name, m = best
    return [f"{name}.{c}" if name else c for c, _ in m.named_children()]


def eager_attention(model: nn.Module) -> nn.Module:
    """Switch a transformers model to eager attention (forward-mode AD cannot go through fused
    kernels); no-op for other modules. Returns the model."""
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter) and getattr(getattr(model, "config", None), "_attn_implementation", "eager") != "eager":
        setter("eager")
    return model


class eager_attention_for:  # noqa: N801 - used like a function: ``with eager_attention_for(model):``
    """Run ``model`` with eager attention inside the block, then restore its implementation.

    Eager and fused attention compute the same function (to rounding); only forward-mode AD
    needs the eager one, so reverse-mode code keeps the checkpoint's kernels.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.before: str | None = None

    def __enter__(self) -> nn.Module:
        cfg = getattr(self.model, "config", None)
        self.before = getattr(cfg, "_attn_implementation", None)
        if self.before not in (None, "eager"):
            eager_attention(self.model)
        return self.model

    def __exit__(self, *exc: Any) -> None:
        setter = getattr(self.model, "set_attn_implementation", None)
        if self.before not in (None, "eager") and callable(setter):  # eager_attention switched only then
            setter(self.before)
