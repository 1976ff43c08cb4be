"""Statistics core: unbiased moments, the alignment certificate, planning, resampling.

Pure tensor code with float64 accumulation and no knowledge of models: ``estimators`` (one- and
two-population moments), ``bounds`` (certificate, planner), ``resample`` (empirical misalignment),
``sketch`` (random projection, out-of-core), ``seeds`` (per-seed t test, Holm). Maths: docs/statistics.md.

Example::

    >>> import torch, widthscope.stats as ws
    >>> X = torch.randn(300, 24, dtype=torch.float64) + 0.3
    >>> ws.certificate(X, M=16, K=16).vacuous
    False
"""

from .bounds import Certificate, Plan, certificate, certified, certified_steps, plan, resolve_moments, vacuous_rule
from .estimators import (
    CrossMoments,
    Moments,
    PrimalMoments,
    as_matrix,
    cross_moments,
    cross_moments_from_gram,
    gram_sums,
    moments,
    moments_from_gram,
)
from .resample import Misalignment, misalignment, misalignment_from_gram, wilson_interval

__all__ = [
    "Moments",
    "CrossMoments",
    "PrimalMoments",
    "moments",
    "moments_from_gram",
    "gram_sums",
    "cross_moments",
    "cross_moments_from_gram",
    "as_matrix",
    "Certificate",
    "certificate",
    "Plan",
    "plan",
    "resolve_moments",
    "vacuous_rule",
    "certified",
    "certified_steps",
    "Misalignment",
    "misalignment",
    "misalignment_from_gram",
    "wilson_interval",
]
