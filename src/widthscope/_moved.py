"""Module attribute forwarding for the layout move of issue 20 (pipelines as packages): a package
that serves its submodules' names, and the old flat module paths kept as deprecation shims."""
from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable, Sequence

__all__ = ["from_submodules", "moved"]


def from_submodules(package: str, submodules: Sequence[str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving the names (private helpers too) of ``package``'s submodules,
    so ``from widthscope.certify import _x`` keeps working after the module became a package."""
    def __getattr__(name: str) -> Any:
        for sub in submodules:
            mod = importlib.import_module(f"{package}.{sub}")
            if hasattr(mod, name):
                return getattr(mod, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__


def moved(old: str, new: str) -> Callable[[str], Any]:
    """Warn that ``old`` moved to ``new`` and return a module ``__getattr__`` forwarding to it."""
    warnings.warn(f"{old} moved to {new}; the old path goes in the next release", DeprecationWarning, stacklevel=3)
    mod = importlib.import_module(new)

    def __getattr__(name: str) -> Any:
        return getattr(mod, name)
    return __getattr__
