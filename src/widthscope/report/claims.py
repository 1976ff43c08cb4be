"""The claims page: one row per published claim, measured from the result rows, never typed in.

Each claim is a slope or a fraction computed per seed; the *interval* is the seed mean ± 2
standard errors (about 95% for a handful of seeds; "–" with one seed), and the verdict is

* **holds**: the whole interval is on the claimed side (or every row satisfies a bound);
* **does not**: the whole interval is on the other side;
* **not resolved**: the interval straddles it, or there are too few seeds, widths or rows.

Claims (spec §7 and the linearization spec): ``d_align`` grows with width; misalignment falls
with width at fixed ``(M, K)``; misalignment falls with ``M = K``; ``B_exact`` lies above the
empirical rate and ``B_align`` above ``B_exact``; intervention retention is 96–99% at the
smallest step; ``C_{D,d}`` (``D + d ≥ 2``) decays with width; deviation slopes match the
published ones. Alignment claims are made per probe regime (sweep, family, probe condition,
probe length); slopes are in ``log width``.

Example::

    >>> from widthscope.report.claims import claims
    >>> rows = [{"kind": "alignment", "family": "f", "width": w, "seed": s, "point": "p", "M": 8, "K": 8,
    ...          "two_d_align": 0.1 * w * (1 + 0.01 * s), "misalignment": 1 / w, "misalignment_low": 0,
    ...          "two_b_exact": 1.0, "two_b_align": 1.0} for w in (8, 16, 32) for s in (0, 1, 2)]
    >>> found = {c["claim"]: c["verdict"] for c in claims(rows)}
    >>> found["f: d_align grows with width"], found["f: misalignment falls with width at M=K=8"]
    ('holds', 'holds')
"""
from __future__ import annotations

import html
import math
from collections import defaultdict
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["claims", "html_table"]


def _ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _slope(x: Sequence[float], y: Sequence[float]) -> float | None:
    if len(set(x)) < 2:
        return None
    return float(np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)[0])


def _interval(vals: Sequence[float]) -> tuple[float, float, float] | None:
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    if not vals:
        return None
    m = float(np.mean(vals))
    if len(vals) < 2:
        return m, math.nan, math.nan
    se = float(np.std(vals, ddof=1)) / math.sqrt(len(vals))
    return m, m - 2 * se, m + 2 * se


def _verdict(iv: tuple[float, float, float] | None, side: str, lo_ok: float = 0.0, hi_ok: float = 0.0) -> str:
    if iv is None or math.isnan(iv[1]):
        return "not resolved"
    _, lo, hi = iv
    if side == "up":
        return "holds" if lo > 0 else ("does not" if hi < 0 else "not resolved")
    if side == "down":
        return "holds" if hi < 0 else ("does not" if lo > 0 else "not resolved")
    return "holds" if lo >= lo_ok and hi <= hi_ok else ("does not" if hi < lo_ok or lo > hi_ok else "not resolved")


def _row(claim: str, iv: tuple[float, float, float] | None, verdict: str, basis: str, unit: str = "") -> dict:
    return {"claim": claim, "measured": None if iv is None else iv[0],
            "low": None if iv is None or math.isnan(iv[1]) else iv[1],
            "high": None if iv is None or math.isnan(iv[2]) else iv[2], "verdict": verdict, "basis": basis,
            "unit": unit}


def _regime(r: Mapping[str, Any]) -> str:
    label = str(r.get("family") or r.get("model") or "?")
    if r.get("probe_set") is not None:
        label += f" · {r['probe_set']}" + (f" L={r['probe_seq_len']}" if r.get("probe_seq_len") is not None else "")
    return label


