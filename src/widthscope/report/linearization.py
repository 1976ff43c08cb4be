"""Report section for linearization sweeps (``kind`` ``linearization`` / ``correlation``): deviation
``F − F_lin`` vs width and vs step, network / linear model / kernel prediction side by side,
derivative correlations vs width and fitted slope vs ``α``, with slopes refitted from the rows."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ._fmt import MISSING, finite, interval, num, p_eq
from ._plot import colors, figure, legend_outside, save_figure, thin, thinned_note, yerr
from .html import table

__all__ = ["figures", "tables", "summary", "slopes_from_rows", "side_by_side", "slope_text"]

_LOSSES = ("test_loss", "test_loss_lin", "test_loss_kernel", "test_loss_kernel_inf")
_SIDE = tuple(zip(_LOSSES, ("o-", "s--", "x:"), ("network", "linear model", "kernel GD (Θ₀)")))


def slopes_from_rows(rows: Sequence[dict]) -> list[dict[str, Any]]:
    """Slope rows (as in ``slopes.json``) refitted from result rows alone."""
    from ..linearization.summary import cfg_from_rows, summarize  # noqa: PLC0415  start-up time: torch

    cfg = cfg_from_rows(list(rows))
    return [] if cfg is None else summarize(list(rows), cfg)


def slope_text(s: dict[str, Any]) -> str:
    """'-0.512 [-0.6, -0.43]': a slope row's value and 95% interval, as the legends and summary quote it."""
    return f"{num(s.get('slope'))} {interval(s.get('ci_low'), s.get('ci_high'))}"


def _gmean_by_width(rows, metric, widths) -> np.ndarray:
    """Rows (geometric mean over seeds, min, max) by width (NaN where missing)."""
    out = np.full((3, len(widths)), np.nan)
    for i, w in enumerate(widths):
        v = np.array([r[metric] for r in rows if r.get("width") == w and finite(r.get(metric)) and r[metric] > 0])
        if v.size:
            out[:, i] = math.exp(np.log(v).mean()), v.min(), v.max()
    return out


def _vs_width(ax, rows, metric, widths, color, label, s, ref, fmt):
    """Geometric mean over seeds (bars: min–max) against width, the slope row ``s`` quoted in the label,
    and the reference slope ``ref`` dashed from the narrowest width."""
    m, lo, hi = _gmean_by_width(rows, metric, widths)
    ok = np.isfinite(m)
    if not ok.any():
        return None
    w, m, lo, hi = np.asarray(widths, float)[ok], m[ok], lo[ok], hi[ok]
    lab = label + (f": slope {slope_text(s)}" if s else "")
    ax.errorbar(w, m, yerr(m, lo, hi), fmt=fmt, color=color, ms=4, capsize=2, label=lab)
    ax.plot(w, m[0] * (w / w[0]) ** ref, "--", lw=1, color=color, alpha=0.6)
    return w


