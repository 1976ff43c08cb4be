"""Argument checks of the public Python API: one line naming ``function(param=...)``, what it accepts and
what it got (a wrong type: :class:`~widthscope.errors.WidthscopeTypeError`); each checker returns the value.

Example::

    >>> integer("certify", "draws", 2.5, lo=1)
    Traceback (most recent call last):
    ...
    widthscope.errors.WidthscopeTypeError: certify(draws=...): draws must be a positive integer, got float 2.5
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping
from typing import Any, Callable, Iterable, cast

import numpy as np
import torch
from torch import nn

from .errors import WidthscopeError, WidthscopeTypeError

MODULE = "a torch.nn.Module (e.g. a transformers PreTrainedModel)"
# Worded as the probe's own error for a bad batch ("expected (x, y), ..."), which tests match.
BATCH = "(x, y) pairs, LongTensors of token ids (B, T) or dicts with 'input_ids'"
_REPR = 40  # characters of a value's repr shown in a message


def _short(text: str) -> str:
    text = " ".join(text.split())  # one line, whatever the repr
    return text if len(text) <= _REPR else text[: _REPR - 3] + "..."


def describe(value: Any, _depth: int = 0) -> str:
    """Type name and a short repr: ``str 'abc'``, ``Tensor of shape (3, 4) float32``, ``list of 2 item(s)``."""
    if value is None:
        return "None"
    kind = type(value).__name__
    if isinstance(value, torch.Tensor):
        return f"{kind} of shape {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
    if isinstance(value, nn.Module):
        return kind  # its repr is the whole module tree
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and hasattr(value, "dtype"):  # numpy and friends
        return f"{kind} of shape {shape} {value.dtype}"
    if isinstance(value, (list, tuple)):
        head = f"{kind} of {len(value)} item(s)"
        if value and _depth < 2:
            head += f", the first {describe(value[0], _depth + 1)}"
        return head
    if isinstance(value, Mapping):
        try:
            return f"{kind} with keys {_short(repr(list(value)[:5]))}"
        except Exception:  # noqa: BLE001 - only for a message
            return kind
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - only for a message
        return kind
    return f"{kind} {_short(text)}"


def message(fn: str, name: str, accepts: str, value: Any) -> str:
    """``fn(name=...): name must be <accepts>, got <type> <repr>``."""
    return f"{fn}({name}=...): {name} must be {accepts}, got {describe(value)}"


def wrong_type(fn: str, name: str, accepts: str, value: Any) -> WidthscopeTypeError:
    """The error to raise for a value of the wrong type."""
    return WidthscopeTypeError(message(fn, name, accepts, value))


def _value(fn: str, name: str, accepts: str, value: Any) -> WidthscopeError:
    return WidthscopeError(message(fn, name, accepts, value))


def _or_none(accepts: str, optional: bool) -> str:
    return accepts + " or None" if optional else accepts


# ----------------------------------------------------------------------------- models
def module(fn: str, name: str, value: Any, *, accepts: str = MODULE) -> nn.Module:
    """An ``nn.Module``."""
    if not isinstance(value, nn.Module):
        raise wrong_type(fn, name, accepts, value)
    return value


def model_or_function(fn: str, value: Any) -> Any:
    """An ``nn.Module`` or a function ``f(params, x)`` (the kernel tools)."""
    if not isinstance(value, nn.Module) and not callable(value):
        raise WidthscopeTypeError(
            f"{fn}: expected an nn.Module or a function f(params, x) with params= as "
            f"{fn}(model=...), got {describe(value)}"
        )
    return value


# ----------------------------------------------------------------------------- tensors
def _ndim_text(ndim: int | tuple[int, ...] | None, min_ndim: int | None) -> str:
    if ndim is not None:
        return " or ".join(f"{n}-D" for n in ((ndim,) if isinstance(ndim, int) else ndim)) + " "
    return f"batched (at least {min_ndim}-D) " if min_ndim else ""


def tensor(
    fn: str,
    name: str,
    value: Any,
    *,
    ndim: int | tuple[int, ...] | None = None,
    min_ndim: int | None = None,
    floating: bool = False,
    arrays: bool = False,
    optional: bool = False,
    accepts: str | None = None,
) -> Any:
    """A ``torch.Tensor`` (``arrays``: or an array / nested list) of ``ndim`` dimensions (one or a
    tuple of them) or at least ``min_ndim``; ``floating``: a floating dtype."""
    if value is None and optional:
        return None
    what = accepts or _or_none(
        f"a {_ndim_text(ndim, min_ndim)}{'floating ' if floating else ''}tensor" + (" or array" if arrays else ""),
        optional,
    )
    array_like = arrays and (
        isinstance(value, (list, tuple)) or hasattr(value, "__array__") and hasattr(value, "shape")
    )
    if not isinstance(value, torch.Tensor) and not array_like:
        raise wrong_type(fn, name, what, value)
    if floating and isinstance(value, torch.Tensor) and not value.is_floating_point():
        raise wrong_type(fn, name, what, value)
    n = getattr(value, "ndim", None)
    if isinstance(n, int):
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if (allowed is not None and n not in allowed) or (min_ndim is not None and n < min_ndim):
            raise _value(fn, name, what, value)
    return value


# ----------------------------------------------------------------------------- scalars
def _range_text(lo: float | None, hi: float | None, lo_open: bool = False, hi_open: bool = False) -> str:
    if lo is not None and hi is not None:
        if lo_open or hi_open:
            return f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        return f"in {lo:g}..{hi:g}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo:g}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {hi:g}"
    return ""


def _is_int(v: Any) -> bool:
    """A whole number by type: ``int``, numpy integer, 0-D integer tensor; not ``bool``, not ``2.0``."""
    if isinstance(v, bool) or (isinstance(v, torch.Tensor) and v.dtype == torch.bool):
        return False
    try:
        operator.index(v)
    except TypeError:
        return False
    return True


def integer(
    fn: str,
    name: str,
    value: Any,
    lo: int | None = None,
    hi: int | None = None,
    *,
    optional: bool = False,
    accepts: str | None = None,
) -> int | None:
    """A whole number (``int``, numpy integer; not ``bool``, not ``2.0``) in ``lo..hi``."""
    if value is None and optional:
        return None
    if accepts is None:
        accepts = "a positive integer" if lo == 1 and hi is None else f"an integer {_range_text(lo, hi)}".rstrip()
        accepts = _or_none(accepts, optional)
    if not _is_int(value):
        raise wrong_type(fn, name, accepts, value)
    v = operator.index(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise _value(fn, name, accepts, value)
    return v


def number(
    fn: str,
    name: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    finite: bool = True,
    optional: bool = False,
    accepts: str | None = None,
) -> float | None:
    """A real number (not ``bool`` or NaN; finite unless ``finite=False``) in the range."""
    if value is None and optional:
        return None
    if accepts is None:
        accepts = _or_none(
            f"a {'finite ' if finite else ''}number {_range_text(lo, hi, lo_open, hi_open)}".rstrip(), optional
        )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise wrong_type(fn, name, accepts, value)
    v = float(value)
    bad = (
        math.isnan(v)
        or (finite and math.isinf(v))
        or (lo is not None and (v <= lo if lo_open else v < lo))
        or (hi is not None and (v >= hi if hi_open else v > hi))
    )
    if bad:
        raise _value(fn, name, accepts, value)
    return v


def boolean(fn: str, name: str, value: Any) -> bool:
    """``True`` or ``False`` (a numpy bool too); not ``0``/``1`` or a string, whose truth is a guess."""
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")):
        return bool(value)
    raise wrong_type(fn, name, "True or False", value)


def choice(fn: str, name: str, value: Any, choices: Iterable[Any], *, values: bool = True) -> Any:
    """One of ``choices`` (strings, maybe ``None``); ``values=False``: the type only."""
    choices = tuple(choices)
    shown = ", ".join(repr(c) for c in choices)
    accepts = f"one of {shown}"
    if value is None and None in choices:
        return value
    if not isinstance(value, str):
        raise wrong_type(fn, name, accepts, value)
    if values and value not in choices:
        raise WidthscopeError(f"{fn}({name}=...): unknown {name} {value!r}; {name} must be {accepts}")
    return value


def string(
    fn: str, name: str, value: Any, *, optional: bool = False, empty: bool = False, accepts: str | None = None
) -> str | None:
    """A ``str`` (non-empty unless ``empty``)."""
    if value is None and optional:
        return None
    accepts = accepts or _or_none("a string" if empty else "a non-empty string", optional)
    if not isinstance(value, str):
        raise wrong_type(fn, name, accepts, value)
    if not empty and not value:
        raise _value(fn, name, accepts, value)
    return value


def function(fn: str, name: str, value: Any, *, optional: bool = True, accepts: str | None = None) -> Any:
    """A callable (``None`` allowed when ``optional``)."""
    if value is None and optional:
        return None
    if not callable(value) or isinstance(value, type):
        raise wrong_type(fn, name, accepts or _or_none("a function", optional), value)
    return value


def mapping(
    fn: str, name: str, value: Any, *, optional: bool = True, mutable: bool = False, accepts: str | None = None
) -> Any:
    """A ``dict`` / ``Mapping`` (``mutable``: one the function writes into)."""
    if value is None and optional:
        return None
    ok = isinstance(value, dict) or (isinstance(value, Mapping) and (not mutable or hasattr(value, "__setitem__")))
    if not ok:
        raise wrong_type(fn, name, accepts or _or_none("a dict", optional), value)
    return value


def dtype(fn: str, name: str, value: Any, *, floating: bool = True, optional: bool = True) -> Any:
    """A ``torch.dtype`` (``floating``: a floating one)."""
    if value is None and optional:
        return None
    accepts = _or_none(f"a {'floating ' if floating else ''}torch.dtype (e.g. torch.float64)", optional)
    if not isinstance(value, torch.dtype):
        raise wrong_type(fn, name, accepts, value)
    if floating and not value.is_floating_point:
        raise _value(fn, name, accepts, value)
    return value


def instance(
    fn: str, name: str, value: Any, types: type | tuple[type, ...], accepts: str, *, optional: bool = False
) -> Any:
    """Any value of ``types`` (``accepts`` says what that is, for the message)."""
    if value is None and optional:
        return None
    types = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):  # True is no int here
        raise wrong_type(fn, name, _or_none(accepts, optional), value)
    return value


# ----------------------------------------------------------------------------- collections
def not_a_collection(value: Any) -> bool:
    return (
        value is None
        or isinstance(value, (str, bytes, numbers.Number, nn.Module, torch.Tensor))
        or not (hasattr(value, "__iter__") or hasattr(value, "__getitem__"))
    )


def _collection(
    fn: str,
    name: str,
    value: Any,
    accepts: str,
    ok: Callable[[Any], bool],
    checked: tuple[type, ...] = (list, tuple),
    vectors: bool = False,
) -> Any:
    """A collection (not a mapping; ``vectors``: or a 1-D tensor) whose items, in ``checked`` containers,
    pass ``ok`` (a generator is not spent)."""
    one_d = vectors and isinstance(value, torch.Tensor) and value.ndim == 1
    if (not_a_collection(value) and not one_d) or isinstance(value, Mapping):
        raise wrong_type(fn, name, accepts, value)
    if isinstance(value, checked):
        for i, v in enumerate(cast(Iterable[Any], value)):
            if not ok(v):
                raise WidthscopeTypeError(f"{message(fn, name, accepts, value)}; item {i} is {describe(v)}")
    return value


def points(fn: str, name: str, value: Any) -> Any:
    """Insertion points: ``None``, a module name or comma-separated names, or an iterable of names."""
    if value is None or isinstance(value, str):
        return value
    accepts = "None (the default points), a module name, a comma-separated string or a list of module names"
    return _collection(fn, name, value, accepts, lambda p: isinstance(p, str))


def sizes(fn: str, name: str, value: Any, *, optional: bool = False) -> Any:
    """A sample size or a list of them (``certify``'s ``M``/``K``), whole numbers."""
    if (value is None and optional) or _is_int(value):
        return value
    accepts = _or_none("a positive integer or a list of them (e.g. [16, 32, 64])", optional)
    return _collection(fn, name, value, accepts, _is_int, (list, tuple, range, torch.Tensor, np.ndarray), True)


def tensor_pair(fn: str, name: str, value: Any, *, optional: bool = False) -> Any:
    """A pair of tensors ``(X, Y)`` (a tuple or a list)."""
    if value is None and optional:
        return None
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(t, torch.Tensor) for t in value)):
        raise wrong_type(fn, name, _or_none("a pair of tensors (X, Y)", optional), value)
    return value


