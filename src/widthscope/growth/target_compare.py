r"""The judgement of the compute-to-target benchmark (:mod:`widthscope.growth.target`).

Per target width and run label (``scratch``, ``continue-depth``/``continue-width``,
``<operator>/<schedule>``) over seeds: the per-seed speed-up ``s = F_scratch / F_run`` to the seed's
own from-scratch final loss,
summarised on the log scale (ratios multiply): the geometric mean and its 95% Student-t interval
``exp(mean(log s) ± t_{0.975,n−1} sd(log s)/√n)`` — the interval of the claims page
(``widthscope.report.claims_stats.seed_test``, restated here as :func:`seed_test`; seeds are
independent). A run that never reached the target within ``cap · B`` enters at its bound
``F_scratch / (cap · B)`` (``reached`` counts the others). The true speed-up is smaller than that
bound, so a censored seed is counted too favourably — but the bound is at most ``1 / cap ≤ 1``, below
the claimed 1.3, so censored seeds can never carry a label to "holds", and for "does not" the
overstatement is conservative.

Verdict, calibrated like every claim of the claims page: the claimed region is ``s ≥ 1.3``
(:data:`SPEEDUP`); each label's p-value is that of :func:`seed_test` on ``log s`` against
``[log 1.3, ∞)``, Holm-adjusted over every label of the table (continue-small included: the page
is read label by label, so family-wise control). A label *holds* when its adjusted ``p ≤ 0.05``
with the interval above 1.3 (for a single label: the lower 95% bound is ≥ 1.3), *does not* when
adjusted ``p ≤ 0.05`` with the interval below, else *not resolved*. The benchmark's answer to
"does any operator/schedule reach the target with ≥ 1.3× less compute?" is *yes* when some label
holds, *no* when every label does not, else *not resolved*.

Beside it, each growth label against the practitioner's other baseline, its small model continued
alone (paired by seed): ``vs_continue = F_continue / F_growth`` (> 1: growing reached the target
first), geometric mean with its 95% t interval; and ``reached_before_growth``, the seeds where the
small model had reached the target before the schedule grew it (the growth run inherits that
crossing). A label where every seed did so measured the small model, not the operator: its verdict is
"reached before growing" and it is left out of the Holm family and of the answer.

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


# The claims page's statistics (report.claims_stats.seed_test / holm), restated here because a
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
