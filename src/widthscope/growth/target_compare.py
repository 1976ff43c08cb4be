r"""The judgement of the compute-to-target benchmark (:mod:`widthscope.growth.target`): per run label,
the geometric mean speed-up ``F_scratch / F_run`` over seeds against :data:`SPEEDUP`, and against
the small model continued alone, Holm-adjusted together. The rules: docs/growth.md.

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
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..stats.seeds import ALPHA, holm, seed_test

__all__ = ["SPEEDUP", "compare", "answer", "crossover"]

SPEEDUP = 1.3
_BEST = {"best": "run", "best_speedup": "speedup", "best_lo": "speedup_lo", "best_hi": "speedup_hi"}


def crossover(big: Sequence[Sequence[float]], small: Sequence[Sequence[float]]) -> float | None:
    """The FLOPs from which the curve ``big`` (``[(flops, loss), ...]``) stays at or below ``small``
    (interpolated linearly); ``None`` when it ends above ``small`` or ``small`` ends first.

    >>> crossover([[0, 5.0], [2, 3.0], [4, 1.0]], [[0, 5.0], [1, 2.0], [4, 2.0]])
    3.0
    """
    fs, ls = [float(f) for f, _ in small], [float(v) for _, v in small]
    pts = [(float(f), float(v) - float(np.interp(f, fs, ls))) for f, v in big if f > 0 and f <= fs[-1] * (1 + 1e-9)]
    if not pts or pts[-1][1] > 0:
        return None
    i = len(pts) - 1
    while i > 0 and pts[i - 1][1] <= 0:
        i -= 1
    if i == 0:
        return pts[0][0]
    (f0, d0), (f1, d1) = pts[i - 1], pts[i]
    return f0 + (f1 - f0) * d0 / (d0 - d1)


def compare(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One table row per target width, budget and run label."""
    by: dict[tuple[int, int, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("kind") == "grow_target":
            by[(int(r.get("width") or 0), int(r.get("budget_steps") or 0), str(r["run"]))].append(r)

    def order(k: tuple[int, int, str]) -> tuple[int, int, int, str]:  # scratch, continue-small, growth
        return (k[0], k[1], 0 if k[2] == "scratch" else 1 if k[2].startswith("continue-") else 2, k[2])

    table = []
    for width, steps, label in sorted(by, key=order):
        rs = sorted(by[(width, steps, label)], key=lambda r: int(r["seed"]))
        s = [float(r["speedup"]) for r in rs if _positive(r.get("speedup"))]
        test = seed_test([math.log(v) for v in s], (math.log(SPEEDUP), math.inf))
        grown = [float(r["grown_at"]) for r in rs if r.get("grown_at") is not None]
        first = rs[0]
        t = {
            "kind": "grow_target_compare",
            "width": width or None,
            "budget_steps": steps or None,
            "tokens_per_param": _mean([r.get("tokens_per_param") for r in rs]),
            "target_se": _mean([r.get("target_se") for r in rs]),
            "run": label,
            "small": first.get("small"),
            "operator": first.get("operator"),
            "schedule": first.get("schedule"),
            "seeds": len(rs),
            "reached": sum(bool(r.get("reached")) for r in rs),
            **_ends(test, "speedup"),
            "speedup_median": float(np.median(s)) if s else None,
            "speedup_seeds": s,
            "grown_at": float(np.mean(grown)) if grown else None,
            "forced": sum(bool(r.get("forced")) for r in rs),
            "final_loss": float(np.mean([float(r["final_loss"]) for r in rs])),
            "target_loss": float(np.mean([float(r["target_loss"]) for r in rs])),
            "p": test["p"],
            "direction": test["direction"],
            "reached_before_growth": sum(_before_growth(r) for r in rs),
        }
        # a growth label against its small model continued alone, paired by seed: F_continue / F_growth
        cont = by.get((width, steps, f"continue-{t['small']}"), []) if t["operator"] else []
        paired = {int(r["seed"]): r.get("speedup") for r in cont}
        pairs: list[tuple[Any, Any]] = [
            (r.get("speedup"), paired.get(int(r["seed"]))) for r in by[(width, steps, label)]
        ]
        logs = [math.log(float(a) / float(b)) for a, b in pairs if _positive(a) and _positive(b)]
        test = seed_test(logs, (0.0, math.inf))
        t.update(_ends(test, "vs_continue"), p_continue=test["p"], direction_continue=test["direction"])
        if label.startswith("continue-"):
            t.update(_crossovers(rs, {int(r["seed"]): r for r in by.get((width, steps, "scratch"), [])}))
        if t["operator"] and t["reached_before_growth"] == t["seeds"]:  # measured the small model only
            t["verdict"] = "reached before growing"
        table.append(t)
    tests = [(t, "") for t in table if t["run"] != "scratch" and t["p"] is not None and "verdict" not in t]
    tests += [(t, "_continue") for t in table if t.get("p_continue") is not None and "verdict" not in t]
    for (t, family), adj in zip(tests, holm([t["p" + family] for t, family in tests])):
        t["p_holm" + family] = adj
        t["verdict" + family] = t["direction" + family] if adj <= ALPHA else "not resolved"
    for t in table:
        t.setdefault("p_holm", None)
        t.setdefault("verdict", "reference" if t["run"] == "scratch" else "not resolved")
        t.setdefault("p_holm_continue", None)
        t.setdefault("verdict_continue", None if not t.get("operator") else "not resolved")
    return table


def _ends(test: Mapping[str, Any], name: str, f: Callable[[float], float] = math.exp) -> dict[str, float | None]:
    """``name``, ``name_lo``, ``name_hi``: ``f`` of the mean of a :func:`seed_test` and of its interval's ends."""
    ends = (("", "measured"), ("_lo", "low"), ("_hi", "high"))
    return {name + tail: None if test[k] is None else f(test[k]) for tail, k in ends}


def _positive(x: Any) -> bool:
    return x is not None and float(x) > 0


def _mean(values: Sequence[Any]) -> float | None:
    v = [float(x) for x in values if x is not None]
    return sum(v) / len(v) if v else None


def _before_growth(r: Mapping[str, Any]) -> bool:
    events = r.get("events") or []
    return bool(r.get("reached")) and bool(events) and float(r["reach_flops"]) <= float(events[0]["flops"])


def _crossovers(rs: Sequence[Mapping[str, Any]], scratch: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Of a continue-small label's rows: the crossover per seed as a fraction of ``B`` (``None``
    beyond ``B``), the mean and t interval of those within, and how many lie beyond."""
    fractions: list[float | None] = []
    for r in rs:
        ref = scratch.get(int(r["seed"]))
        if ref is None or not ref.get("curve") or not r.get("curve"):
            continue
        f = crossover(ref["curve"], r["curve"])
        fractions.append(None if f is None else f / float(ref["budget_flops"]))
    within = [f for f in fractions if f is not None]
    ends = _ends(seed_test(within, (-math.inf, math.inf)), "crossover", float)
    return {**ends, "crossover_seeds": fractions, "crossover_beyond": len(fractions) - len(within)}


def answer(table: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """ "Does any operator/schedule reach the target with ≥ 1.3× less compute?": ``yes``, ``no``,
    ``not resolved`` or ``crossover beyond budget``; the best growth label and the baselines."""
    growth = [t for t in table if t.get("operator") and t["verdict"] != "reached before growing"]
    holds = [t for t in growth if t["verdict"] == "holds"]
    best = max(growth, key=lambda t: t["speedup"] if t["speedup"] is not None else -math.inf, default=None)
    beyond = {
        str(t["small"]): t
        for t in table
        if str(t["run"]).startswith("continue-") and 2 * t["crossover_beyond"] > t["seeds"]
    }
    if growth and all(str(t["small"]) in beyond for t in growth):
        verdict = "crossover beyond budget"
    elif holds:
        verdict = "yes"
    elif growth and all(t["verdict"] == "does not" for t in growth):
        verdict = "no"
    else:
        verdict = "not resolved"
    return {
        "verdict": verdict,
        "threshold": SPEEDUP,
        "holds": [t["run"] for t in holds],
        **{k: None if best is None else best[v] for k, v in _BEST.items()},
        "does_not": [t["run"] for t in growth if t["verdict"] == "does not"],
        "lower_bound_above": [t["run"] for t in growth if t["speedup_lo"] is not None and t["speedup_lo"] >= SPEEDUP],
        "continue": {t["run"]: t["speedup"] for t in table if str(t["run"]).startswith("continue-")},
        "crossover": {t["run"]: t.get("crossover") for t in table if str(t["run"]).startswith("continue-")},
        "crossover_beyond": sorted(f"continue-{k}" for k in beyond),
        "holds_continue": [t["run"] for t in growth if t.get("verdict_continue") == "holds"],
    }
