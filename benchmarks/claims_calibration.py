"""Calibration of the claims page's verdicts, by simulation through ``widthscope.report.claims.claims``.

Every scenario builds result rows, runs the real ``claims(rows)`` and counts the verdicts of one claim:

* ``null``: ``d_align grows with width`` with no width trend at all —
  ``log d_align[s, w] = o_s + b_s log w + e_{s,w}``, seed offsets ``o_s ~ N(0, 1)``, seed slopes
  ``b_s`` with mean 0 and SD 0.2, noise ``e`` with SD 0.5, widths 32–512; ``normal`` or ``heavy``
  (``b_s`` and ``e`` Student t with 3 degrees of freedom, scaled to the same SD). Any decision
  ("holds" or "does not") is a false decision. The practitioner's baseline — the old rule, seed mean
  ± 2 standard errors of the same per-seed slopes — is counted on the same pages.
* ``power``: the same with a true slope 0.5 per log width: the fraction decided "holds".
* ``equivalence_boundary``: the deviation slope at α = 0 sits exactly at published + tolerance
  (−1.14 + 0.1): "holds" and "does not" are both false decisions.
* ``band_boundary``: intervention retention at the default step sits exactly at the band's end 0.99.
* ``bound_boundary``: ``B_exact`` equals the true misalignment rate in 20 rows of 1000 draws.
* ``monitor_null`` / ``monitor_power`` / ``monitor_censored_null``: "wider models certify earlier"
  from the sweep's monitor summary columns. Latent first certification time
  ``log τ[s,w,p] = log μ + o_s + (β + b_s) log(w/32) + u_p + e_{s,w,p}`` (seed offset SD 0.5, seed
  slope SD 0.2, point effect SD 0.3, noise SD 0.6; normal or Student t(3)), widths 32–256, 4 points,
  observed on the grid every 10 steps of a 150-step training, never certified (censored) when
  ``τ > 150``. Null ``β = 0`` with ``μ = 60`` (about 14% censored) and ``μ = 150`` (about half);
  power at ``β = −0.5`` (τ halves over a 4× width). Any decision under the null is false.
  ``monitor_row_form``: on the first pages of each null setting the same latent times are written as
  the monitor's per-step rows: the claim must give the same per-seed values and verdict.

Usage::

    python benchmarks/claims_calibration.py            # writes benchmarks/results/claims-calibration.json

The test suite reruns :func:`run` and checks the committed file (tests/test_claims_calibration.py).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from widthscope.report.claims import claims  # noqa: E402

OUT = HERE / "results" / "claims-calibration.json"
SEEDS = (2, 3, 5, 10)
WIDTHS = (32, 64, 128, 256, 512)
N_NULL = 1000       # pages per (seed count, noise) under the null
N_OTHER = 250       # pages per seed count for power and the boundary scenarios
SEED_SLOPE_SD, NOISE_SD, OFFSET_SD = 0.2, 0.5, 1.0
RNG_SEED = 20261201
MON_WIDTHS, MON_POINTS, MON_STEPS, MON_EVERY = (32, 64, 128, 256), 4, 150, 10
MON_SD = {"offset": 0.5, "seed_slope": 0.2, "point": 0.3, "noise": 0.6}
MON_MU, MON_MU_CENSORED, MON_POWER_SLOPE = 60.0, 150.0, -0.5
N_ROW_FORM = 5     # pages per null setting also checked in the monitor's row form


def _draw(rng: np.random.Generator, heavy: bool, sd: float, size: Any) -> np.ndarray:
    if heavy:  # Student t(3) has variance 3
        return rng.standard_t(3, size=size) * sd / math.sqrt(3)
    return rng.normal(0.0, sd, size=size)


def _trend_rows(rng, n_seeds: int, slope: float, heavy: bool) -> list[dict]:
    lw = np.log(WIDTHS)
    off = rng.normal(0.0, OFFSET_SD, n_seeds)
    b = slope + _draw(rng, heavy, SEED_SLOPE_SD, n_seeds)
    e = _draw(rng, heavy, NOISE_SD, (n_seeds, len(WIDTHS)))
    y = off[:, None] + b[:, None] * lw[None, :] + e
    return [{"kind": "alignment", "family": "sim", "width": w, "seed": s, "point": "p", "point_index": 0,
             "M": 8, "K": 8, "two_d_align": float(math.exp(y[s, i]))}
            for s in range(n_seeds) for i, w in enumerate(WIDTHS)]


def _baseline_decides(rows: list[dict]) -> bool:
    """The old rule: decided when the seed mean ± 2 SE of per-seed slopes excludes 0."""
    ns = len({r["seed"] for r in rows})
    y = np.log([r["two_d_align"] for r in rows]).reshape(ns, len(WIDTHS))  # rows are seed-major
    xc = np.log(WIDTHS) - np.log(WIDTHS).mean()
    sl = (y - y.mean(1, keepdims=True)) @ xc / (xc @ xc)
    se = sl.std(ddof=1) / math.sqrt(len(sl))
    return bool(abs(sl.mean()) > 2 * se)


def _verdict(rows: list[dict], cid: str) -> str:
    return next(c["verdict"] for c in claims(rows) if c["id"] == cid)


def _dev_rows(rng, n_seeds: int) -> list[dict]:
    from widthscope.linearization.summary import PUBLISHED
    from widthscope.report.claims import PUBLISHED_TOLERANCE

    slope = PUBLISHED[0.0] + PUBLISHED_TOLERANCE
    rows = _trend_rows(rng, n_seeds, slope, False)
    return [{"kind": "linearization", "alpha": 0.0, "step": 100, "width": r["width"], "seed": r["seed"],
             "dev_mse": r["two_d_align"]} for r in rows]


def _retention_rows(rng, n_seeds: int) -> list[dict]:
    from widthscope.report.claims import RETENTION_BAND

    rows = []
    for s in range(n_seeds):
        off = rng.normal(0.0, 0.01)
        for p in range(4):
            rows.append({"kind": "intervention", "probe": "bias", "family": "sim", "width": 64, "seed": s,
                         "point": f"p{p}", "eta": 1.0, "rel_step": 1e-3,
                         "retention": RETENTION_BAND[1] + off + float(rng.normal(0.0, 0.01))})
    return rows


def _bound_rows(rng) -> list[dict]:
    q, n = 0.3, 1000
    return [{"kind": "alignment", "family": "sim", "width": 64, "seed": 0, "point": f"p{i}", "point_index": i,
             "M": 8, "K": 8, "two_b_exact": q, "misalignment": int(rng.binomial(n, q)) / n,
             "misalignment_draws": n} for i in range(20)]


def _first_cert(rng, n_seeds: int, slope: float, heavy: bool, mu: float) -> np.ndarray:
    """Observed first certification steps ``(seed, width, point)``; -1 = never within training."""
    lw = np.log(np.asarray(MON_WIDTHS) / MON_WIDTHS[0])
    off = rng.normal(0.0, MON_SD["offset"], n_seeds)
    b = slope + _draw(rng, heavy, MON_SD["seed_slope"], n_seeds)
    u = rng.normal(0.0, MON_SD["point"], MON_POINTS)
    e = _draw(rng, heavy, MON_SD["noise"], (n_seeds, len(MON_WIDTHS), MON_POINTS))
    tau = np.exp(math.log(mu) + off[:, None, None] + b[:, None, None] * lw[None, :, None] + u[None, None, :] + e)
    t = MON_EVERY * np.ceil(tau / MON_EVERY)  # seen at the first monitored step at or after τ
    return np.where(t <= MON_STEPS, t, -1).astype(int)


def _monitor_summary_rows(t: np.ndarray) -> list[dict]:
    from widthscope.report.claims import SUMMARY

    return [{"family": "sim", "width": w, "seed": s, SUMMARY["steps_total"]: MON_STEPS, SUMMARY["delta"]: 0.05,
             SUMMARY["first_cert"]: {f"p{p}": (int(t[s, i, p]) if t[s, i, p] >= 0 else None)
                                     for p in range(MON_POINTS)}}
            for s in range(t.shape[0]) for i, w in enumerate(MON_WIDTHS)]


def _monitor_step_rows(t: np.ndarray) -> list[dict]:
    """The same times as the monitor's per-(step, point) rows (core.py schema)."""
    return [{"kind": "row", "family": "sim", "width": w, "seed": s, "step": g, "point": f"p{p}", "delta": 0.05,
             "vacuous": False, "b_exact": 0.01 if 0 <= t[s, i, p] <= g else 0.5}
            for s in range(t.shape[0]) for i, w in enumerate(MON_WIDTHS)
            for g in range(0, MON_STEPS + 1, MON_EVERY) for p in range(MON_POINTS)]


