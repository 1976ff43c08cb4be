"""Extension points, name -> callable (docs/architecture.md, "Extending"): :data:`GROWTH_OPERATORS`
(``fn(model, size, *, cell, seed) -> Growth``, with ``axis``) and :data:`INTERVENTION_KINDS`
(``fn(inputs) -> Measured``, with ``reuse_probe``). Built-ins are ``"module:function"`` paths, imported
on first use; ``@GROWTH_OPERATORS.register("my_op", axis="depth")`` adds one."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .errors import WidthscopeError


class Registry:
    """Names -> callables (or ``"module:attribute"`` paths, imported on first :meth:`get`), each with
    its fields (``register(name, fn, axis="depth")``: ``info(name)["axis"]``)."""

    def __init__(self, what: str, fields: tuple[str, ...] = ()) -> None:
        self.what = what
        self.fields = fields
        self._entries: dict[str, tuple[Callable[..., Any] | str, dict[str, Any]]] = {}

    def register(self, name: str, fn: Callable[..., Any] | str | None = None, **info: Any) -> Any:
        """Add ``name``; with no ``fn``, a decorator (``@REGISTRY.register("name", ...)``)."""
        if not isinstance(name, str) or not name or "," in name:
            raise WidthscopeError(f"a {self.what} needs a name (a non-empty str without commas), got {name!r}")
        missing = [f for f in self.fields if f not in info]
        if missing:
            raise WidthscopeError(f"{self.what} {name!r}: give {', '.join(f'{f}=...' for f in missing)}")
        if fn is None:
            return lambda f: self.register(name, f, **info)
        self._entries[name] = (fn, info)
        return fn

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def _entry(self, name: str) -> tuple[Callable[..., Any] | str, dict[str, Any]]:
        if name not in self._entries:
            raise WidthscopeError(f"unknown {self.what} {name!r}; choose one of {', '.join(self._entries)}")
        return self._entries[name]

    def get(self, name: str) -> Callable[..., Any]:
        """The callable of ``name`` (imported the first time, for a built-in)."""
        fn, info = self._entry(name)
        if isinstance(fn, str):
            module, _, attr = fn.partition(":")
            fn = getattr(importlib.import_module(module), attr)
            self._entries[name] = (fn, info)
        return fn

    def info(self, name: str) -> dict[str, Any]:
        return dict(self._entry(name)[1])

    def mapping(self, field: str) -> Mapping[str, Any]:
        """A live read-only view ``name -> info(name)[field]`` (it sees later registrations)."""
        return _FieldView(self, field)


class _FieldView(Mapping[str, Any]):
    def __init__(self, registry: Registry, field: str) -> None:
        self._registry, self._field = registry, field

    def __getitem__(self, name: str) -> Any:
        if name not in self._registry:
            raise KeyError(name)
        return self._registry.info(name)[self._field]

    def __iter__(self) -> Iterator[str]:
        return iter(self._registry)

    def __len__(self) -> int:
        return len(self._registry.names())


GROWTH_OPERATORS = Registry("growth operator", fields=("axis",))
for _name, _axis in (("stack_copy", "depth"), ("stack_zero", "depth"), ("zero_block", "depth"), ("widen", "width")):
    GROWTH_OPERATORS.register(_name, f"widthscope.growth.target:grow_{_name}", axis=_axis)

INTERVENTION_KINDS = Registry("intervention kind")
INTERVENTION_KINDS.register("bias", "widthscope.probe.interventions:measure_bias", reuse_probe=True)
INTERVENTION_KINDS.register("block", "widthscope.probe.interventions:measure_block")
