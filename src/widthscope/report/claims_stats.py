"""The statistics of the claims page (:mod:`widthscope.report.claims`): per-seed t intervals and
one-sided p-values against a claimed region (:func:`seed_test`), Holm's correction (:func:`holm`), the
seeds a claim needs for 80% power (:func:`seeds_needed`), and the small helpers those share.

Example::

    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    >>> seed_test([0.4, 0.5, 0.6], (0.0, float("inf")))["direction"]
    'holds'
"""

from __future__ import annotations

import math
from typing import Any, Sequence, TypeGuard

import numpy as np
from scipy import special as _sp

__all__ = ["ALPHA", "POWER", "MAX_SEEDS", "finite", "slope", "seed_test", "holm", "seeds_needed", "effect"]

ALPHA = 0.05
POWER = 0.8
MAX_SEEDS = 10_000


def finite(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def slope(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Least-squares slope of y on x (None with fewer than 2 distinct x)."""
    if len(set(x)) < 2:
        return None
    xa, ya = np.asarray(x, float), np.asarray(y, float)
    xc = xa - xa.mean()
    return float(xc @ (ya - ya.mean()) / (xc @ xc))


def _one_sided(m: float, se: float, c: float, df: int) -> tuple[float, float]:
    """(P(T >= t), P(T <= t)) for t = (m - c)/se under θ = c; se = 0 gives 0/1 (or 1/2 at m = c)."""
    if se > 0:
        tt = (m - c) / se  # scipy.special: the ufuncs behind scipy.stats.t, without its per-call overhead
        return float(_sp.stdtr(df, -tt)), float(_sp.stdtr(df, tt))
    if m == c:
        return 0.5, 0.5
    return (0.0, 1.0) if m > c else (1.0, 0.0)


def seed_test(values: Sequence[float | None], region: tuple[float, float]) -> dict[str, Any]:
    """t interval and p-values for "the mean of the per-seed ``values`` lies in ``region = (a, b)``".

    Returns ``measured, low, high, sd, seeds, p_holds, p_not, p, direction`` (``p`` etc. ``None``
    with fewer than 2 finite values). ``p ≤ α`` iff the ``1 − α`` interval lies inside or outside
    the region; ``direction`` says which ("holds" / "does not").
    """
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], float)
    out: dict[str, Any] = {
        "measured": float(x.mean()) if len(x) else None,
        "low": None,
        "high": None,
        "sd": None,
        "seeds": int(len(x)),
        "p_holds": None,
        "p_not": None,
        "p": None,
        "direction": None,
    }
    if len(x) < 2:
        return out
    a, b = region
    n, m, sd = len(x), float(x.mean()), float(x.std(ddof=1))
    se, df = sd / math.sqrt(n), n - 1
    half = float(_sp.stdtrit(df, 1 - ALPHA / 2)) * se
    above_a, below_a = _one_sided(m, se, a, df) if math.isfinite(a) else (0.0, 1.0)
    above_b, below_b = _one_sided(m, se, b, df) if math.isfinite(b) else (1.0, 0.0)
    p_holds = max(above_a, below_b)  # θ > a and θ < b, both shown
    p_not = min(below_a, above_b)  # θ < a or θ > b shown
    out.update(
        low=m - half,
        high=m + half,
        sd=sd,
        p_holds=p_holds,
        p_not=p_not,
        p=min(1.0, 2 * min(p_holds, p_not)),
        direction="holds" if p_holds <= p_not else "does not",
    )
    return out


def holm(ps: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values (family-wise error control under any dependence)."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adj, run = [0.0] * m, 0.0
    for k, i in enumerate(order):
        run = max(run, min(1.0, (m - k) * ps[i]))
        adj[i] = run
    return adj


def seeds_needed(effect: float, sd: float, level: float, power: float = POWER) -> int | None:
    """Smallest ``n ≥ 2`` whose two-sided level-``level`` t interval excludes a boundary at distance
    ``effect`` from the mean with probability ``power`` (noncentral t, per-seed SD ``sd``);
    ``None`` when the effect is 0 or more than :data:`MAX_SEEDS` seeds would be needed."""
    if not (effect > 0 and sd >= 0) or not math.isfinite(effect):
        return None
    if sd == 0:
        return 2

    def ok(n: int) -> bool:
        crit = _sp.stdtrit(n - 1, 1 - level / 2)
        return 1.0 - float(_sp.nctdtr(n - 1, effect * math.sqrt(n) / sd, crit)) >= power

    # The normal approximation is a lower bound on n (t quantiles exceed z) and close to it:
    # step up from there (a few steps; the gap is about z^2/4 seeds).
    n0 = ((_sp.ndtri(1 - level / 2) + _sp.ndtri(power)) * sd / effect) ** 2
    n = max(2, math.ceil(n0))
    while n <= MAX_SEEDS and not ok(n):
        n += 1
    return n if n <= MAX_SEEDS else None


def effect(measured: float | None, region: tuple[float, float]) -> float | None:
    """Distance from the estimate to the end of the region a decision has to clear."""
    if measured is None:
        return None
    a, b = region
    if a < measured < b:
        return min(measured - a, b - measured)
    return a - measured if measured <= a else measured - b
