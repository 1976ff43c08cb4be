"""Deprecated module path: moved to :mod:`widthscope.grow.compare` (issue 20: pipelines as packages).
Kept for one release; import from the new path."""
import importlib as _importlib
import warnings as _warnings

_warnings.warn("widthscope.grow_compare moved to widthscope.grow.compare; the old path goes in the next release",
               DeprecationWarning, stacklevel=2)
_mod = _importlib.import_module("widthscope.grow.compare")


def __getattr__(name: str):
    return getattr(_mod, name)