def _monitor_claim(rows: list[dict]) -> dict:
    return next(c for c in claims(rows) if c["id"] == "certify_earlier")


def _monitor(n_null: int, n_other: int, seed: int) -> dict[str, Any]:
    """The monitor scenarios on their own random stream (the other scenarios' numbers stay put)."""
    rng = np.random.default_rng(seed + 1)
    n_null, n_other = n_null // 2, n_other // 2  # half the pages of the other scenarios: the test reruns them
    out: dict[str, Any] = {"monitor_null": {}, "monitor_censored_null": {}, "monitor_power": {}}
    agree = checked = 0
    for name, mu, slope, n in (("monitor_null", MON_MU, 0.0, n_null), ("monitor_censored_null", MON_MU_CENSORED,
                                                                        0.0, n_other),
                               ("monitor_power", MON_MU, MON_POWER_SLOPE, n_other)):
        for noise in ("normal", "heavy"):
            for ns in SEEDS:
                k = cens = holds = 0
                for i in range(n):
                    t = _first_cert(rng, ns, slope, noise == "heavy", mu)
                    c = _monitor_claim(_monitor_summary_rows(t))
                    k += (c["verdict"] == "holds") if slope else (c["verdict"] != "not resolved")
                    holds += c["verdict"] == "holds"
                    cens += int((t < 0).sum())
                    if slope == 0 and i < N_ROW_FORM:
                        r = _monitor_claim(_monitor_step_rows(t))
                        checked += 1
                        agree += r["verdict"] == c["verdict"] and (r["measured"] == c["measured"] or abs(
                            r["measured"] - c["measured"]) <= 1e-12 * max(1.0, abs(c["measured"])))
                out[name][f"{noise}/{ns}"] = {**_rate(k, n), "censored": cens / (n * t.size),
                                              "holds": _rate(holds, n)}
    out["monitor_null_pooled"] = _rate(sum(v["count"] for v in out["monitor_null"].values()),
                                       n_null * len(out["monitor_null"]))
    out["monitor_row_form"] = {"pages": checked, "agree": agree}
    return out


