"""Report section for interventions and growth (``kind`` ``intervention`` / ``growth``): actual vs
predicted ``|ΔL|``, retention vs step size, held-out loss before and after growing a block. Steps below
the dtype's resolution are drawn grey in the first figure and left out of the rest."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ._fmt import finite
from ._plot import figure, legend_outside, save_figure, thin, thinned_note

__all__ = ["figures", "summary"]

_XLABEL = {"rel_step": "step relative to the activation (RMS)", "eta": "η"}


def _steps(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [
        r
        for r in rows
        if r.get("kind") == "intervention"
        and r.get("probe") in ("bias", "block")
        and all(finite(r.get(k)) for k in ("predicted", "actual", "eta"))
    ]


def _resolved(steps: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    # a step the model's dtype cannot resolve measured rounding, not the loss change
    return [r for r in steps if not r.get("below_resolution") and not r.get("alignment_within_rounding")]


def _precision_words(steps: Sequence[Mapping[str, Any]]) -> str | None:
    """One sentence on the steps left out (below resolution) or re-measured in float32."""
    low = [r for r in steps if r.get("below_resolution")]
    redo = [r for r in steps if r.get("evaluated_in") and r.get("dtype") and r["evaluated_in"] != r["dtype"]]
    zero = [r for r in steps if r.get("alignment_within_rounding") and not r.get("below_resolution")]
    if not low and not redo and not zero:
        return None
    dts = sorted({str(r.get("dtype")) for r in low + redo + zero})
    out = []
    if low:
        rel: list[float] = [r["rel_step"] for r in low if finite(r.get("rel_step"))]
        span = f" (rel_step {min(rel):.2g}–{max(rel):.2g})" if rel else ""
        out.append(
            f"{len(low)} of {len(steps)} steps{span} had a predicted change below the resolution of the model's "
            f"dtype ({', '.join(dts)}: within a few rounding errors of its held-out loss) and are left out of "
            "the retention and sign figures and sentences"
        )
    if redo:
        out.append(f"{len(redo)} steps below {', '.join(dts)} resolution were measured in float32 (model upcast)")
    if zero:
        out.append(
            f"{len(zero)} more steps are left out because their alignment μ_Mᵀg_K is within rounding of zero "
            "of the samples (not even the predicted sign is resolved)"
        )
    return "Precision: " + "; ".join(out) + "."


def _label(r: Mapping[str, Any]) -> str:
    """One curve per model (family/width/seed) and point: mixing them makes zig-zag lines."""
    tags = [
        f"{r.get('family') or r.get('model') or ''}",
        f"N={r['width']}" if r.get("width") is not None else "",
        f"s{r['seed']}" if r.get("seed") is not None else "",
    ]
    tag = " ".join(t for t in tags if t)
    return f"{r.get('point')} ({r.get('probe')})" + (f" {tag}" if tag else "")


def _curves(steps: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for r in steps:
        out.setdefault(_label(r), []).append(r)
    return out


def _retention_by_width(groups: dict[str, list[Mapping[str, Any]]], xkey: str, out: Path) -> dict[str, str]:
    """One panel per width: every curve thin, the median and quartile band bold."""
    by_width: dict[Any, list[list[Mapping[str, Any]]]] = {}
    for rs in groups.values():
        by_width.setdefault(rs[0].get("width"), []).append(sorted(rs, key=lambda r: r[xkey]))
    every = sorted(by_width, key=lambda w: (w is None, w if w is not None else 0))
    widths = thin(every, 8)
    cols = min(4, len(widths))
    nrows = (len(widths) + cols - 1) // cols
    fig, axes = figure(nrows, cols, w=3.2, h=2.8, sharey=True)
    for ax, w in zip(axes.flat, widths):
        curves = [c for c in by_width[w] if all(finite(r.get("retention")) for r in c)]
        for c in curves:
            ax.semilogx([r[xkey] for r in c], [r["retention"] for r in c], "-", color="0.6", lw=0.6, alpha=0.6)
        n = min((len(c) for c in curves), default=0)
        if n:
            x = np.median([[c[i][xkey] for i in range(n)] for c in curves], axis=0)
            y = np.array([[c[i]["retention"] for i in range(n)] for c in curves])
            ax.fill_between(x, np.percentile(y, 25, axis=0), np.percentile(y, 75, axis=0), color="C0", alpha=0.3)
            ax.semilogx(x, np.median(y, axis=0), "o-", color="C0", ms=3, lw=1.6)
        ax.axhline(1.0, color="k", ls="--", lw=0.8)
        ax.set_ylim(-0.5, 2.0)
        ax.set_title(f"width {w} ({len(curves)} curves)", fontsize=9)
    for ax in list(axes.flat)[len(widths) :]:
        ax.axis("off")
    fig.supxlabel(_XLABEL[xkey], fontsize=9)
    fig.supylabel("retention (clipped)", fontsize=9)
    return save_figure(
        fig,
        out / "interventions_retention_by_width.png",
        "Retention vs step size, per width",
        "One panel per width: each grey line is one model and point; blue: the median and "
        "interquartile band over them." + thinned_note(len(widths), len(every), "widths"),
    )


def figures(rows: Sequence[Mapping[str, Any]], out_dir: str | Path) -> list[dict[str, str]]:
    """Write the section's PNGs into ``out_dir``; return ``[{"title", "png", "caption"}]``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs: list[dict[str, str]] = []
    every = _steps(rows)
    steps = _resolved(every)
    kept = {id(r) for r in steps}
    below = [r for r in every if id(r) not in kept and r["predicted"] != 0 and r["actual"] != 0]
    if steps:
        groups = _curves(steps)
        figs.append(_actual_vs_predicted(groups, steps, every, below, out))
        # x: the step relative to the stream (comparable across points and widths) when recorded.
        xkey = "rel_step" if all(finite(r.get("rel_step")) for r in steps) else "eta"
        if len(groups) > 12:
            figs.append(_retention_by_width(groups, xkey, out))
        figs.append(_retention(groups, xkey, steps, every, out))
    grown = [r for r in rows if r.get("kind") == "growth" and r.get("role") != "candidate"]
    grown = [r for r in grown if finite(r.get("loss_before")) and finite(r.get("loss_after"))]
    if grown:
        figs.append(_growth_before_after(grown, out))
    return figs


