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
    from widthscope.linear.sweep import PUBLISHED
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
                                        "n_null": n_null, "n_other": n_other},
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
