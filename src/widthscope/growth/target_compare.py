r"""The judgement of the compute-to-target benchmark (:mod:`widthscope.growth.target`).

Per target width and run label, the per-seed speed-up ``s = F_scratch / F_run`` is summarised as a
geometric mean with its 95% Student-t interval (censored seeds at their bound) and judged against
``s ≥ 1.3`` (:data:`SPEEDUP`), Holm-adjusted over the table; beside it ``vs_continue`` against the
small model continued alone. The rules: docs/growth.md.

Example::

    >>> rows = [{"kind": "grow_target", "run": "a", "seed": s, "speedup": v, "reached": True,
    ...          "final_loss": 2.0, "target_loss": 2.1} for s, v in enumerate([2.0, 2.1, 1.9, 2.05, 1.95])]
    >>> t = compare(rows)
    >>> t[0]["verdict"], round(t[0]["speedup"], 2)
    ('holds', 2.0)
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import special as _sp

ALPHA = 0.05


# The claims page's statistics (report.claims.seed_test / holm), restated here because a
# pipeline may not import the presentation layer; tests/test_grow_target.py checks they agree.
def seed_test(values: Sequence[float], region: tuple[float, float]) -> dict[str, Any]:
    """Student-t 95% interval of the mean of ``values`` and the p-values of "the mean lies in
    ``region``" (``p_holds``) and of "it lies outside" (``p_not``): an intersection-union test at
    each finite end; ``p = min(1, 2 min(p_holds, p_not))``; ``None`` fields with fewer than 2 values."""
    x = np.asarray([v for v in values if math.isfinite(v)], float)
    out: dict[str, Any] = dict(measured=float(x.mean()) if len(x) else None, low=None, high=None, p=None)
    out["direction"] = None
    if len(x) < 2:
        return out
    n, m, sd = len(x), float(x.mean()), float(x.std(ddof=1))
    se, df = sd / math.sqrt(n), n - 1

    def sides(c: float) -> tuple[float, float]:  # (P(T >= t), P(T <= t)) under mean = c
        if se > 0:
            tt = (m - c) / se
            return float(_sp.stdtr(df, -tt)), float(_sp.stdtr(df, tt))
        return (0.5, 0.5) if m == c else ((0.0, 1.0) if m > c else (1.0, 0.0))

    a, b = region
    above_a, below_a = sides(a) if math.isfinite(a) else (0.0, 1.0)
    above_b, below_b = sides(b) if math.isfinite(b) else (1.0, 0.0)
    p_holds, p_not = max(above_a, below_b), min(below_a, above_b)
    half = float(_sp.stdtrit(df, 1 - ALPHA / 2)) * se
    out.update(low=m - half, high=m + half, p=min(1.0, 2 * min(p_holds, p_not)))
    out["direction"] = "holds" if p_holds <= p_not else "does not"
    return out


def holm(ps: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values (family-wise error control under any dependence)."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adj, run = [0.0] * len(ps), 0.0
    for k, i in enumerate(order):
        run = max(run, min(1.0, (len(ps) - k) * ps[i]))
        adj[i] = run
    return adj


__all__ = ["SPEEDUP", "compare", "answer"]

SPEEDUP = 1.3


def _label_order(label: str) -> tuple[int, str]:
    if label == "scratch":
        return (0, label)
    if label.startswith("continue-"):
        return (1, label)
    return (2, label)


def compare(rows: Sequence[Mapping[str, Any]], *, threshold: float = SPEEDUP) -> list[dict[str, Any]]:
    """One table row per run label (see the module docstring)."""
    by: dict[tuple[int, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("kind") == "grow_target":
            by[(int(r.get("width") or 0), str(r["run"]))].append(r)
    table = []
    for width, label in sorted(by, key=lambda k: (k[0], *_label_order(k[1]))):
        rs = sorted(by[(width, label)], key=lambda r: int(r["seed"]))
        s = [float(r["speedup"]) for r in rs if r.get("speedup") is not None and float(r["speedup"]) > 0]
        test = seed_test([math.log(v) for v in s], (math.log(threshold), math.inf))
        grown = [float(r["grown_at"]) for r in rs if r.get("grown_at") is not None]
        first = rs[0]
        table.append(
            {
                "kind": "grow_target_compare",
                "width": width or None,
                "run": label,
                "small": first.get("small"),
                "operator": first.get("operator"),
                "schedule": first.get("schedule"),
                "seeds": len(rs),
                "reached": sum(bool(r.get("reached")) for r in rs),
                "speedup": math.exp(test["measured"]) if test["measured"] is not None else None,
                "speedup_lo": math.exp(test["low"]) if test["low"] is not None else None,
                "speedup_hi": math.exp(test["high"]) if test["high"] is not None else None,
                "speedup_median": float(np.median(s)) if s else None,
                "speedup_seeds": s,
                "grown_at": float(np.mean(grown)) if grown else None,
                "forced": sum(bool(r.get("forced")) for r in rs),
                "final_loss": float(np.mean([float(r["final_loss"]) for r in rs])),
                "target_loss": float(np.mean([float(r["target_loss"]) for r in rs])),
                "p": test["p"],
                "direction": test["direction"],
                # the target was reached by the small model before it grew (the growth run inherits it)
                "reached_before_growth": sum(_before_growth(r) for r in rs),
            }
        )
    _versus_continue(table, by)
    # a growth label whose every seed reached the target before growing measured the small model only
    for t in table:
        if t.get("operator") and t["seeds"] and t["reached_before_growth"] == t["seeds"]:
            t["verdict"] = "reached before growing"
    tested = [t for t in table if t["run"] != "scratch" and t["p"] is not None and "verdict" not in t]
    for t, adj in zip(tested, holm([t["p"] for t in tested])):
        t["p_holm"] = adj
        t["verdict"] = t["direction"] if adj <= ALPHA else "not resolved"
    for t in table:
        t.setdefault("p_holm", None)
        t.setdefault("verdict", "reference" if t["run"] == "scratch" else "not resolved")
    return table


def _before_growth(r: Mapping[str, Any]) -> bool:
    events = r.get("events") or []
    return bool(r.get("reached")) and bool(events) and float(r["reach_flops"]) <= float(events[0]["flops"])


def _versus_continue(table: list[dict[str, Any]], by: Mapping[tuple[int, str], Sequence[Mapping[str, Any]]]) -> None:
    """Each growth label against its small model continued alone, paired by seed: the ratio
    ``F_continue / F_growth`` of the FLOPs to the target (> 1: growing got there first), geometric
    mean and 95% t interval (``vs_continue``, ``vs_continue_lo``, ``vs_continue_hi``)."""
    for t in table:
        t.update(vs_continue=None, vs_continue_lo=None, vs_continue_hi=None)
        if not t.get("operator"):
            continue
        cont = {int(r["seed"]): r for r in by.get((int(t["width"] or 0), f"continue-{t['small']}"), [])}
        logs = []
        for r in by[(int(t["width"] or 0), t["run"])]:
            c = cont.get(int(r["seed"]))
            if c is None or r.get("speedup") is None or c.get("speedup") is None:
                continue
            if float(r["speedup"]) > 0 and float(c["speedup"]) > 0:
                logs.append(math.log(float(r["speedup"]) / float(c["speedup"])))
        test = seed_test(logs, (0.0, math.inf))
        if test["measured"] is not None:
            t["vs_continue"] = math.exp(test["measured"])
        if test["low"] is not None:
            t["vs_continue_lo"], t["vs_continue_hi"] = math.exp(test["low"]), math.exp(test["high"])


def answer(table: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """ "Does any operator/schedule reach the target with ≥ 1.3× less compute?" from the table:
    ``yes`` / ``no`` / ``not resolved``, the best growth label and the continue-small baselines."""
    growth = [t for t in table if t.get("operator") and t["verdict"] != "reached before growing"]
    holds = [t for t in growth if t["verdict"] == "holds"]
    best = max(growth, key=lambda t: t["speedup"] if t["speedup"] is not None else -math.inf, default=None)
    if holds:
        verdict = "yes"
    elif growth and all(t["verdict"] == "does not" for t in growth):
        verdict = "no"
    else:
        verdict = "not resolved"
    return {
        "verdict": verdict,
        "threshold": SPEEDUP,
        "holds": [t["run"] for t in holds],
        "best": None if best is None else best["run"],
        "best_speedup": None if best is None else best["speedup"],
        "best_lo": None if best is None else best["speedup_lo"],
        "best_hi": None if best is None else best["speedup_hi"],
        "does_not": [t["run"] for t in growth if t["verdict"] == "does not"],
        # the per-label rule without the correction for testing many labels: lower 95% bound >= 1.3
        "lower_bound_above": [t["run"] for t in growth if t["speedup_lo"] is not None and t["speedup_lo"] >= SPEEDUP],
        "continue": {t["run"]: t["speedup"] for t in table if str(t["run"]).startswith("continue-")},
    }
