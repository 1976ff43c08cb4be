"""The certify pipeline: probe a model, certify its insertion points, intervene.

``widthscope.certify`` is also the public function: ``ws.certify(model, data, M=...)`` calls
:func:`~widthscope.certify.api.certify_model` and returns a typed
:class:`~widthscope.certify.result.CertifyResult` (the package is callable, so the name users
call and the subpackage they import from are one object).

- ``pipeline``: :func:`certify` (the function a Python user calls);
- ``run``: a whole certify run from typed settings (:func:`run_certify`, what ``widthscope certify`` calls);
- ``per_point``: per-point statistics, ranking and the terminal tables;
- ``samples``: pooled samples as a safetensors artifact (``widthscope stats``: certificates without a model).
"""

import sys as _sys
import types as _types
from typing import Any

from .api import certify_model
from .per_point import check_pool, precision_notes, ranking, statistics, tables
from .pipeline import *  # noqa: F403  (the public API of the pipeline)
from .pipeline import __all__ as _main_all
from .result import Certificate, CertifyResult, PointCertificate
from .run import CertifyJob, list_points, run_certify

__all__ = [
    *_main_all,
    "check_pool",
    "precision_notes",
    "ranking",
    "statistics",
    "tables",
    "CertifyJob",
    "list_points",
    "run_certify",
    "certify_model",
    "CertifyResult",
    "PointCertificate",
    "Certificate",
]


class _Callable(_types.ModuleType):
    """``ws.certify(...)``: the package called is :func:`certify_model`."""

    def __call__(self, *args: Any, **kwargs: Any) -> CertifyResult:
        return certify_model(*args, **kwargs)


_sys.modules[__name__].__class__ = _Callable
