"""Per-seed decisions: a Student t test of "the mean lies in a region" and Holm's correction.

Example::

    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    >>> seed_test([0.4, 0.5, 0.6], (0.0, float("inf")))["direction"]
    'holds'
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from scipy import special as _sp

ALPHA = 0.05
UNTESTED = dict.fromkeys(("low", "high", "sd", "seeds", "p", "p_holds", "p_not", "direction"))


def _one_sided(m: float, se: float, c: float, df: int) -> tuple[float, float]:
    """(P(T >= t), P(T <= t)) for t = (m - c)/se under θ = c; se = 0 gives 0/1 (or 1/2 at m = c)."""
    if se > 0:
        tt = (m - c) / se
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
    out: dict[str, Any] = {**UNTESTED, "measured": float(x.mean()) if len(x) else None, "seeds": int(len(x))}
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
    out.update(low=m - half, high=m + half, sd=sd, p_holds=p_holds, p_not=p_not)
    out.update(p=min(1.0, 2 * min(p_holds, p_not)), direction="holds" if p_holds <= p_not else "does not")
    return out


def holm(ps: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values (family-wise error control under any dependence)."""
    m = len(ps)
    adj, run = [0.0] * m, 0.0
    for k, i in enumerate(sorted(range(m), key=lambda i: ps[i])):
        run = max(run, min(1.0, (m - k) * ps[i]))
        adj[i] = run
    return adj
