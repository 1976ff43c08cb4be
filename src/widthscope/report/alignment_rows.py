"""Seed aggregation and width trends of ``kind="alignment"`` rows, shared by the figures, the
tables and the summary of :mod:`widthscope.report.alignment` (whose docstring defines a *trend*).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Mapping, Sequence

import numpy as np


# ----------------------------------------------------------------------------- helpers
def as_number(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) else math.nan


def _ranks(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a), dtype=float)
    for v in np.unique(a):  # average ranks of ties
        m = a == v
        ranks[m] = ranks[m].mean()
    return ranks


def trend(widths: Sequence[float], values: Sequence[float]) -> str:
    """'up', 'down' or 'flat' for values over increasing widths (NaNs dropped; the rule is in
    :mod:`widthscope.report.alignment`'s docstring)."""
    pairs = [(w, v) for w, v in zip(widths, values) if not math.isnan(as_number(v))]
    if len(pairs) < 2:
        return "flat"
    w = [p[0] for p in pairs]
    v = [float(p[1]) for p in pairs]
    rw, rv = _ranks(w), _ranks(v)
    if rv.std() == 0 or rw.std() == 0:
        return "flat"
    rho = float(np.corrcoef(rw, rv)[0, 1])
    if rho >= 0.5 and v[-1] > v[0]:
        return "up"
    if rho <= -0.5 and v[-1] < v[0]:
        return "down"
    return "flat"


def point_keys(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
    return sorted({(int(r.get("point_index", 0)), str(r.get("point"))) for r in rows})


def pick_spread(points: list, k: int) -> list:
    """At most k evenly spread points (always the first and last)."""
    if len(points) <= k:
        return points
    idx = sorted({round(i * (len(points) - 1) / (k - 1)) for i in range(k)})
    return [points[i] for i in idx]


def mk_pairs(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    return sorted({(int(r["M"]), int(r["K"])) for r in rows}, key=lambda t: (t[0] * t[1], t))


def claim_mk(rows: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """The (M, K) at which the claims page tests the width trends (the smallest pair); the summary
    sentences and the table quote their numbers at this pair too, so no table or sentence shows one
    (M, K) beside a claim tested at another without saying so."""
    return sorted({(int(r["M"]), int(r["K"])) for r in rows})[0]


def width_values(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    return sorted({r["width"] for r in rows})


def aggregate(
    rows: Sequence[Mapping[str, Any]], col: str, *, by: tuple[str, ...]
) -> dict[tuple, tuple[float, float, float, int]]:
    """(mean, min, max, n) over seeds of ``col`` for each value of ``by`` (one value per seed)."""
    per: dict[tuple, dict[Any, float]] = defaultdict(dict)
    for r in rows:
        per[tuple(r.get(b) for b in by)].setdefault(r.get("seed"), as_number(r.get(col)))
    out = {}
    for k, d in per.items():
        vals = np.array([v for v in d.values() if not math.isnan(v)])
        out[k] = (
            (float(vals.mean()), float(vals.min()), float(vals.max()), len(vals))
            if len(vals)
            else (math.nan, math.nan, math.nan, 0)
        )
    return out


def d_align_by_point(rows, form: str) -> dict[int, tuple[list[float], list[float]]]:
    """point_index -> (widths, seed-mean d_align); d_align does not depend on (M, K)."""
    agg = aggregate(rows, f"{form}_d_align", by=("point_index", "width"))
    out: dict[int, tuple[list, list]] = {}
    for pi, _ in point_keys(rows):
        ws = [w for w in width_values(rows) if (pi, w) in agg]
        out[pi] = (ws, [agg[(pi, w)][0] for w in ws])
    return out
