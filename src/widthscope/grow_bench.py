"""Deprecated module path: moved to :mod:`widthscope.grow.bench` (issue 20: pipelines as packages).
Kept for one release; import from the new path."""
import importlib as _importlib
import warnings as _warnings

_warnings.warn("widthscope.grow_bench moved to widthscope.grow.bench; the old path goes in the next release",
               DeprecationWarning, stacklevel=2)
_mod = _importlib.import_module("widthscope.grow.bench")


def __getattr__(name: str):
    return getattr(_mod, name)