def _rate(k: int, n: int) -> dict[str, Any]:
    from scipy.stats import beta

    return {"pages": n, "count": k, "rate": k / n,
            "upper95": float(beta.ppf(0.95, k + 1, n - k)) if k < n else 1.0}  # one-sided Clopper–Pearson


def run(n_null: int = N_NULL, n_other: int = N_OTHER, seed: int = RNG_SEED) -> dict[str, Any]:
    """All scenarios; returns the JSON-ready dict (same numbers for the same arguments)."""
    rng = np.random.default_rng(seed)
    grows = "d_align_grows"
    out: dict[str, Any] = {"settings": {"widths": list(WIDTHS), "seed_slope_sd": SEED_SLOPE_SD,
                                        "noise_sd": NOISE_SD, "offset_sd": OFFSET_SD, "rng_seed": seed,
                                        "n_null": n_null, "n_other": n_other,
                                        "monitor": {"widths": list(MON_WIDTHS), "points": MON_POINTS,
                                                    "steps": MON_STEPS, "every": MON_EVERY, "sd": MON_SD,
                                                    "mu": MON_MU, "mu_censored": MON_MU_CENSORED,
                                                    "power_slope": MON_POWER_SLOPE,
                                                    "n_null": n_null // 2, "n_other": n_other // 2}},
                           "null": {}, "power": {}, "equivalence_boundary": {}, "band_boundary": {}}
    for noise in ("normal", "heavy"):
        for ns in SEEDS:
            dec = base = 0
            for _ in range(n_null):
                rows = _trend_rows(rng, ns, 0.0, noise == "heavy")
                dec += _verdict(rows, grows) != "not resolved"
                base += _baseline_decides(rows)
            out["null"][f"{noise}/{ns}"] = {**_rate(dec, n_null), "baseline": _rate(base, n_null)}
    out["null_pooled"] = _rate(sum(v["count"] for v in out["null"].values()), n_null * len(out["null"]))
    for noise in ("normal", "heavy"):
        for ns in SEEDS:
            k = sum(_verdict(_trend_rows(rng, ns, 0.5, noise == "heavy"), grows) == "holds" for _ in range(n_other))
            out["power"][f"{noise}/{ns}"] = _rate(k, n_other)
    for ns in SEEDS:
        k = sum(_verdict(_dev_rows(rng, ns), "dev_mse_0") != "not resolved" for _ in range(n_other))
        out["equivalence_boundary"][str(ns)] = _rate(k, n_other)
        k = sum(_verdict(_retention_rows(rng, ns), "retention_paper_step") != "not resolved" for _ in range(n_other))
        out["band_boundary"][str(ns)] = _rate(k, n_other)
    out["bound_boundary"] = _rate(sum(_verdict(_bound_rows(rng), "b_exact_bound") != "not resolved"
                                      for _ in range(n_other)), n_other)
    out.update(_monitor(n_null, n_other, seed))
    return out


def markdown(res: dict[str, Any]) -> str:
    """The table docs/sweeps.md quotes (the test checks the page contains exactly this text)."""
    st = res["settings"]

    def pct(v: dict[str, Any]) -> str:
        return f"{100 * v['rate']:.1f}%"

    lines = [f"| seeds | no trend: decided (normal / heavy tails; {st['n_null']} pages each) | old rule ±2 SE "
             f"(normal / heavy) | power, slope 0.5 (normal / heavy; {st['n_other']} pages) | equivalence boundary "
             "| band boundary |", "|---|---|---|---|---|---|"]
    for ns in SEEDS:
        n, h = res["null"][f"normal/{ns}"], res["null"][f"heavy/{ns}"]
        lines.append(f"| {ns} | {pct(n)} / {pct(h)} | {pct(n['baseline'])} / {pct(h['baseline'])} | "
                     f"{pct(res['power'][f'normal/{ns}'])} / {pct(res['power'][f'heavy/{ns}'])} | "
                     f"{pct(res['equivalence_boundary'][str(ns)])} | {pct(res['band_boundary'][str(ns)])} |")
    pool, b = res["null_pooled"], res["bound_boundary"]
    lines.append("")
    lines.append(f"All {pool['pages']} no-trend pages together: {100 * pool['rate']:.2f}% decided (one-sided 95% "
                 f"upper bound {100 * pool['upper95']:.2f}%); bound rule with `B_exact` equal to the true rate "
                 f"(20 rows of 1000 draws): {pct(b)} of {b['pages']} pages decided.")
    return "\n".join(lines) + "\n"


def markdown_monitor(res: dict[str, Any]) -> str:
    """The "wider models certify earlier" table docs/sweeps.md quotes (checked like :func:`markdown`)."""
    st = res["settings"]

    def pct(v: dict[str, Any]) -> str:
        return f"{100 * v['rate']:.1f}%"

    ms = st["monitor"]
    lines = [f"| seeds | no trend: decided (normal / heavy; {ms['n_null']} pages each) | of which false holds "
             f"(normal / heavy) | no trend, half censored "
             f"(normal / heavy; {ms['n_other']} pages) | power, slope {ms['power_slope']:g} (normal / "
             f"heavy; {ms['n_other']} pages) |", "|---|---|---|---|---|"]
    for ns in SEEDS:
        a, b, c = (res[k] for k in ("monitor_null", "monitor_censored_null", "monitor_power"))
        lines.append(f"| {ns} | {pct(a[f'normal/{ns}'])} / {pct(a[f'heavy/{ns}'])} | "
                     f"{pct(a[f'normal/{ns}']['holds'])} / {pct(a[f'heavy/{ns}']['holds'])} | {pct(b[f'normal/{ns}'])} / "
                     f"{pct(b[f'heavy/{ns}'])} | {pct(c[f'normal/{ns}'])} / {pct(c[f'heavy/{ns}'])} |")
    pool, rf = res["monitor_null_pooled"], res["monitor_row_form"]
    cens = [v["censored"] for v in res["monitor_null"].values()]
    half = [v["censored"] for v in res["monitor_censored_null"].values()]
    lines.append("")
    holds = sum(v["holds"]["count"] for v in res["monitor_null"].values()) / pool["pages"]
    lines.append(f"All {pool['pages']} no-trend pages together: {100 * pool['rate']:.2f}% decided (one-sided 95% "
                 f"upper bound {100 * pool['upper95']:.2f}%), {100 * holds:.2f}% a false \"holds\" (the t rule's "
                 f"nominal 2.5%); censored points {100 * min(cens):.0f}–"
                 f"{100 * max(cens):.0f}% (half-censored setting {100 * min(half):.0f}–{100 * max(half):.0f}%); "
                 f"the monitor's per-step rows give the same values and verdict as the summary columns on "
                 f"{rf['agree']}/{rf['pages']} pages.")
    return "\n".join(lines) + "\n"


def main() -> int:
    res = run()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    tmp.replace(OUT)
    for name in ("null", "power"):
        for key, v in res[name].items():
            extra = f"  baseline (mean ± 2 SE) {v['baseline']['rate']:.3f}" if "baseline" in v else ""
            print(f"{name:6s} {key:10s} {v['rate']:.3f} (95% upper {v['upper95']:.3f}){extra}")
    print(f"null pooled {res['null_pooled']['rate']:.4f} (95% upper {res['null_pooled']['upper95']:.4f})")
    for name in ("equivalence_boundary", "band_boundary"):
        print(name, {k: round(v["rate"], 3) for k, v in res[name].items()})
    print("bound_boundary", round(res["bound_boundary"]["rate"], 3))
    print(f"wrote {OUT}\n")
    print(markdown(res))
    print(markdown_monitor(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
