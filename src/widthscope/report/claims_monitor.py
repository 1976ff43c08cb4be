r"""The claim "wider models certify earlier", from the alignment monitor's rows over training.

Input: per sweep cell ``(family, width, seed)`` either the monitor's per-``(step, point)`` rows
(:mod:`widthscope.monitor.core`: ``step, point, b_exact, vacuous, delta``), tagged with the cell's
``family, width, seed``, or the sweep's summary columns (first certification step per point, the
training length, ``δ``). Column names live in :data:`ROW_KINDS` and :data:`SUMMARY` only.

**Certification step.** For a seed, the steps monitored in *every* cell of that seed form a
common grid (a denser schedule in one width cannot make it look earlier), ending at the common
horizon ``C`` (the smallest last monitored step, or training length, over the seed's cells). A
point's certification step ``T`` is the earliest grid step from which every grid step up to ``C``
has a non-vacuous ``B_exact ≤ δ`` (it *stays* certified). Not the first such step: on the demo's
shifted pools every point is certified at initialisation, loses it early in training and regains
it later, so the first step is 0 everywhere and says nothing about training; a user who stops to
grow acts on a certificate that holds from then on. When certification is monotone the two agree
(the calibration's latent times are). Summary columns: ``monitor_cert_from_step`` when present,
else the first certified step.
A point not certified at ``C`` is **right-censored** and set to ``C``: the same value for every
width, so censoring only pulls the widths together (a bias toward "no effect", never toward an
effect), and under no width effect ``min(T, C)`` has the same distribution at every width.

**Per seed** (seeds are the independent replicates): ``y_w`` = median over points of ``log(1 + T)``
in the width-``w`` cell, and the least-squares slope ``β_s`` of ``y`` on ``log w`` over the seed's
widths (≥ 2). The claim's region is ``β < 0`` (earlier in wider models); the per-seed slopes go
through the page's rule (:func:`widthscope.report.claims.seed_test`: 95% Student t interval,
Holm over the page, seeds needed): **holds** only when the interval lies below 0, **does not** when
it lies above. Not tested (not resolved, with the reason): fewer than 2 seeds with 2 widths, no
certification in any cell, the same ``y`` in every cell, or the same slope in every seed (the
steps are discrete: equal slopes leave the t interval no spread to rest on).

Calibrated by simulation (no width trend, censoring, heavy tails; see docs/sweeps.md#claims-page).
"""

from __future__ import annotations

import math
from collections import defaultdict
from statistics import median
from typing import Any, Iterable, Mapping, Sequence, TypeGuard

from ..stats import certified, certified_steps

__all__ = ["ROW_KINDS", "SUMMARY", "cells_from_rows", "seed_slopes", "certify_earlier"]

#: ``kind`` of the monitor's per-(step, point) rows (core.py writes "row"; a sweep may retag them).
ROW_KINDS = ("row", "monitor")
#: The sweep's summary columns: first certification step (per point: a ``{point: step}`` dict, or a
#: number on a row with ``point``; ``None``/NaN/negative = never certified), training length, δ.
#: ``monitored`` False marks an alignment row of a point the monitor did not probe; ``steps``, the
#: probed steps when given, are the grid and their last one the horizon (as the rows would give).
SUMMARY = {
    "first_cert": "monitor_first_cert_step",
    "steps_total": "monitor_steps_total",
    "delta": "monitor_delta",
    "monitored": "monitor_point",
    "steps": "monitor_steps",
    "cert_from": "monitor_cert_from_step",
}
CELL = ("family", "width", "seed")


