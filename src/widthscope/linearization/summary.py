"""The summary of a linearization width sweep: log-log slopes over width next to the theory's reference
slopes (:func:`reference_slope`) and the published ones (:data:`PUBLISHED`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from .._io import format_table
from ..linear.powerlaw import fit_slope

__all__ = ["PUBLISHED", "reference_slope", "summarize", "cfg_from_rows", "print_slopes"]


# Published slopes of the test MSE between F and F_lin (MNIST, 2-hidden-layer MLP, 100 seeds).
PUBLISHED: dict[float, float] = {0.0: -1.14, -0.25: -1.14, -0.5: -1.30, -0.75: -1.73, -1.0: -2.72}


def reference_slope(metric: str, alpha: float | None = None) -> tuple[float, str]:
    """The theory's slope of ``log metric`` vs ``log n`` at ``η = η₀ n^α``, and what it is."""
    a = 0.0 if alpha is None else float(alpha)
    if metric in ("dev_rms", "dev_rel"):
        return a - 1, "bound O(n^alpha/n) on F - F_lin" + (", relative to RMS F" if metric == "dev_rel" else "")
    if metric == "dev_mse":
        return 2 * (a - 1), "square of the deviation bound"
    if metric == "kernel_drift":
        return a - 0.5, "heuristic: eta * steps / sqrt(n)"
    if metric == "test_gap":
        return a - 1, "loss gap follows the deviation"
    if metric.startswith("C"):
        return -0.5, "C_{D,d} = O(1/sqrt(n)) (mean |C| or ||C||)"
    raise KeyError(f"no reference slope for metric {metric!r}")


def _matrix(rows, widths, seeds, key: str, at: Any, value: str) -> np.ndarray:
    """``(seeds, widths)`` of ``value`` over the rows with ``r[key] == at`` (NaN where none is finite)."""
    M = np.full((len(seeds), len(widths)), np.nan)
    wi = {w: j for j, w in enumerate(widths)}
    si = {s: i for i, s in enumerate(seeds)}
    for r in rows:
        if r[key] == at and r.get("width") in wi and r.get("seed") in si:
            v = r.get(value)
            if isinstance(v, (int, float)) and math.isfinite(v):
                M[si[r["seed"]], wi[r["width"]]] = v
    return M


def summarize(rows: list[dict[str, Any]], cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Slope rows: metric, α, step, slope with 95% interval, reference and published slopes."""
    widths, seeds = cfg["widths"], cfg["seeds"]
    out = []

    def add(metric, alpha, step, M, reference, ref_note, published=None):
        ok = np.isfinite(M).any(0)
        if ok.sum() < 2:
            return
        w = np.asarray(widths, float)[ok]
        fit = fit_slope(w, M[:, ok])
        head = {"kind": "slope", "metric": metric, "alpha": alpha, "step": step}
        fitted = {"slope": fit.slope, "ci_low": fit.ci_low, "ci_high": fit.ci_high, "intercept": fit.intercept}
        refs = {"reference": reference, "reference_note": ref_note, "published": published}
        counts = {"n_widths": int(ok.sum()), "n_seeds": len(seeds), "missing": int((~np.isfinite(M)).sum())}
        out.append(head | fitted | refs | counts)

    last = cfg["train"]["log_steps"][-1]
    for a in [float(x) for x in cfg["train"]["alphas"]]:
        lin = [r for r in rows if r.get("kind") == "linearization" and r.get("alpha") == a and not r.get("diverged")]
        for step in cfg["fit"]["steps"]:
            for metric in ("dev_rms", "dev_rel", "dev_mse"):
                published = PUBLISHED.get(a) if metric == "dev_mse" and step == last else None
                M = _matrix(lin, widths, seeds, "step", step, metric)
                add(metric, a, step, M, *reference_slope(metric, a), published)
        for metric in ("kernel_drift", "test_gap"):
            add(metric, a, last, _matrix(lin, widths, seeds, "step", last, metric), *reference_slope(metric, a))
    corr = [r for r in rows if r.get("kind") == "correlation"]
    for name in sorted({r["name"] for r in corr}):
        add(name, None, None, _matrix(corr, widths, seeds, "name", name, "mean"), *reference_slope(name))
    return out


def cfg_from_rows(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The parts of a config :func:`summarize` needs, recovered from result rows."""
    lin = [r for r in rows if r.get("kind") in ("linearization", "correlation") and "width" in r]
    if not lin:
        return None
    steps = sorted({r["step"] for r in lin if r.get("kind") == "linearization" and not r.get("diverged")})
    alphas = sorted({r["alpha"] for r in lin if r.get("alpha") is not None}, reverse=True)
    fit = [s for s in steps if s > 0][:1] + steps[-1:] if steps else []
    return {
        "widths": sorted({r["width"] for r in lin}),
        "seeds": sorted({r["seed"] for r in lin}),
        "train": {"alphas": alphas, "log_steps": steps or [0]},
        "fit": {"steps": sorted(set(fit))},
    }


def print_slopes(slopes, file=None) -> None:
    table = [
        {k: s[k] for k in ("metric", "alpha", "step", "slope")}
        | {"95% CI": f"[{s['ci_low']:.3g}, {s['ci_high']:.3g}]", "reference": s["reference"]}
        | {"published": s["published"], "widths": s["n_widths"]}
        for s in slopes
    ]
    title = "log-log slopes over width (seeds averaged in log space; 95% t interval over the seeds' slopes)"
    print(format_table(table, floatfmt=".3g", title=title), file=file)
