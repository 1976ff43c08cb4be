"""The certify pipeline: probe a model, certify its insertion points, intervene.

- ``pipeline``: :func:`certify` and the ``certify`` command;
- ``per_point``: per-point statistics, ranking and the terminal tables;
- ``samples``: pooled samples as a safetensors artifact and the ``stats`` command (certificates without a model).
The old module paths (``widthscope.certify_tables``, ``widthscope.samples``) still import, with a deprecation warning, for one release.
"""
from .._moved import from_submodules
from .pipeline import *  # noqa: F401,F403  (the public API of the pipeline)
from .pipeline import __all__ as _main_all

__all__ = list(_main_all)
# private helpers other modules take from the old flat module (``from widthscope.certify import _x``)
__getattr__ = from_submodules(__name__, ("pipeline", "per_point", "samples"))