def figures(rows: list[dict], out_dir: Path) -> list[dict]:
    """PNG figures for linearization rows; see the module docstring."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lin = [r for r in rows if r.get("kind") == "linearization" and not r.get("diverged")]
    corr = [r for r in rows if r.get("kind") == "correlation"]
    figs: list[dict] = []
    slopes = slopes_from_rows(rows)
    if lin:
        widths = sorted({r["width"] for r in lin})
        alphas = sorted({r["alpha"] for r in lin}, reverse=True)
        steps = sorted({r["step"] for r in lin if r["step"] > 0})
        last = steps[-1] if steps else 0
        figs.append(_fig_deviation_vs_width(lin, slopes, widths, alphas, last, out_dir))
        figs.append(_fig_deviation_vs_step(lin, widths, alphas[0], steps, out_dir))
        figs += _fig_side_by_side(lin, widths, alphas[0], out_dir)
        figs += _fig_slope_vs_alpha(slopes, last, out_dir)
    if corr:
        figs.append(_fig_correlations_vs_width(corr, slopes, out_dir))
    return figs


def _fig_deviation_vs_width(lin, slopes, widths, alphas, last, out_dir: Path) -> dict:
    """1. Deviation vs width at the last logged step, one series per ``α``."""
    from ..linearization.summary import reference_slope  # noqa: PLC0415  start-up time: torch (one slope table)

    fig, ((ax,),) = figure(w=6.4, h=4.4)
    for a, c in zip(alphas, colors(len(alphas))):
        sel = [r for r in lin if r["alpha"] == a and r["step"] == last]
        s = next((x for x in slopes if x["metric"] == "dev_rms" and x["alpha"] == a and x["step"] == last), None)
        w = _vs_width(ax, sel, "dev_rms", widths, c, f"α={a:g}", s, reference_slope("dev_rms", a)[0], "o")
        if s and w is not None:
            ax.plot(w, np.exp(s["intercept"]) * w ** s["slope"], "-", color=c, lw=1.2)
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel="width n", ylabel=f"RMS(F − F_lin) on held-out inputs, step {last}")
    legend_outside(ax)
    return save_figure(
        fig,
        out_dir / "linearization_deviation_vs_width.png",
        "Deviation from the linear model vs width",
        "Geometric mean over seeds (bars: min–max) of the held-out RMS of "
        "F − F_lin at the last logged step; solid: least-squares fit in log-log; "
        "dashed: reference slope α − 1 (bound O(n^α/n)) anchored at the narrowest width. "
        "Slopes and intervals in the legend are the slope table's.",
    )


def _fig_deviation_vs_step(lin, widths, a0, steps, out_dir: Path) -> dict:
    """2. Deviation vs training step, one line per width, at ``α = a0`` (the largest)."""
    fig, ((ax,),) = figure(w=6.4, h=4.4)
    drawn = thin(widths)
    for w, c in zip(drawn, colors(len(drawn), "plasma", 0.85)):
        sel = [r for r in lin if r["alpha"] == a0 and r["width"] == w]
        gm = [(st, _gmean_by_width([r for r in sel if r["step"] == st], "dev_rms", [w])[0, 0]) for st in steps]
        if pts := [(st, m) for st, m in gm if np.isfinite(m)]:
            ax.plot(*zip(*pts), "o-", color=c, ms=3, label=f"n={w}")
    ax.set(yscale="log", xlabel="training step", ylabel="RMS(F − F_lin)", title=f"α = {a0:g}")
    legend_outside(ax)
    return save_figure(
        fig,
        out_dir / "linearization_deviation_vs_step.png",
        "Deviation vs training step, per width",
        "How F − F_lin accumulates over training (geometric mean over seeds)."
        + thinned_note(len(drawn), len(widths), "widths"),
    )


def _fig_side_by_side(lin, widths, a0, out_dir: Path) -> list[dict]:
    """3. Network vs linear model vs kernel prediction (held-out loss over training) at ``α = a0``."""
    side = [r for r in _with_kernel(lin) if r["alpha"] == a0]
    if not side:
        return []
    shown = widths if len(widths) <= 3 else [widths[0], widths[len(widths) // 2], widths[-1]]
    fig, axes = figure(1, len(shown), w=3.4, h=3.6, sharey=True)
    all_steps = sorted({r["step"] for r in side})
    for ax, w in zip(axes[0], shown):
        for key, style, lab in _SIDE:
            ax.plot(all_steps, [_mean(side, w, st, key) for st in all_steps], style, ms=4, lw=1.2, label=lab)
        inf = _mean(side, w, all_steps[-1], "test_loss_kernel_inf")
        if math.isfinite(inf):
            ax.axhline(inf, color="grey", lw=1, ls="-.", label="kernel regression (t = ∞)")
        ax.set_title(f"n = {w}, α = {a0:g}", fontsize=9)
        ax.set_xlabel("training step")
    axes[0][0].set_ylabel("held-out loss (mean over seeds)")
    legend_outside(axes[0][-1])
    return [
        save_figure(
            fig,
            out_dir / "linearization_side_by_side.png",
            "Network, linear model and kernel prediction side by side",
            "Held-out MSE of the trained network, its linearized model, and the closed-form "
            "gradient-descent prediction with the frozen kernel Θ₀ at the same step (equal to the "
            "linear model for full-batch GD), with the kernel-regression limit t = ∞ (dash-dot).",
        )
    ]


def _fig_slope_vs_alpha(slopes, last, out_dir: Path) -> list[dict]:
    """4. Fitted slope vs ``α`` beside the bound and the published slopes; ``[]`` without slopes."""
    from ..linearization.summary import PUBLISHED, reference_slope  # noqa: PLC0415  start-up time: torch

    sl = [x for x in slopes if x["metric"] in ("dev_rms", "dev_mse") and x["step"] == last]
    if not sl:
        return []
    fig, ((ax,),) = figure(w=6.4, h=4.4)
    for metric, mk, col, what in (("dev_rms", "o", "C0", "RMS"), ("dev_mse", "s", "C1", "MSE")):
        pts = sorted((x for x in sl if x["metric"] == metric), key=lambda x: x["alpha"])
        al, sv, lo, hi = ([x[k] for x in pts] for k in ("alpha", "slope", "ci_low", "ci_high"))
        if pts:
            ax.errorbar(al, sv, yerr(sv, lo, hi), fmt=mk, color=col, capsize=3, label=f"measured ({what} of F − F_lin)")
    ag = np.linspace(-1, 0, 11)
    ax.plot(ag, [reference_slope("dev_rms", a)[0] for a in ag], "--", color="C0", lw=1, label="bound α − 1 (deviation)")
    ax.plot(ag, [reference_slope("dev_mse", a)[0] for a in ag], ":", color="C1", lw=1, label="2(α − 1) (its square)")
    ax.plot(list(PUBLISHED), list(PUBLISHED.values()), "x", color="k", label="published (test MSE)")
    ax.set(xlabel="α  (η = η₀ n^α)", ylabel="log-log slope over width")
    legend_outside(ax)
    return [
        save_figure(
            fig,
            out_dir / "linearization_slope_vs_alpha.png",
            "Fitted slope vs learning-rate exponent α",
            "Slopes with 95% t intervals over seeds, beside the bound and the "
            "published MNIST slopes (which are for the test MSE between F and F_lin).",
        )
    ]


def _fig_correlations_vs_width(corr, slopes, out_dir: Path) -> dict:
    """5. Derivative correlations ``C_{D,d}`` vs width, one series per name."""
    from ..linearization.summary import reference_slope  # noqa: PLC0415  start-up time: torch

    widths = sorted({r["width"] for r in corr})
    names = sorted({r["name"] for r in corr})
    fig, ((ax,),) = figure(w=6.4, h=4.4)
    for i, name in enumerate(names):
        s = next((x for x in slopes if x["metric"] == name), None)
        sel = [r for r in corr if r["name"] == name]
        _vs_width(ax, sel, "mean", widths, f"C{i % 10}", name, s, reference_slope(name)[0], "o-")
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel="width n", ylabel="mean |C_{D,d}| (‖·‖ for D = 1)")
    legend_outside(ax)
    return save_figure(
        fig,
        out_dir / "linearization_correlations_vs_width.png",
        "Derivative correlations vs width",
        "Exact C_{D,d} (nested jvp) averaged over random input tuples; geometric mean "
        "over seeds (bars: min–max); dashed: reference slope −1/2.",
    )


def _mean(rows, width, step, key) -> float:
    v = [r[key] for r in rows if r["width"] == width and r["step"] == step and finite(r.get(key))]
    return float(np.mean(v)) if v else float("nan")


def _with_kernel(rows: Sequence[dict]) -> list[dict]:
    """Linearization rows (not diverged) that carry the kernel prediction."""
    lin = [r for r in rows if r.get("kind") == "linearization" and not r.get("diverged")]
    return [r for r in lin if isinstance(r.get("test_loss_kernel"), (int, float))]


def side_by_side(rows: list[dict]) -> list[dict[str, Any]]:
    """Per ``(α, width)`` at the last logged step: held-out loss of the network, the linear model,
    the kernel GD prediction and the kernel-regression limit (means over seeds)."""
    lin = _with_kernel(rows)
    last = max((r["step"] for r in lin), default=None)
    out = []
    for a in sorted({r["alpha"] for r in lin}, reverse=True):
        sel = [r for r in lin if r["alpha"] == a]
        for w in sorted({r["width"] for r in sel}):
            seeds = len({r["seed"] for r in sel if r["width"] == w and r["step"] == last})
            row = {"alpha": a, "width": w, "step": last, "seeds": seeds}
            out.append({**row, **{k: _mean(sel, w, last, k) for k in _LOSSES}})
    return out


def tables(rows: list[dict]) -> list[dict]:
    """The slope table and the side-by-side loss table as HTML."""
    out = []
    slopes = slopes_from_rows(rows)
    if slopes:

        def f(v: Any) -> str:
            return num(v) if isinstance(v, float) else MISSING if v is None else str(v)

        head = ("metric", "alpha", "step", "slope", "95% CI", "reference", "published", "widths")
        lines = [
            (s["metric"], f(s["alpha"]), f(s["step"]), num(s["slope"]), interval(s["ci_low"], s["ci_high"]))
            + (f(s["reference"]), f(s["published"]), f(s["n_widths"]))
            for s in slopes
        ]
        out.append({"title": "Log-log slopes over width", "html": table(head, lines)})
    side = side_by_side(rows)
    if side:
        head = ("alpha", "width", "step", "seeds", "network", "linear model", "kernel GD", "kernel t = ∞")
        lines = [
            (f"{r['alpha']:g}", r["width"], r["step"], r["seeds"], *(f"{r[k]:.4g}" for k in _LOSSES)) for r in side
        ]
        out.append({"title": "Held-out loss: network, linear model, kernel prediction", "html": table(head, lines)})
    return out


def summary(rows: list[dict], found: Sequence[dict] | None = None) -> list[str]:
    """One sentence per deviation slope against the bound ``α − 1``: the claims page's verdict at the
    last step, the same t test uncorrected at other steps."""
    from .claims import claims, deviation_seed_slopes, seed_test, verdict  # noqa: PLC0415  start-up time: scipy

    if found is None:
        found = claims(rows)
    page = {c["id"]: c for c in found}
    words = {
        "holds": "steeper than the bound (faster approach to the linear model)",
        "does not": "flatter than the bound",
        "not resolved": "not resolved against the bound",
    }
    out = []
    for s in slopes_from_rows(rows):
        if s["metric"] != "dev_rms" or s["alpha"] is None:
            continue
        ref, alpha, step = s["reference"], float(s["alpha"]), int(s["step"])
        c = page.get(f"dev_rms_{alpha:g}")
        if c is not None and f"step {step})" in c["claim"]:
            how = "claims page, Holm-corrected"
        else:
            c = seed_test(deviation_seed_slopes(rows, "dev_rms", alpha, step), (-math.inf, ref))
            c["verdict"] = verdict(c, c["p"])
            how = "same test, not corrected across claims"
        if c.get("low") is None:
            tested = "no per-seed interval (one seed): not resolved"
        else:
            tested = f"per-seed t interval [{c['low']:.2f}, {c['high']:.2f}], p {p_eq(c['p'])} ({how}): "
            tested += words[c["verdict"]]
        out.append(
            f"α={alpha:g}, step {step}: deviation slope {num(s['slope'])} (t interval over seeds "
            f"{interval(s['ci_low'], s['ci_high'])}) vs reference {ref:.2f}; {tested}."
        )
    return out
