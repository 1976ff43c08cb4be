"""A per-model cache (weak keys) of what :func:`widthscope.linear.ntk` learns from probe passes, keyed by
the model's parameters, buffers and submodules (names, shapes, dtypes, identities, modes) and the inputs'
per-example shape and dtype; the correctness checks also by the tensors' version counters."""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch import nn

__all__ = ["cached", "peek", "store", "clear", "session", "versions", "MISSING"]

MISSING = object()

_CACHE: weakref.WeakKeyDictionary[nn.Module, dict[tuple, Any]] = weakref.WeakKeyDictionary()
MAX_ENTRIES = 16  # per model: a few input shapes × probes


_SESSION: list[tuple[nn.Module, tuple]] = []  # (model, its architecture key) for the call in progress


def _arch(model: nn.Module) -> tuple:
    return (
        tuple((n, tuple(p.shape), p.dtype, p.device, p.requires_grad, id(p)) for n, p in model.named_parameters()),
        tuple((n, tuple(b.shape), b.dtype, b.device) for n, b in model.named_buffers()),
        tuple((id(m), m.training) for m in model.modules()),
    )


def versions(model: nn.Module) -> tuple:
    """Every parameter's and buffer's in-place version counter (``-1`` for inference tensors)."""
    out = []
    for t in (*model.parameters(), *model.buffers()):
        try:
            out.append(t._version)
        except RuntimeError:  # an inference tensor keeps no version counter
            out.append(-1)
    return tuple(out)


def _key(model: nn.Module, x: torch.Tensor, extra: tuple) -> tuple:
    arch = _SESSION[-1][1] if _SESSION and _SESSION[-1][0] is model else _arch(model)
    return (arch, tuple(x.shape[1:]), x.dtype, extra)


@contextmanager
def session(model: nn.Module) -> Iterator[None]:
    """Within it, ``model``'s architecture key is computed once (one ``ntk`` call: the model does not change)."""
    _SESSION.append((model, _arch(model)))
    try:
        yield
    finally:
        _SESSION.pop()


def cached(model: nn.Module, x: torch.Tensor, extra: tuple, compute: Callable[[], Any]) -> Any:
    """``compute()``, or what it returned before for the same model, inputs ``x`` and ``extra`` (probe name, rows)."""
    value = peek(model, x, extra)
    if value is MISSING:
        value = compute()
        store(model, x, extra, value)
    return value


def peek(model: nn.Module, x: torch.Tensor, extra: tuple) -> Any:
    """What :func:`store` (or :func:`cached`) recorded under this key, else :data:`MISSING`."""
    return _CACHE.get(model, {}).get(_key(model, x, extra), MISSING)


def store(model: nn.Module, x: torch.Tensor, extra: tuple, value: Any, *, latest: bool = False) -> None:
    """Record ``value`` under the key of :func:`cached`; ``latest``: drop the entries whose key differs only in
    ``extra``'s last item (stale :func:`versions`)."""
    per_model = _CACHE.setdefault(model, {})
    key = _key(model, x, extra)
    if latest:
        for k in [k for k in per_model if k[:-1] == key[:-1] and k[-1][:-1] == extra[:-1]]:
            del per_model[k]
    if len(per_model) >= MAX_ENTRIES:
        per_model.pop(next(iter(per_model)))
    per_model[key] = value


def clear(model: nn.Module | None = None) -> None:
    """Forget the probes of ``model`` (all models: ``None``)."""
    if model is None:
        _CACHE.clear()
    else:
        _CACHE.pop(model, None)
