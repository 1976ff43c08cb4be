"""Log-log slope fits over widths with a t interval over seeds.

Model: ``log m(n) = c + p·log n``. For every width the seeds are averaged in log space, then
``(c, p)`` is the least squares line through ``(log n_j, mean_s log m_sj)``. The 95% interval for
``p`` is ``p ± t_{0.975, k−1} · sd(p_s)/√k`` over the ``k`` seeds' own slopes ``p_s``. Values that
are missing, non-finite or ``<= 0`` are ignored (a width with no valid seed is dropped).

Example::

    >>> import numpy as np
    >>> from widthscope.linear.powerlaw import fit_slope
    >>> n = np.array([64, 128, 256, 512, 1024])
    >>> vals = 3.0 * n[None, :] ** -1.0 * np.exp(0.1 * np.random.default_rng(0).normal(size=(8, 5)))
    >>> fit = fit_slope(n, vals); round(fit.slope, 1)
    -1.0
"""

from __future__ import annotations

import warnings
from typing import NamedTuple, Sequence

import numpy as np

from ..errors import WidthscopeError

__all__ = ["SlopeFit", "fit_slope"]


class SlopeFit(NamedTuple):
    slope: float
    intercept: float
    ci_low: float
    ci_high: float


def _line(logn: np.ndarray, logv: np.ndarray) -> tuple[float, float]:
    ok = np.isfinite(logv)
    if ok.sum() < 2:
        return float("nan"), float("nan")
    p, c = np.polyfit(logn[ok], logv[ok], 1)
    return float(p), float(c)


def fit_slope(widths: Sequence[float], values_by_seed, *, level: float = 0.95) -> SlopeFit:
    """Fit ``log value = intercept + slope·log width`` to ``values_by_seed`` ``(n_seeds, n_widths)``; the interval
    is NaN with fewer than two seeds."""
    n = np.asarray(widths, dtype=float).reshape(-1)
    v = np.asarray(values_by_seed, dtype=float)
    if v.ndim == 1:
        v = v[None, :]
    if v.ndim != 2 or v.shape[1] != n.size:
        raise WidthscopeError(f"fit_slope: values_by_seed must be (n_seeds, n_widths={n.size}), got shape {v.shape}")
    if n.size < 2 or np.any(n <= 0):
        raise WidthscopeError("fit_slope: need at least two positive widths")
    with np.errstate(invalid="ignore", divide="ignore"):
        logs = np.where(np.isfinite(v) & (v > 0), np.log(np.where(v > 0, v, 1.0)), np.nan)
    logn = np.log(n)
    with warnings.catch_warnings():  # a width with no valid seed: its mean is NaN (dropped)
        warnings.simplefilter("ignore", RuntimeWarning)
        slope, intercept = _line(logn, np.nanmean(logs, axis=0))
    lo = hi = float("nan")
    per = np.array([_line(logn, row)[0] for row in logs])
    per = per[np.isfinite(per)]
    if per.size >= 2 and np.isfinite(slope):
        from scipy.stats import t  # noqa: PLC0415  start-up time: scipy

        half = float(t.ppf(0.5 + level / 2, per.size - 1)) * float(np.std(per, ddof=1)) / np.sqrt(per.size)
        lo, hi = slope - half, slope + half
    return SlopeFit(slope, intercept, lo, hi)
