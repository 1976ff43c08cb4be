"""Deprecated module path: moved to :mod:`widthscope.certify.samples` (issue 20: pipelines as packages).
Kept for one release; import from the new path."""
import importlib as _importlib
import warnings as _warnings

_warnings.warn("widthscope.samples moved to widthscope.certify.samples; the old path goes in the next release",
               DeprecationWarning, stacklevel=2)
_mod = _importlib.import_module("widthscope.certify.samples")


def __getattr__(name: str):
    return getattr(_mod, name)
