"""Log-log slope fits over widths with a bootstrap-over-seeds confidence interval.

Model: ``log m(n) = c + p·log n``. For every width the seeds are averaged *in log space*
(a geometric mean: robust to the heavy right tail of deviations), then ``(c, p)`` is the least
squares line through ``(log n_j, mean_s log m_sj)``. The 95% interval for ``p`` resamples
seeds with replacement (the same resampled seed set at every width, keeping the seed's
correlation across widths) and takes the 2.5/97.5 percentiles of the refitted slopes.
Values that are missing, non-finite or ``<= 0`` are ignored (a width with no valid seed is
dropped from the fit).

Example::

    >>> import numpy as np
    >>> from widthscope.linear.powerlaw import fit_slope
    >>> n = np.array([64, 128, 256, 512, 1024])
    >>> vals = 3.0 * n[None, :] ** -1.0 * np.exp(0.1 * np.random.default_rng(0).normal(size=(8, 5)))
    >>> fit = fit_slope(n, vals); round(fit.slope, 1)
    -1.0
"""
from __future__ import annotations

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


def _seed_mean(logs: np.ndarray) -> np.ndarray:
    cnt = np.isfinite(logs).sum(0)
    tot = np.where(np.isfinite(logs), logs, 0.0).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)


def fit_slope(widths: Sequence[float], values_by_seed, *, n_boot: int = 2000, level: float = 0.95,
              seed: int = 0) -> SlopeFit:
    """Fit ``log value = intercept + slope·log width``; ``values_by_seed`` is ``(n_seeds, n_widths)``.

    Returns ``SlopeFit(slope, intercept, ci_low, ci_high)`` (a named tuple); the interval is
    NaN with fewer than two seeds.
    """
    n = np.asarray(widths, dtype=float).reshape(-1)
    v = np.asarray(values_by_seed, dtype=float)
    if v.ndim == 1:
        v = v[None, :]
    if v.ndim != 2 or v.shape[1] != n.size:
        raise WidthscopeError(f"fit_slope: values_by_seed must be (n_seeds, n_widths={n.size}), "
                              f"got shape {v.shape}")
    if n.size < 2 or np.any(n <= 0):
        raise WidthscopeError("fit_slope: need at least two positive widths")
    with np.errstate(invalid="ignore", divide="ignore"):
        logs = np.where(np.isfinite(v) & (v > 0), np.log(np.where(v > 0, v, 1.0)), np.nan)
    logn = np.log(n)
    slope, intercept = _line(logn, _seed_mean(logs))
    lo = hi = float("nan")
    S = logs.shape[0]
    if S >= 2 and np.isfinite(slope):
        rng = np.random.default_rng(seed)
        boots = np.empty(n_boot)
        for b in range(n_boot):
            boots[b] = _line(logn, _seed_mean(logs[rng.integers(0, S, S)]))[0]
        boots = boots[np.isfinite(boots)]
        if boots.size:
            a = (1 - level) / 2
            lo, hi = (float(q) for q in np.quantile(boots, [a, 1 - a]))
    return SlopeFit(slope, intercept, lo, hi)