def _actual_vs_predicted(groups, steps, every, below, out: Path) -> dict[str, str]:
    """|actual| against |predicted| ΔL per point (log-log), wrong signs crossed, unresolved steps grey."""
    fig, ((ax,),) = figure(w=5.5, h=4.5)
    lo, hi = math.inf, 0.0
    n_bad = 0
    drawn = set(thin(list(groups)))
    for lab, rs in groups.items():
        rs = [r for r in rs if r["predicted"] != 0 and r["actual"] != 0]
        xs, ys = [abs(r["predicted"]) for r in rs], [abs(r["actual"]) for r in rs]
        if not xs:
            continue
        if lab in drawn:
            ax.loglog(xs, ys, "o-", ms=3, lw=1, label=lab, alpha=0.7)
        bad = [(abs(r["predicted"]), abs(r["actual"])) for r in rs if not r.get("sign_agrees")]
        n_bad += len(bad)
        if bad:
            ax.loglog(*zip(*bad), "x", color="red", ms=9, mew=2)
        lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
    if below:
        xs, ys = [abs(r["predicted"]) for r in below], [abs(r["actual"]) for r in below]
        ax.loglog(xs, ys, "o", mfc="none", color="0.6", ms=4, label="below the dtype's resolution (left out)")
        lo = min(lo, *xs, *ys)
    if hi > 0 and math.isfinite(lo):
        ax.loglog([lo, hi], [lo, hi], "k--", lw=1, label="actual = predicted")
    ax.set(xlabel="|predicted ΔL| = η |μ_Mᵀ g_K|", ylabel="|actual ΔL|")
    ax.set_title("Interventions: actual vs first-order prediction")
    legend_outside(ax)
    return save_figure(
        fig,
        out / "interventions_actual_vs_predicted.png",
        "Actual vs predicted held-out loss change",
        (
            f"{len(steps)} steps at {len(groups)} point(s). On the dashed line "
            "the first-order prediction is exact; red crosses: the sign was wrong "
            f"({n_bad} of {len(steps)})."
            + (
                f" Grey circles: {len(every) - len(steps)} steps the model's dtype "
                "does not resolve, left out of the counts."
                if len(every) > len(steps)
                else ""
            )
            + thinned_note(len(drawn), len(groups))
            + (" Red crosses are drawn for every curve." if len(drawn) < len(groups) else "")
        ),
    )