def _num(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class Cell:
    """One cell's monitor record: certified steps per point, the monitored steps, the horizon."""

    def __init__(self) -> None:
        self.certified: dict[str, set[int]] = defaultdict(set)  # point -> steps with B_exact <= δ
        self.points: set[str] = set()
        self.steps: set[int] | None = set()  # None: summary columns only (no grid known)
        self.horizon: int | None = None
        self.deltas: set[float] = set()
        self.first_only = False  # summary columns: only the first certified step is known


def _add_row(c: Cell, r: Mapping[str, Any]) -> None:
    step, point = int(r["step"]), str(r["point"])
    c.points.add(point)
    c.steps.add(step)  # type: ignore[union-attr]
    c.horizon = step if c.horizon is None else max(c.horizon, step)
    if _num(r.get("delta")):
        c.deltas.add(float(r["delta"]))
    b = r.get("b_exact")
    if certified(b, r.get("vacuous"), r.get("delta")):
        c.certified[point].add(step)


def _add_summary(c: Cell, r: Mapping[str, Any]) -> None:
    v = r[SUMMARY["cert_from"]] if SUMMARY["cert_from"] in r else r[SUMMARY["first_cert"]]
    per = v if isinstance(v, Mapping) else ({str(r["point"]): v} if r.get("point") is not None else {})
    c.steps, c.first_only = None, True  # no grid known unless the probed steps are given (below)
    for p, s in per.items():
        c.points.add(str(p))
        if _num(s) and s >= 0:
            c.certified[str(p)].add(int(s))
    steps = r.get(SUMMARY["steps"])
    if isinstance(steps, (list, tuple)) and steps and all(_num(x) for x in steps):
        c.steps, c.horizon = {int(x) for x in steps}, int(max(steps))
    elif _num(r.get(SUMMARY["steps_total"])):
        c.horizon = int(r[SUMMARY["steps_total"]])
    if _num(r.get(SUMMARY["delta"])):
        c.deltas.add(float(r[SUMMARY["delta"]]))


def cells_from_rows(rows: Iterable[Mapping[str, Any]]) -> dict[tuple, Cell]:
    """``{(family, width, seed): Cell}`` from monitor rows and/or summary columns (monitor rows win
    for a cell that has both: they give the grid)."""
    by_rows: dict[tuple, Cell] = defaultdict(Cell)
    by_summary: dict[tuple, Cell] = defaultdict(Cell)
    for r in rows:
        if not all(r.get(k) is not None for k in CELL) or not _num(r.get("width")):
            continue
        key = tuple(r[k] for k in CELL)
        if r.get("kind") in ROW_KINDS and _num(r.get("step")) and r.get("point") is not None:
            _add_row(by_rows[key], r)
        elif (SUMMARY["first_cert"] in r or SUMMARY["cert_from"] in r) and r.get(SUMMARY["monitored"]) is not False:
            _add_summary(by_summary[key], r)
    return {**{k: v for k, v in by_summary.items() if k not in by_rows}, **by_rows}


def seed_slopes(cells: Mapping[tuple, Cell]) -> dict[str, dict[str, Any]]:
    """Per family: per-seed slopes of median log(1 + first certification step) on log width
    (censored at the seed's common horizon) and the counts the claim's basis reports."""
    fams: dict[Any, dict[Any, dict[float, Cell]]] = defaultdict(lambda: defaultdict(dict))
    no_horizon: dict[Any, int] = defaultdict(int)
    for (fam, width, seed), c in cells.items():
        if c.points and c.horizon is not None:
            fams[fam][seed][float(width)] = c
        elif c.points:  # summary columns without the training length: cannot be censored, left out
            no_horizon[fam] += 1
    out: dict[str, dict[str, Any]] = {}
    for fam, seeds in fams.items():
        slopes: list[float] = []
        ys: list[float] = []
        deltas: set[float] = set()
        n_pts = n_cens = 0
        for ws in seeds.values():
            if len(ws) < 2:
                continue
            horizon = min(c.horizon for c in ws.values() if c.horizon is not None)  # set in every cell of fams
            grids = [c.steps for c in ws.values() if c.steps is not None]
            grid = set.intersection(*grids) if grids else None
            pts = []
            for w, c in sorted(ws.items()):
                deltas |= c.deltas
                t = []
                for p in sorted(c.points):
                    hit = [s for s in c.certified.get(p, ()) if s <= horizon]
                    if c.first_only:  # summary: seen at the next common step (if the grid is known)
                        if grid is not None:
                            hit = [min(g for g in grid if g >= s) for s in hit if any(g >= s for g in grid)]
                    else:  # the rows: the earliest step from which it stays certified up to the horizon
                        steps = grid if grid is not None else c.steps or set()  # rows: c.steps is a set
                        seen = [s for s in steps if s <= horizon]
                        cert = set(hit)
                        since = certified_steps((g, g in cert) for g in seen)[1]
                        hit = [] if since is None else [since]
                    hit = [s for s in hit if s <= horizon]
                    n_pts += 1
                    n_cens += not hit
                    t.append(math.log1p(min(hit) if hit else horizon))
                pts.append((math.log(w), float(median(t))))
            mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
            slopes.append(sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts))
            ys.extend(y for _, y in pts)
        out[str(fam)] = {
            "slopes": slopes,
            "y": ys,
            "points": n_pts,
            "censored": n_cens,
            "deltas": sorted(deltas),
            "no_horizon": no_horizon.get(fam, 0),
        }
    return out


def certify_earlier(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per family with monitor records, what the claim is judged on: ``name``, the per-seed ``slopes``,
    ``basis`` and ``gate`` (the reason it is not tested, or None); :func:`widthscope.report.claims.claims`
    turns them into claim rows with the page's rule."""
    out = []
    for fam, s in sorted(seed_slopes(cells_from_rows(rows)).items()):
        d = s["deltas"]
        dtext = f"δ={d[0]:g}" if len(d) == 1 else "δ"
        gate = None
        if len(d) > 1:
            gate = f"cells certify at different δ ({', '.join(f'{v:g}' for v in d)})"
        elif s["points"] and s["censored"] == s["points"]:
            gate = "no point certified within training in any cell (all censored)"
        elif s["y"] and max(s["y"]) - min(s["y"]) == 0:
            gate = "the same certification step in every cell (nothing to come earlier)"
        elif len(s["slopes"]) >= 2 and max(s["slopes"]) - min(s["slopes"]) == 0:
            gate = "every seed gives the same slope (discrete steps: no spread for a t interval)"
        out.append(
            {
                "name": f"{fam}: wider models certify earlier (step from which B_exact <= {dtext} holds)",
                "slopes": s["slopes"],
                "group": str(fam),
                "gate": gate,
                "basis": (
                    f"per-seed slope of log(1 + step from which the point stays certified) (median over points, "
                    f"on the steps monitored in every cell of the seed) vs log width; {s['censored']} of "
                    f"{s['points']} (cell, point) not certified at the last common step, censored there "
                    "(biases toward no effect); holds when the interval lies below 0"
                    + (f"; {s['no_horizon']} cell(s) without a training length left out" if s["no_horizon"] else "")
                ),
            }
        )
    return out