def int_list(fn: str, name: str, value: Any, *, optional: bool = True, accepts: str | None = None) -> Any:
    """An iterable of whole numbers."""
    if value is None and optional:
        return None
    accepts = accepts or _or_none("a list of integers", optional)
    return _collection(fn, name, value, accepts, _is_int, (list, tuple, range, set, frozenset))


def numbers_list(fn: str, name: str, value: Any, *, optional: bool = True, accepts: str | None = None) -> Any:
    """A list (or tuple, or 1-D tensor) of real numbers."""
    if value is None and optional:
        return None
    accepts = accepts or _or_none("a list of numbers", optional)

    def real(v: Any) -> bool:
        return not isinstance(v, bool) and isinstance(v, (numbers.Real, torch.Tensor))

    return _collection(fn, name, value, accepts, real, vectors=True)


# ----------------------------------------------------------------------------- batches
def is_batch(b: Any) -> bool:
    """One batch of the probe's forward pass: a mapping of model inputs, a tensor of token ids, or a
    pair ``(x, y)`` whose ``x`` has a shape or is a mapping."""
    if isinstance(b, Mapping):
        return True
    if isinstance(b, torch.Tensor):
        return not b.is_floating_point()
    if isinstance(b, (tuple, list)) and len(b) == 2:
        return isinstance(b[0], Mapping) or hasattr(b[0], "shape")
    return False


