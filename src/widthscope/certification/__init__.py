"""The certify pipeline: probe a model, certify its insertion points, intervene.

``pipeline``: :func:`certify_dict` and :func:`run_certify`; ``per_point``: statistics, ranking, tables;
``samples``: pooled samples as an artifact (``widthscope stats``); ``result``: the typed results.
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
