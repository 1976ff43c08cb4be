"""The figures of the alignment section (:mod:`widthscope.report.alignment`): d_align vs width,
misalignment vs width with B_exact and B_align, misalignment vs ``M = K``; and the plotting
helpers the monitor section shares (:func:`save_figure`, :func:`slugify`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from ._groups import group_label, groups
from .alignment_rows import aggregate, as_number, mk_pairs, pick_spread, point_keys, width_values
from .html import fit_titles

MAX_POINTS_PANELS = 4
MAX_MK_PANELS = 4
MAX_LEGEND = 8
VACUOUS = 1 - 1e-12  # a bound at least this large says nothing


# ----------------------------------------------------------------------------- plotting helpers
def _fig(nrows: int, ncols: int, w: float = 4.2, h: float = 3.2):
    from matplotlib.figure import Figure  # Agg canvas, no pyplot global state

    fig = Figure(figsize=(w * ncols, h * nrows), dpi=90, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def save_figure(fig, path: Path, title: str) -> None:
    """Save with the group's label as the figure title (so a PNG alone says which regime it
    shows), every title wrapped to fit (panel titles would clip into each other otherwise)."""
    fig.suptitle(title, fontsize=11)
    fit_titles(fig)
    fig.savefig(path)


def _colors(n: int):
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(0.9 * i / max(1, n - 1)) for i in range(n)]


def _width_axis(ax, widths: Sequence[float]) -> None:
    """Log x axis labelled exactly at the swept widths (matplotlib's minor labels collide)."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(list(widths)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{w:g}" for w in widths], fontsize=7)


def slugify(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")[:60] or "x"


# ----------------------------------------------------------------------------- section API
def figures(rows: list[dict], out_dir: Path) -> list[dict]:
    """PNG figures for alignment rows; see the module docstring."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = []
    gs = groups(rows)
    for key, sel in gs.items():
        label = group_label(key, list(gs))
        slug = slugify(label)
        pts = point_keys(sel)
        widths = width_values(sel)
        figs.append(_fig_d_align(sel, label, out_dir / f"{slug}-d_align.png", pts, widths))
        ppts = pick_spread(pts, MAX_POINTS_PANELS)
        draws = int(
            max((d for d in (as_number(r.get("misalignment_draws")) for r in sel) if not math.isnan(d)), default=1)
        )
        floor = 0.5 / max(draws, 1)  # where a probability of 0 is drawn on the log axes
        by = ("point_index", "M", "K", "width")
        agg_e, agg_be = aggregate(sel, "misalignment", by=by), aggregate(sel, "two_b_exact", by=by)
        figs.append(
            _fig_misalignment_vs_width(
                sel,
                label,
                out_dir / f"{slug}-misalignment-vs-width.png",
                pts,
                ppts,
                widths,
                draws,
                floor,
                agg_e,
                agg_be,
            )
        )
        figs += _fig_misalignment_vs_mk(
            sel, label, out_dir / f"{slug}-misalignment-vs-MK.png", ppts, widths, floor, agg_e, agg_be
        )
    return figs


def _fig_d_align(sel, label: str, p: Path, pts, widths) -> dict:
    """1. d_align vs width, one line per point, both population forms."""
    colors = _colors(len(pts))
    n_seeds = len({r.get("seed") for r in sel})
    fig, axes = _fig(1, 2)
    for ax, form, name in (
        (axes[0, 0], "two", "two-population (train vs held-out)"),
        (axes[0, 1], "one", "one-population (train)"),
    ):
        agg = aggregate(sel, f"{form}_d_align", by=("point_index", "width"))
        for (pi, pname), c in zip(pts, colors):
            ws = [w for w in widths if (pi, w) in agg and not math.isnan(agg[(pi, w)][0])]
            if not ws:
                continue
            mean = [agg[(pi, w)][0] for w in ws]
            ax.plot(ws, mean, "o-", color=c, label=pname, ms=4)
            if n_seeds > 1:
                ax.fill_between(
                    ws, [agg[(pi, w)][1] for w in ws], [agg[(pi, w)][2] for w in ws], color=c, alpha=0.18, lw=0
                )
        _width_axis(ax, widths)
        ax.set_xlim(min(widths) / 1.2, max(widths) * 1.2)  # every swept width, drawn or vacuous
        ys = [y for line in ax.lines for y in line.get_ydata() if np.isfinite(y) and y > 0]
        if ys and max(ys) / min(ys) > 10:  # values spanning decades: a linear axis flattens the small ones
            ax.set_yscale("log")
        elif ys and max(ys) - min(ys) <= 1e-9 * max(ys):  # one value: one plain tick, not six decimals
            ax.set_yticks([ys[0]])
            ax.set_yticklabels([f"{ys[0]:.3g}"])
        if not ax.lines:  # say why the panel is empty rather than show bare axes
            ax.text(
                0.5,
                0.5,
                "no d_align to draw: every certificate\nis vacuous (an estimate <= 0)",
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize=9,
                color="#555",
            )
        ax.set_xlabel("width N")
        ax.set_ylabel("d_align")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    handles, names = axes[0, 0].get_legend_handles_labels()
    if handles:  # outside the panels, at most MAX_LEGEND entries
        keep = pick_spread(list(range(len(handles))), MAX_LEGEND)
        axes[0, 1].legend(
            [handles[i] for i in keep],
            [names[i] for i in keep],
            fontsize=7,
            title="insertion point" + (f"\n({len(keep)} of {len(handles)})" if len(keep) < len(handles) else ""),
            title_fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
        )
    save_figure(fig, p, f"{label}: d_align vs width")
    return {
        "title": f"{label}: d_align vs width",
        "png": str(p),
        "caption": f"Effective alignment dimension d_align = min(d_par, d_2) at each insertion point "
        f"(colour: depth), mean over {n_seeds} seed(s); band = min..max over seeds. "
        f"The mechanism predicts lines that rise with width. A vacuous certificate "
        f"(an estimate <= 0) has no d_align: it is left out of the mean and band, and a "
        f"width where every seed is vacuous has no marker.",
    }


def _fig_misalignment_vs_width(
    sel, label: str, p: Path, pts, ppts, widths, draws: int, floor: float, agg_e, agg_be
) -> dict:
    """2. Empirical misalignment vs width with B_exact and B_align, one panel per (point, (M, K))."""
    mks = pick_spread(mk_pairs(sel), MAX_MK_PANELS)
    fig, axes = _fig(len(ppts), len(mks), w=3.4, h=2.7)
    agg_lo = aggregate(sel, "misalignment_low", by=("point_index", "M", "K", "width"))
    agg_hi = aggregate(sel, "misalignment_high", by=("point_index", "M", "K", "width"))
    agg_ba = aggregate(sel, "two_b_align", by=("point_index", "M", "K", "width"))
    vacuous = {"B_exact": 0, "B_align": 0}
    for i, (pi, pname) in enumerate(ppts):
        for j, (M, K) in enumerate(mks):
            ax = axes[i, j]
            ws = [w for w in widths if (pi, M, K, w) in agg_e]
            e = np.array([agg_e[(pi, M, K, w)][0] for w in ws])
            lo = np.array([agg_lo.get((pi, M, K, w), (math.nan,))[0] for w in ws])
            hi = np.array([agg_hi.get((pi, M, K, w), (math.nan,))[0] for w in ws])
            yerr = np.vstack([np.clip(e - lo, 0, None), np.clip(hi - e, 0, None)])
            yerr = np.nan_to_num(yerr)
            ax.errorbar(
                ws,
                np.maximum(e, floor),
                yerr=yerr,
                fmt="o-",
                color="#1f3b57",
                ms=4,
                capsize=2,
                label="empirical Pr(A<=0)",
            )
            for agg_b, fmt, colour, name in (
                (agg_be, "s--", "#d9822b", "B_exact"),
                (agg_ba, "^:", "#b03a2e", "B_align"),
            ):
                vals = [agg_b.get((pi, M, K, w), (math.nan,))[0] for w in ws]
                real = [(w, max(v, floor)) for w, v in zip(ws, vals) if not v >= VACUOUS]
                hollow = [w for w, v in zip(ws, vals) if v >= VACUOUS]
                vacuous[name] += len(hollow)
                ax.plot([w for w, _ in real], [v for _, v in real], fmt, color=colour, ms=3, label=name)
                if hollow:  # a bound of 1 says nothing: drawn hollow at 1, not joined to the data
                    ax.plot(hollow, [1.0] * len(hollow), fmt[0], mfc="none", color=colour, ms=5)
            _width_axis(ax, widths)
            ax.set_yscale("log")
            ax.set_ylim(floor * 0.7, 1.3)
            ax.set_title(f"{pname}, M={M}, K={K}", fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(ppts) - 1:
                ax.set_xlabel("width N")
            if j == 0:
                ax.set_ylabel("probability")
    axes[0, 0].legend(fontsize=7)
    save_figure(fig, p, f"{label}: misalignment vs width")
    return {
        "title": f"{label}: misalignment vs width, with B_exact and B_align",
        "png": str(p),
        "caption": f"Empirical misalignment probability (fraction of {draws} resamples with "
        f"mu_M.g_K <= 0; bars: mean 95% Wilson interval) beside the two-population "
        f"bounds B_exact (Cantelli) and B_align = 1/(1 + n_eff d_align), mean over seeds. "
        f"Log scale; values below {floor:.1g} (including 0) are drawn at {floor:.1g}. "
        f"Bounds should lie above the empirical values; the mechanism predicts all three "
        f"fall with width."
        + (
            f" Hollow markers at 1: vacuous bounds (B_exact {vacuous['B_exact']}, B_align {vacuous['B_align']} "
            "panel points), which say nothing and are not drawn as data."
            if any(vacuous.values())
            else ""
        )
        + (f" Showing {len(ppts)} of {len(pts)} points." if len(ppts) < len(pts) else ""),
    }


def _fig_misalignment_vs_mk(sel, label: str, p: Path, ppts, widths, floor: float, agg_e, agg_be) -> list[dict]:
    """3. Misalignment vs M = K for each width; ``[]`` with fewer than two paired sizes."""
    paired = sorted({M for (M, K) in mk_pairs(sel) if M == K})
    if len(paired) < 2:
        return []
    wcol = _colors(len(widths))
    fig, axes = _fig(1, len(ppts), w=3.6, h=3.0)
    for j, (pi, pname) in enumerate(ppts):
        ax = axes[0, j]
        for w, c in zip(widths, wcol):
            ms = [m for m in paired if (pi, m, m, w) in agg_e]
            ax.plot(ms, [max(agg_e[(pi, m, m, w)][0], floor) for m in ms], "o-", color=c, ms=4, label=f"N={w:g}")
            ax.plot(ms, [max(agg_be.get((pi, m, m, w), (math.nan,))[0], floor) for m in ms], "--", color=c, lw=0.8)
        _width_axis(ax, paired)
        ax.set_yscale("log")
        ax.set_ylim(floor * 0.7, 1.3)
        ax.set_xlabel("M = K")
        ax.set_title(pname, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("misalignment probability")
    axes[0, 0].legend(fontsize=7)
    save_figure(fig, p, f"{label}: misalignment vs M = K")
    return [
        {
            "title": f"{label}: misalignment vs M = K",
            "png": str(p),
            "caption": "Empirical misalignment (solid, circles) and B_exact (dashed, same colour) "
            "as the sample sizes M = K grow, one line per width (darker = narrower). "
            "Both should fall with M = K at every width.",
        }
    ]
