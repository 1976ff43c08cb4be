"""The certify pipeline: probe a model, certify its insertion points, intervene.

The public function is ``ws.certify(model, data, M=...)`` (:func:`widthscope.api.certify`), which
returns a typed :class:`~widthscope.certification.result.CertifyResult`.

- ``pipeline``: :func:`certify_dict` (the same pipeline, returning the results file's JSON dict) and
  a whole certify run from typed settings (:func:`run_certify`, what ``widthscope certify`` calls);
- ``per_point``: per-point statistics, ranking and the terminal tables;
- ``samples``: pooled samples as a safetensors artifact (``widthscope stats``: certificates without a model).
"""

from .per_point import check_pool, precision_notes, ranking, statistics, tables
from .pipeline import *  # noqa: F403  (the public API of the pipeline)
from .pipeline import __all__ as _main_all
from .result import Certificate, CertifyResult, PointCertificate

__all__ = [
    *_main_all,
    "check_pool",
    "precision_notes",
    "ranking",
    "statistics",
    "tables",
    "CertifyResult",
    "PointCertificate",
    "Certificate",
]