def _one_batch(value: Any) -> bool:
    # As widthscope.probe.batches.as_examples takes a single batch.
    return (
        isinstance(value, Mapping)
        or (isinstance(value, torch.Tensor) and not value.is_floating_point())
        or (
            isinstance(value, tuple)
            and len(value) == 2
            and isinstance(value[0], (torch.Tensor, Mapping))
            and isinstance(value[1], torch.Tensor)
        )
    )


def batches(fn: str, name: str, value: Any, *, single: bool = False) -> Any:
    """An iterable of batches (:func:`is_batch`), or a tensor of stacked id batches ``(n, B, T)``;
    ``single``: one batch is fine too. Only lists and tuples are checked item by item."""
    accepts = f"an iterable of batches: {BATCH}" + (", or one such batch" if single else "")
    if single and _one_batch(value):
        return value
    if isinstance(value, torch.Tensor):
        if not single and value.ndim >= 3 and not value.is_floating_point():
            return value  # iterated: one (B, T) batch of ids per row
        hint = (
            "a float tensor has no targets: pass (X, y)"
            if value.is_floating_point()
            else "one tensor: pass a list of batches, e.g. [ids] or widthscope.probe.batched(ids)"
        )
        raise WidthscopeTypeError(f"{message(fn, name, accepts, value)} ({hint})")
    if not_a_collection(value) or (isinstance(value, Mapping) and not single):
        hint = " (one batch: wrap it in a list, [batch])" if isinstance(value, Mapping) else ""
        raise WidthscopeTypeError(message(fn, name, accepts, value) + hint)
    if isinstance(value, (list, tuple)):
        for i, b in enumerate(value):
            if not is_batch(b):
                hint = (
                    "; one (x, y) batch goes in a list: [(x, y)]"
                    if isinstance(value, tuple) and len(value) == 2
                    else ""
                )
                raise WidthscopeTypeError(f"{fn}({name}=...): batch {i} is {describe(b)}: expected {BATCH}{hint}")
    return value
