"""Insertion points: which module outputs the probe differentiates the loss with respect to.

An insertion point is a submodule name; the default points are the block outputs, in order of
preference: ``model.widthscope_points``; a Hugging Face model's main stack; the children of the
outermost containers of same-class blocks; else every child but the last of the longest
``nn.Sequential``/``nn.ModuleList`` of layers.

Example::

    >>> import torch.nn as nn
    >>> from widthscope.probe import insertion_points
    >>> mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> insertion_points(mlp)
    ['0', '1']
"""

from __future__ import annotations

import difflib
from typing import Iterable

import torch.nn as nn

from .. import _args
from ..errors import WidthscopeError
from .structure import is_block, main_stack

__all__ = ["insertion_points", "all_points", "resolve_points"]


def all_points(model: nn.Module) -> list[str]:
    """Every named submodule of ``model`` (any of them can be an insertion point)."""
    return [name for name, _ in model.named_modules() if name]


def _children_names(prefix: str, container: nn.Module) -> list[str]:
    return [f"{prefix}.{c}" if prefix else c for c, _ in container.named_children()]


def _generic_points(model: nn.Module) -> list[str]:
    containers = [
        (n, m) for n, m in model.named_modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2
    ]
    # homogeneous containers of blocks, outermost only
    chosen: list[str] = []
    for name, m in containers:
        kids = list(m.children())
        if not all(is_block(k) for k in kids) or len({type(k) for k in kids}) != 1:
            continue
        if any(name == c or name.startswith(c + ".") or (c == "" and name) for c in chosen):
            continue  # nested inside a block we already use
        chosen.append(name)
    if chosen:
        return [p for c in chosen for p in _children_names(c, dict(model.named_modules())[c])]
    # else the longest container of layers (an MLP), minus its output layer
    if containers:
        name, m = max(containers, key=lambda nm: len(nm[1]))
        return _children_names(name, m)[:-1]
    raise WidthscopeError(
        f"cannot guess insertion points for {type(model).__name__}: it has no nn.ModuleList or "
        f"nn.Sequential of blocks. Pass points=[...] (e.g. {all_points(model)[:5]}) or set "
        "model.widthscope_points = [...]"
    )


def insertion_points(model: nn.Module) -> list[str]:
    """The default insertion points of ``model``: its block outputs (see the module docstring)."""
    _args.module("insertion_points", "model", model)
    declared = getattr(model, "widthscope_points", None)
    if declared:
        return resolve_points(model, list(declared))
    if _is_hf(model):
        try:
            return main_stack(model)
        except WidthscopeError:
            pass
    return _generic_points(model)


def _is_hf(model: nn.Module) -> bool:
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers") for c in type(model).__mro__)


def _unknown_message(bad: str, valid: list[str], limit: int = 12, defaults: list[str] | None = None) -> str:
    close = difflib.get_close_matches(bad, valid, n=5, cutoff=0.4)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    parts = []
    if defaults:
        shown = ", ".join(defaults[:limit]) + (f", ... ({len(defaults) - limit} more)" if len(defaults) > limit else "")
        parts.append(f"block outputs (the defaults): {shown}")
    if close:
        parts.append(f"closest module names: {', '.join(close)}")
    n_other = len(valid) - len(set(defaults or []) | set(close))
    if n_other > 0:
        parts.append(
            f"{n_other} other module(s): list them with `widthscope certify --list-points --all` "
            "or widthscope.probe.all_points(model)"
        )
    return f"unknown insertion point {bad!r}.{hint} " + "; ".join(parts)


def resolve_points(model: nn.Module, points: str | Iterable[str] | None) -> list[str]:
    """``points`` (a list or a comma string; ``None``: the defaults) checked to name submodules."""
    if points is None:
        return insertion_points(model)
    if isinstance(points, str):
        points = [p.strip() for p in points.split(",") if p.strip()]
    names = list(points)
    if not names:
        defaults = insertion_points(model)
        shown = ", ".join(defaults[:8]) + (", ..." if len(defaults) > 8 else "")
        raise WidthscopeError(
            "no insertion points given (an empty list or --points ''); name some, "
            f"or omit them (points=None) for the defaults: {shown}"
        )
    valid = all_points(model)
    valid_set = set(valid)
    out: list[str] = []
    for p in names:
        if not isinstance(p, str):
            raise WidthscopeError(f"insertion point names must be strings, got {p!r}")
        if p not in valid_set:
            declared = getattr(model, "widthscope_points", None)
            try:  # the declared list itself may hold the bad name: then do not recurse into it
                defaults = [] if declared is not None and p in declared else insertion_points(model)
            except WidthscopeError:
                defaults = []
            raise WidthscopeError(_unknown_message(p, valid, defaults=defaults))
        if p not in out:
            out.append(p)
    return out