def _alignment(rows: list[Mapping[str, Any]]) -> list[dict]:
    out = []
    by: dict[str, list] = defaultdict(list)
    for r in rows:
        by[_regime(r)].append(r)
    for label, sel in by.items():
        mks = sorted({(int(r["M"]), int(r["K"])) for r in sel})
        seeds = sorted({r.get("seed") for r in sel})

        def per_seed_width(metric: str, M: int, K: int, log: bool) -> dict[Any, list[tuple[float, float]]]:
            acc: dict[Any, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
            for r in sel:
                v = r.get(metric)
                if (int(r["M"]), int(r["K"])) == (M, K) and _ok(v) and _ok(r.get("width")) and (v > 0 or not log):
                    acc[r.get("seed")][float(r["width"])].append(math.log(v) if log else float(v))
            return {s: [(math.log(w), float(np.median(v))) for w, v in sorted(ws.items())] for s, ws in acc.items()}

        M, K = mks[0]
        for metric, name, side, log in (("two_d_align", "d_align", "up", True), ("two_d_par", "d_par", "up", True),
                                        ("two_d_2", "d_2", "up", True)):
            pts = per_seed_width(metric, M, K, log)
            slopes = [_slope(*zip(*p)) for p in pts.values() if len(p) >= 2]
            iv = _interval([s for s in slopes if s is not None])
            out.append(_row(f"{label}: {name} grows with width" if name == "d_align" else
                            f"{label}: {name} grows with width (which limits d_align)", iv, _verdict(iv, side),
                            f"slope of log {name} (median over points, positive estimates) vs log width; "
                            f"{len(slopes)} seed(s)", "log-log slope"))
        Mw, Kw = mks[0]
        pts = per_seed_width("misalignment", Mw, Kw, False)
        slopes = [_slope(*zip(*p)) for p in pts.values() if len(p) >= 2]
        iv = _interval([s for s in slopes if s is not None])
        verdict = _verdict(iv, "down")
        if iv is not None and all(abs(v) < 1e-12 for v in slopes if v is not None):
            verdict = "not resolved"  # misalignment 0 at every width: nothing to fall
        out.append(_row(f"{label}: misalignment falls with width at M=K={Mw}" if Mw == Kw else
                        f"{label}: misalignment falls with width at M={Mw}, K={Kw}", iv, verdict,
                        f"slope of empirical Pr(A<=0) (median over points) vs log width; {len(slopes)} seed(s)",
                        "per log width"))
        if len(mks) >= 2:
            acc: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
            for r in sel:
                if _ok(r.get("misalignment")):
                    acc[(r.get("seed"), r.get("width"), r.get("point"))].append((math.log(int(r["M"])),
                                                                                 float(r["misalignment"])))
            slopes = [_slope(*zip(*v)) for v in acc.values() if len(v) >= 2]
            per_seed: dict[Any, list[float]] = defaultdict(list)
            for (s, _, _), sl in zip(acc.keys(), slopes):
                if sl is not None:
                    per_seed[s].append(sl)
            iv = _interval([float(np.mean(v)) for v in per_seed.values()])
            verdict = _verdict(iv, "down")
            if iv is not None and all(abs(v) < 1e-12 for vs in per_seed.values() for v in vs):
                verdict = "not resolved"
            out.append(_row(f"{label}: misalignment falls with M and K", iv, verdict,
                            f"slope of Pr(A<=0) vs log M over {len(mks)} (M, K) pairs, mean over widths and points "
                            f"per seed; {len(per_seed)} seed(s)", "per log M"))
        checked = [r for r in sel if _ok(r.get("two_b_exact")) and _ok(r.get("misalignment_low"))]
        above = sum(r["two_b_exact"] >= r["misalignment_low"] for r in checked)
        order = sum(r.get("two_b_align", 1.0) >= r["two_b_exact"] - 1e-12 for r in checked)
        frac = (above + order) / (2 * len(checked)) if checked else None
        verdict = "not resolved" if not checked else ("holds" if frac == 1.0 else "does not")
        out.append(_row(f"{label}: B_exact >= empirical misalignment and B_align >= B_exact",
                        None if frac is None else (frac, math.nan, math.nan), verdict,
                        f"B_exact above the Wilson lower end in {above}/{len(checked)} rows, B_align >= B_exact in "
                        f"{order}/{len(checked)}", "fraction of rows"))
        del seeds
    return out


def _interventions(rows: list[Mapping[str, Any]]) -> list[dict]:
    curves: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("probe") in ("bias", "block") and _ok(r.get("retention")) and _ok(r.get("eta")):
            curves[(r.get("family"), r.get("width"), r.get("seed"), r.get("point"), r.get("probe"))].append(r)
    if not curves:
        return []
    per_seed: dict[Any, list[float]] = defaultdict(list)
    for key, rs in curves.items():
        per_seed[key[2]].append(float(min(rs, key=lambda r: r["eta"])["retention"]))
    iv = _interval([float(np.median(v)) for v in per_seed.values()])
    return [_row("interventions: retention 96–99% at the smallest step", iv, _verdict(iv, "band", 0.96, 1.04),
                 f"median over {len(curves)} curves of actual/predicted ΔL at the smallest η, per seed; "
                 f"{len(per_seed)} seed(s); holds when the interval lies in [0.96, 1.04]", "ratio")]


def _linearization(rows: list[Mapping[str, Any]]) -> list[dict]:
    out = []
    corr: dict[tuple, dict[Any, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("kind") == "correlation" and _ok(r.get("rms")) and r["rms"] > 0 and _ok(r.get("width")) and \
                int(r.get("D", 0)) + int(r.get("d", 0)) >= 2:
            corr[(r.get("name"), r.get("alpha"))][r.get("seed")].append((math.log(r["width"]), math.log(r["rms"])))
    for (name, alpha), seeds in sorted(corr.items(), key=lambda kv: str(kv[0])):
        slopes = [_slope(*zip(*sorted(p))) for p in seeds.values() if len(p) >= 2]
        iv = _interval([s for s in slopes if s is not None])
        out.append(_row(f"{name} decays with width" + (f" (α={alpha:g})" if _ok(alpha) else ""), iv,
                        _verdict(iv, "down"), f"slope of log RMS {name} vs log width; {len(slopes)} seed(s)",
                        "log-log slope"))
    lin = [r for r in rows if r.get("kind") == "linearization" and _ok(r.get("dev_mse")) and r["dev_mse"] > 0]
    if lin:
        from ..linear.sweep import PUBLISHED

        last = max(int(r["step"]) for r in lin)
        dev: dict[Any, dict[Any, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
        for r in lin:
            if int(r["step"]) == last:
                dev[r.get("alpha")][r.get("seed")].append((math.log(r["width"]), math.log(r["dev_mse"])))
        for alpha, seeds in sorted(dev.items(), key=lambda kv: float(kv[0])):
            slopes = [_slope(*zip(*sorted(p))) for p in seeds.values() if len(p) >= 2]
            iv = _interval([s for s in slopes if s is not None])
            pub = PUBLISHED.get(float(alpha))
            if pub is None or iv is None or math.isnan(iv[1]):
                verdict = "not resolved"
            else:
                verdict = "holds" if iv[1] <= pub <= iv[2] else "does not"
            out.append(_row(f"deviation slope at α={float(alpha):g} matches the published {pub}" if pub is not None
                            else f"deviation slope at α={float(alpha):g}", iv, verdict,
                            f"slope of log dev_mse at step {last} vs log width; {len(slopes)} seed(s); holds when the "
                            "published slope lies in the interval", "log-log slope"))
    return out


def claims(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One dict per claim: ``claim, measured, low, high, verdict, basis, unit``."""
    rows = list(rows)
    return (_alignment([r for r in rows if r.get("kind", "alignment") == "alignment" and r.get("M") is not None])
            + _interventions([r for r in rows if r.get("kind") == "intervention"]) + _linearization(rows))


def html_table(items: Sequence[Mapping[str, Any]]) -> str:
    """The claims as an HTML table (escaped), with a coloured verdict."""
    esc = html.escape
    colour = {"holds": "#3c8d2f", "does not": "#b3261e", "not resolved": "#8a6d00"}

    def f(v: Any) -> str:
        return "–" if v is None else f"{v:.3g}"

    parts = ["<table><tr><th class=l>claim</th><th>measured</th><th>interval (±2 SE over seeds)</th>"
             "<th class=l>verdict</th><th class=l>how</th></tr>"]
    for c in items:
        parts.append(f"<tr><td class=l>{esc(c['claim'])}</td><td>{f(c['measured'])}</td>"
                     f"<td>[{f(c['low'])}, {f(c['high'])}]</td>"
                     f"<td class=l style=\"color:{colour.get(c['verdict'], '#000')};font-weight:bold\">"
                     f"{esc(c['verdict'])}</td><td class=l>{esc(c['basis'])}</td></tr>")
    parts.append("</table>")
    return "".join(parts)
