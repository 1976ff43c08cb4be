"""The certify pipeline: probe a model, certify its insertion points, intervene.

- ``pipeline``: :func:`certify` and the ``certify`` command;
- ``per_point``: per-point statistics, ranking and the terminal tables;
- ``samples``: pooled samples as a safetensors artifact and the ``stats`` command (certificates without a model).
The old module paths (``widthscope.certify_tables``, ``widthscope.samples``) still import, with a deprecation warning, for one release.
"""
import importlib as _importlib

from .pipeline import *  # noqa: F401,F403  (the public API of the pipeline)
from .pipeline import __all__ as _main_all

_SUBMODULES = ('per_point', 'samples')
__all__ = list(_main_all)


def __getattr__(name: str):
    # private helpers other modules take from the old flat module (``from .certify import _x``)
    for sub in ("pipeline", *_SUBMODULES):
        mod = _importlib.import_module(f"{__name__}.{sub}")
        if hasattr(mod, name):
            return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