def _retention(groups, xkey: str, steps, every, out: Path) -> dict[str, str]:
    """Retention (actual / predicted ΔL) against the step size, per point."""
    fig, ((ax,),) = figure(w=5.5, h=4.0)
    drawn = thin(list(groups))
    for lab in drawn:
        rs = sorted((r for r in groups[lab] if finite(r.get("retention"))), key=lambda r: r[xkey])
        if rs:
            ax.semilogx([r[xkey] for r in rs], [r["retention"] for r in rs], "o-", ms=3, lw=1, alpha=0.7, label=lab)
    ax.axhline(1.0, color="k", ls="--", lw=1)
    ax.set_ylim(-0.5, 2.0)  # the interesting region is near 1; large steps leave it quickly
    ax.set(xlabel=_XLABEL[xkey], ylabel="retention = actual ΔL / predicted ΔL (clipped)")
    ax.set_title("Retention of the first-order gain")
    legend_outside(ax)
    small = [min(rs, key=lambda r: r["eta"]) for rs in groups.values()]
    rets = [r["retention"] for r in small if finite(r.get("retention"))]
    cap = "Retention → 1 as η → 0 when the loss is smooth at the insertion point."
    if rets:
        cap += f" At the smallest η: {min(rets):.3f}–{max(rets):.3f}."
    if len(every) > len(steps):
        cap += (
            f" {len(every) - len(steps)} steps the model's dtype does not resolve are not drawn "
            "(the smallest η above is the smallest resolved one)."
        )
    note = thinned_note(len(drawn), len(groups))
    if note:
        cap += note + " Every curve is in the per-width panels."
    return save_figure(fig, out / "interventions_retention.png", "Retention vs step size", cap)


def _growth_before_after(grown, out: Path) -> dict[str, str]:
    """Held-out loss before and after growing a block, per grown row."""
    fig, ((ax,),) = figure(w=max(4.0, 1.2 * len(grown) + 2), h=4.0)
    pos = range(len(grown))
    w = 0.38
    ax.bar([x - w / 2 for x in pos], [r["loss_before"] for r in grown], w, label="before")
    ax.bar([x + w / 2 for x in pos], [r["loss_after"] for r in grown], w, label="after")
    ax.set_xticks(list(pos))
    ax.set_xticklabels([f"{r.get('role')}\n{r.get('point')}" for r in grown], fontsize=7)
    ax.set(ylabel="held-out loss", title="Growing a block")
    legend_outside(ax)
    best = next((r for r in grown if r.get("role") == "best"), grown[0])
    return save_figure(
        fig,
        out / "growth_before_after.png",
        "Held-out loss before and after growth",
        f"Block trained {best.get('steps')} steps at each point; the certificate's top-ranked point "
        f"({best.get('point')}) went {best['loss_before']:.4g} → {best['loss_after']:.4g}.",
    )


def summary(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Verdict sentences: sign agreement and retention at the smallest η; growth outcome."""
    out = []
    every = _steps(rows)
    steps = _resolved(every)
    words = _precision_words(every)
    if words:
        out.append(words)
    if steps:
        agree = sum(1 for r in steps if r.get("sign_agrees"))
        out.append(
            f"Interventions, per step of the η grid: the sign of the measured held-out ΔL matched the "
            f"first-order prediction −η μ_Mᵀg_K in {agree} of {len(steps)} steps (all step sizes; large "
            "steps leave the first-order regime)."
        )
        smallest = [min(rs, key=lambda r: r["eta"]) for rs in _curves(steps).values()]
        ok = sum(1 for r in smallest if r.get("sign_agrees"))
        out.append(
            f"Interventions, at the smallest step of each curve: sign right in {ok} of {len(smallest)} "
            "curves (one curve = one model and point"
            + ("; the smallest step the model's dtype resolves" if len(every) > len(steps) else "")
            + ")."
        )
    for r in rows:
        if r.get("probe") == "sign_agreement" and r.get("draws_below_resolution"):
            out.append(
                f"Sign agreement at {r.get('point')}: {r['draws_below_resolution']} of {r.get('draws')} draws "
                f"had a predicted change below {r.get('dtype')} resolution and are left out of the rates."
            )
    signs = [r for r in rows if r.get("probe") == "sign_agreement" and finite(r.get("agree_rate"))]
    for r in signs:
        n = (r.get("draws") or 0) - (r.get("draws_below_resolution") or 0)
        out.append(
            f"Sign agreement over resampled (M, K) subsets at {r.get('point')} (M={r.get('M')}, "
            f"K={r.get('K')}): the fraction of {n} draws whose measured ΔL had the predicted "
            f"sign was {r['agree_rate']:.3f}; empirical misalignment "
            f"{r.get('misaligned_rate', float('nan')):.3f} vs B_exact {r.get('b_exact', float('nan')):.3f}."
        )
    grown = [r for r in rows if r.get("kind") == "growth" and r.get("role") in ("best", "worst", "random")]
    grown = [r for r in grown if finite(r.get("loss_after"))]
    best = [r for r in grown if r["role"] == "best"]
    if best and len(grown) > 1:
        b = best[0]
        others = [r for r in grown if r is not b]
        won = all(b["loss_after"] <= r["loss_after"] for r in others)
        alts = ", ".join("{} {}: {:.4g}".format(r["role"], r["point"], r["loss_after"]) for r in others)
        verdict = "beat" if won else "did not beat"
        out.append(
            f"Growth: the top-ranked point {b['point']} {verdict} the alternatives ({alts}) "
            f"with held-out loss {b['loss_after']:.4g}."
        )
    return out
