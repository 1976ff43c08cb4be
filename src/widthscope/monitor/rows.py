"""The monitor's records: a ``kind="row"`` per (step, point), ``kind="certified"`` events, logger metrics."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from ..stats import CrossMoments, certified, plan, vacuous_rule

__all__ = ["METRIC_COLUMNS", "make_row", "certified_event", "metrics", "lazy_class"]

#: Columns of a ``kind="row"`` row whose values are numbers (what the logging adapters send).
METRIC_COLUMNS = (
    "d_par",
    "d_2",
    "d_align",
    "b_exact",
    "b_align",
    "expectation",
    "misalignment",
    "misalignment_low",
    "misalignment_high",
    "plan_M_exact",
    "plan_M_align",
    "d_align_one",
    "probe_s",
    "stats_s",
)


_TWO = ("populations", "d_par", "d_2", "d_align", "vacuous", "reason", "b_exact", "b_align", "expectation")


def make_row(r: dict[str, Any], step: int, M: int, K: int, delta: float) -> dict[str, Any]:
    """The ``kind="row"`` row of one point's :func:`widthscope.certification.statistics` result: the
    two-population certificate, the one-population ``d_align``, the misalignment and the planner's ``M = K``."""
    c = r["certificates"][0]
    two, one, mis = c["two"], c["one"], c["misalignment"]
    p = plan(CrossMoments(**r["cross_moments"]), target=delta)
    row = {
        "kind": "row",
        "step": step,
        "point": r["point"],
        "M": M,
        "K": K,
        **{k: r[k] for k in ("n_train", "n_test", "d")},
        **{k: two[k] for k in _TWO},
        "d_align_one": one["d_align"],
        **{f"misalignment{s}": mis[k] for s, k in (("", "probability"), ("_low", "low"), ("_high", "high"))},
        "draws": mis["draws"],
        "delta": delta,
        "plan_M_exact": p.equal_exact,
        "plan_M_align": p.equal_align,
    }
    return vacuous_rule(row)


def certified_event(r: dict[str, Any], delta: float) -> dict[str, Any] | None:
    """The ``kind="certified"`` event of row ``r`` when its point is certified at ``delta``, else None."""
    if not certified(r["b_exact"], r["vacuous"], delta):
        return None
    event = {"kind": "certified", "step": r["step"], "point": r["point"], "delta": delta}
    return event | {k: r[k] for k in ("b_exact", "M", "K")}


def metrics(rows: Iterable[dict[str, Any]], prefix: str = "align") -> dict[str, float]:
    """Flat ``{"align/<point>/<column>": number}`` of the rows (``None`` values left out)."""
    out: dict[str, float] = {}
    for r in rows:
        if r.get("kind") == "certified":
            out[f"{prefix}/{r['point']}/certified_step"] = float(r["step"])
            continue
        for col in METRIC_COLUMNS:
            v = r.get(col)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out[f"{prefix}/{r['point']}/{col}"] = float(v)
    return out


def lazy_class(module: str, name: str, make: Callable[[], type]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that builds class ``name`` with ``make()`` on first use (so the framework
    it subclasses is imported only then)."""
    cache: dict[str, type] = {}

    def getattr_(attr: str) -> Any:
        if attr == name:
            if name not in cache:
                cache[name] = make()
            return cache[name]
        raise AttributeError(f"module {module!r} has no attribute {attr!r}")

    return getattr_
