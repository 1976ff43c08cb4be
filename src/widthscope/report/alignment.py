"""Report section for ``kind="alignment"`` rows (the alignment width sweep).

The claimed mechanism is ``N up => d_align(N) up => Pr(misalignment)(N) down`` with
``Pr(A <= 0) <= B_exact <= B_align = 1/(1 + n_eff d_align)``. This section shows each link:

- ``d_align`` vs width per insertion point (log x; mean over seeds, band = min..max over seeds),
- empirical misalignment vs width with ``B_exact`` and ``B_align`` beside it, for each ``(M, K)``,
- empirical misalignment vs ``M = K`` for each width,
- a table of the numbers, descriptive counts of the points where each link goes the claimed way,
  and the verdict and advice quoted from the claims page (``widthscope.report.claims``: the same
  numbers, the same test, the same Holm correction).

A *trend* over widths ``w_1 < ... < w_n`` of seed-mean values ``v_i`` is "up" when the Spearman
rank correlation of ``(w_i, v_i)`` is >= 0.5 and ``v_n > v_1``, "down" when <= -0.5 and ``v_n < v_1``,
otherwise "flat" (with two widths this is just the sign of ``v_2 - v_1``).

Example::

    from widthscope.report import alignment
    print("\\n".join(alignment.summary(rows)))
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ._groups import _label, groups  # noqa: F401  (shared with the claims page)

__all__ = ["figures", "tables", "summary", "trend", "groups"]

MAX_POINTS_PANELS = 4
MAX_MK_PANELS = 4


# ----------------------------------------------------------------------------- helpers
def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) else math.nan


def _ranks(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a), dtype=float)
    for v in np.unique(a):  # average ranks of ties
        m = a == v
        ranks[m] = ranks[m].mean()
    return ranks


def trend(widths: Sequence[float], values: Sequence[float]) -> str:
    """'up', 'down' or 'flat' for values over increasing widths (NaNs dropped; see module doc)."""
    pairs = [(w, v) for w, v in zip(widths, values) if not math.isnan(_num(v))]
    if len(pairs) < 2:
        return "flat"
    w = [p[0] for p in pairs]
    v = [float(p[1]) for p in pairs]
    rw, rv = _ranks(w), _ranks(v)
    if rv.std() == 0 or rw.std() == 0:
        return "flat"
    rho = float(np.corrcoef(rw, rv)[0, 1])
    if rho >= 0.5 and v[-1] > v[0]:
        return "up"
    if rho <= -0.5 and v[-1] < v[0]:
        return "down"
    return "flat"


def _points(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
    return sorted({(int(r.get("point_index", 0)), str(r.get("point"))) for r in rows})


def _pick(points: list, k: int) -> list:
    """At most k evenly spread points (always the first and last)."""
    if len(points) <= k:
        return points
    idx = sorted({round(i * (len(points) - 1) / (k - 1)) for i in range(k)})
    return [points[i] for i in idx]


def _mk(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    return sorted({(int(r["M"]), int(r["K"])) for r in rows}, key=lambda t: (t[0] * t[1], t))


def _widths(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    return sorted({r["width"] for r in rows})


def _agg(
    rows: Sequence[Mapping[str, Any]], col: str, *, by: tuple[str, ...]
) -> dict[tuple, tuple[float, float, float, int]]:
    """(mean, min, max, n) over seeds of ``col`` for each value of ``by`` (one value per seed)."""
    per: dict[tuple, dict[Any, float]] = defaultdict(dict)
    for r in rows:
        per[tuple(r.get(b) for b in by)].setdefault(r.get("seed"), _num(r.get(col)))
    out = {}
    for k, d in per.items():
        vals = np.array([v for v in d.values() if not math.isnan(v)])
        out[k] = (
            (float(vals.mean()), float(vals.min()), float(vals.max()), len(vals))
            if len(vals)
            else (math.nan, math.nan, math.nan, 0)
        )
    return out


def _d_align_by_point(rows, form: str) -> dict[int, tuple[list[float], list[float]]]:
    """point_index -> (widths, seed-mean d_align); d_align does not depend on (M, K)."""
    agg = _agg(rows, f"{form}_d_align", by=("point_index", "width"))
    out: dict[int, tuple[list, list]] = {}
    for pi, _ in _points(rows):
        ws = [w for w in _widths(rows) if (pi, w) in agg]
        out[pi] = (ws, [agg[(pi, w)][0] for w in ws])
    return out


def _fig(nrows: int, ncols: int, w: float = 4.2, h: float = 3.2):
    from matplotlib.figure import Figure  # Agg canvas, no pyplot global state

    fig = Figure(figsize=(w * ncols, h * nrows), dpi=90, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _save(fig, path: Path, title: str) -> None:
    """Save with the group's label as the figure title (so a PNG alone says which regime it
    shows), every title wrapped to fit (panel titles would clip into each other otherwise)."""
    from .html import fit_titles

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


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")[:60] or "x"


# ----------------------------------------------------------------------------- section API
def figures(rows: list[dict], out_dir: Path) -> list[dict]:
    """PNG figures for alignment rows; see the module docstring."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = []
    gs = groups(rows)
    for key, sel in gs.items():
        label = _label(key, list(gs))
        slug = _slug(label)
        pts = _points(sel)
        widths = _widths(sel)
        figs.append(_fig_d_align(sel, label, out_dir / f"{slug}-d_align.png", pts, widths))
        ppts = _pick(pts, MAX_POINTS_PANELS)
        draws = int(max((d for d in (_num(r.get("misalignment_draws")) for r in sel) if not math.isnan(d)), default=1))
        floor = 0.5 / max(draws, 1)  # where a probability of 0 is drawn on the log axes
        by = ("point_index", "M", "K", "width")
        agg_e, agg_be = _agg(sel, "misalignment", by=by), _agg(sel, "two_b_exact", by=by)
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
        agg = _agg(sel, f"{form}_d_align", by=("point_index", "width"))
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
    if axes[0, 0].get_legend_handles_labels()[0]:
        axes[0, 0].legend(fontsize=7, title="insertion point", title_fontsize=7)
    _save(fig, p, f"{label}: d_align vs width")
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
    mks = _pick(_mk(sel), MAX_MK_PANELS)
    fig, axes = _fig(len(ppts), len(mks), w=3.4, h=2.7)
    agg_lo = _agg(sel, "misalignment_low", by=("point_index", "M", "K", "width"))
    agg_hi = _agg(sel, "misalignment_high", by=("point_index", "M", "K", "width"))
    agg_ba = _agg(sel, "two_b_align", by=("point_index", "M", "K", "width"))
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
            ax.plot(
                ws,
                [max(agg_be.get((pi, M, K, w), (math.nan,))[0], floor) for w in ws],
                "s--",
                color="#d9822b",
                ms=3,
                label="B_exact",
            )
            ax.plot(
                ws,
                [max(agg_ba.get((pi, M, K, w), (math.nan,))[0], floor) for w in ws],
                "^:",
                color="#b03a2e",
                ms=3,
                label="B_align",
            )
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
    _save(fig, p, f"{label}: misalignment vs width")
    return {
        "title": f"{label}: misalignment vs width, with B_exact and B_align",
        "png": str(p),
        "caption": f"Empirical misalignment probability (fraction of {draws} resamples with "
        f"mu_M.g_K <= 0; bars: mean 95% Wilson interval) beside the two-population "
        f"bounds B_exact (Cantelli) and B_align = 1/(1 + n_eff d_align), mean over seeds. "
        f"Log scale; values below {floor:.1g} (including 0) are drawn at {floor:.1g}. "
        f"Bounds should lie above the empirical values; the mechanism predicts all three "
        f"fall with width." + (f" Showing {len(ppts)} of {len(pts)} points." if len(ppts) < len(pts) else ""),
    }


def _fig_misalignment_vs_mk(sel, label: str, p: Path, ppts, widths, floor: float, agg_e, agg_be) -> list[dict]:
    """3. Misalignment vs M = K for each width; ``[]`` with fewer than two paired sizes."""
    paired = sorted({M for (M, K) in _mk(sel) if M == K})
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
    _save(fig, p, f"{label}: misalignment vs M = K")
    return [
        {
            "title": f"{label}: misalignment vs M = K",
            "png": str(p),
            "caption": "Empirical misalignment (solid, circles) and B_exact (dashed, same colour) "
            "as the sample sizes M = K grow, one line per width (darker = narrower). "
            "Both should fall with M = K at every width.",
        }
    ]


def _fmt(v: float, spec: str = ".3g") -> str:
    return "–" if v is None or math.isnan(v) else format(v, spec)


def _limit(rows: Sequence[Mapping[str, Any]]) -> str:
    """Which effective dimension is d_align's minimum, per seed (rows under the vacuous rule):
    'd_par', 'd_2', both ('d_par/d_2') when seeds differ, '–' when every certificate is vacuous."""
    got = {
        "d_par" if r["two_d_par"] <= r["two_d_2"] else "d_2"
        for r in rows
        if r.get("two_d_align") is not None and r.get("two_d_par") is not None and r.get("two_d_2") is not None
    }
    return "/".join(sorted(got)) or "–"


def tables(rows: list[dict]) -> list[dict]:
    """Per group: one line per (width, point) with seed-mean d_align and the largest-(M, K) numbers."""
    out = []
    gs = groups(rows)
    for key, sel in gs.items():
        label = _label(key, list(gs))
        M, K = _mk(sel)[-1]
        at = [r for r in sel if (int(r["M"]), int(r["K"])) == (M, K)]
        by = ("width", "point_index")
        cols = {
            c: _agg(at, c, by=by)
            for c in (
                "two_d_align",
                "one_d_align",
                "two_d_par",
                "two_d_2",
                "misalignment",
                "misalignment_low",
                "misalignment_high",
                "two_b_exact",
                "two_b_align",
                "test_loss",
                "n_params",
            )
        }
        head = [
            "width",
            "point",
            "seeds",
            "vacuous",
            "params",
            "test loss",
            "d_align (2-pop)",
            "d_par",
            "d_2",
            "limit",
            "d_align (1-pop)",
            f"misalign M={M},K={K}",
            "95% Wilson",
            "B_exact",
            "B_align",
        ]
        h = [
            "<table><thead><tr>"
            + "".join(
                f'<th class="l">{html.escape(x)}</th>' if x == "point" else f"<th>{html.escape(x)}</th>" for x in head
            )
            + "</tr></thead><tbody>"
        ]
        for w in _widths(at):
            for pi, pname in _points(at):
                k = (w, pi)
                if k not in cols["two_d_align"]:
                    continue
                mean, lo, hi, n = cols["two_d_align"][k]
                spread = f" ({_fmt(lo)}–{_fmt(hi)})" if n > 1 else ""
                g = {c: v.get(k, (math.nan,))[0] for c, v in cols.items()}  # this row's seed means
                cell = [r for r in at if (r["width"], r["point_index"]) == k]
                seeds = len({r.get("seed") for r in cell})
                n_vac = len({r.get("seed") for r in cell if r.get("two_vacuous") or r.get("two_d_align") is None})
                h.append(
                    "<tr>"
                    + "".join(
                        [
                            f"<td>{w:g}</td>",
                            f'<td class="l">{html.escape(pname)}</td>',
                            f"<td>{seeds}</td>",
                            f"<td>{n_vac}/{seeds}</td>",
                            f"<td>{_fmt(g['n_params'], ',.0f')}</td>",
                            f"<td>{_fmt(g['test_loss'], '.4g')}</td>",
                            f"<td>{_fmt(mean)}{spread}</td>",
                            f"<td>{_fmt(g['two_d_par'])}</td>",
                            f"<td>{_fmt(g['two_d_2'])}</td>",
                            f"<td>{_limit(cell)}</td>",
                            f"<td>{_fmt(g['one_d_align'])}</td>",
                            f"<td>{_fmt(g['misalignment'])}</td>",
                            f"<td>[{_fmt(g['misalignment_low'])}, {_fmt(g['misalignment_high'])}]</td>",
                            f"<td>{_fmt(g['two_b_exact'])}</td>",
                            f"<td>{_fmt(g['two_b_align'])}</td>",
                        ]
                    )
                    + "</tr>"
                )
        h.append("</tbody></table>")
        out.append(
            {
                "title": f"{label}: numbers (mean over seeds; d_align range over seeds in brackets; "
                f"vacuous seeds, whose d_align is undefined, left out)",
                "html": "".join(h),
            }
        )
    return out


def _shifted(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a group's probe pools come from another distribution than the training data
    (``probe_in_domain`` on the rows; older rows: a probe set whose description is not in-domain)."""
    for r in rows:
        if r.get("probe_in_domain") is not None:
            return not r["probe_in_domain"]
    return any(r.get("probe_set") is not None and "in-domain" not in str(r.get("probe_data") or "") for r in rows)


def _advice(label: str, rows: Sequence[Mapping[str, Any]], seeds: str = "more seeds") -> str:
    """What to try next, fitting the probe condition: an in-domain probe can add a shifted one; a
    shifted probe already is one, so its verdict is read beside the in-domain probe's. Longer probe
    sequences only for sequence models. ``seeds``: the claims page's seeds-needed phrase."""
    seq = any(r.get("probe_seq_len") is not None or r.get("dataset") in ("text", "prose") for r in rows)
    more = f"{seeds}, larger M and K (more probe examples)"
    longer = " and longer probe sequences" if seq else ""
    if _shifted(rows):
        return (
            f"What to try next for {label}: {more}{longer}; this probe is already shifted, so read its "
            "verdict beside the in-domain probe's (a mechanism that holds in-domain need not hold under "
            "the shift); vacuous certificates need larger pools."
        )
    return (
        f"What to try next for {label}: {more}, a shifted probe set (a probes entry with another dataset or "
        f"a shift in the sweep config, or certify --train-data/--test-data from another corpus){longer}; "
        "vacuous certificates need larger pools."
    )


def summary(rows: list[dict], found: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """Auto-written verdict per group: descriptive per-point counts, then the verdict and advice
    quoted from the claims page (``found``: its claims, computed from ``rows`` when not given)."""
    if found is None:
        from .claims import claims

        found = claims(rows)
    lines = []
    gs = groups(rows)
    for key, sel in gs.items():
        label = _label(key, list(gs))
        pts = _points(sel)
        widths = _widths(sel)
        if len(widths) < 2:
            lines.append(f"{label}: only one width ({widths[0]:g}); no width trend can be judged.")
            continue
        names = dict(pts)
        trends = {}
        for pi, (ws, vals) in _d_align_by_point(sel, "two").items():
            # A point whose certificate is vacuous (d_align missing) at most widths has no trend to judge.
            unusable = sum(1 for v in vals if math.isnan(v) or v <= 0)
            trends[pi] = "vacuous" if unusable * 2 > len(vals) else trend(ws, vals)
        up = [names[p] for p, t in trends.items() if t == "up"]
        down = [names[p] for p, t in trends.items() if t == "down"]
        vac_pts = [names[p] for p, t in trends.items() if t == "vacuous"]
        n = len(pts)
        s = f"{label}: d_align (two-population) grows with width at {len(up)}/{n} insertion points" + (
            f" ({', '.join(up)})" if up and len(up) < n else ""
        )
        if down:
            s += f", falls at {len(down)} ({', '.join(down)})"
        if vac_pts:
            s += f", is vacuous (d_align missing) at most widths at {len(vac_pts)} ({', '.join(vac_pts)})"
        s += (
            f" over widths {', '.join(f'{w:g}' for w in widths)} (per point, by the seed means: descriptive, "
            "not a test; the verdict below is the tested one)."
        )
        lines.append(s)
        # Is the width trend resolved? Compare the seed range with the change across widths.
        n_seeds = len({r.get("seed") for r in sel})
        unresolved = 0
        if n_seeds > 1:
            agg = _agg(sel, "two_d_align", by=("point_index", "width"))
            for pi, _ in pts:
                ws = [w for w in widths if (pi, w) in agg]
                change = abs(agg[(pi, ws[-1])][0] - agg[(pi, ws[0])][0])
                spread = max(agg[(pi, w)][2] - agg[(pi, w)][1] for w in ws)
                unresolved += spread > change
            lines.append(
                f"Seed-to-seed range of d_align exceeds its change from the narrowest to the widest "
                f"width at {unresolved}/{n} points ({n_seeds} seeds)"
                + (": more seeds are needed before trusting the trend." if unresolved else ".")
            )
        else:
            lines.append("One seed: the seed-to-seed spread is unknown, so no trend here is resolved; run more seeds.")
        one = _d_align_by_point(sel, "one")
        one_up = sum(trend(*one[pi]) == "up" for pi, _ in pts)
        one_down = sum(trend(*one[pi]) == "down" for pi, _ in pts)
        lines.append(
            f"One-population d_align (train samples only) grows at {one_up}/{n} points"
            + (f", falls at {one_down}" if one_down else "")
            + "."
        )

        M, K = _mk(sel)[-1]
        at = [r for r in sel if (int(r["M"]), int(r["K"])) == (M, K)]
        agg = _agg(at, "misalignment", by=("point_index", "width"))
        mt = {}
        for pi, _ in pts:
            ws = [w for w in widths if (pi, w) in agg]
            vals = [agg[(pi, w)][0] for w in ws]
            mt[pi] = "zero" if vals and max(vals) == 0 else trend(ws, vals)
        falls = sum(t == "down" for t in mt.values())
        rises = sum(t == "up" for t in mt.values())
        zero = sum(t == "zero" for t in mt.values())
        s = f"Empirical misalignment at M={M}, K={K} falls with width at {falls}/{n} points"
        if rises:
            s += f", rises at {rises}"
        if zero:
            s += f"; it is 0 at every width at {zero} (nothing left to fall)"
        lines.append(s + ".")

        vac = sum(bool(r.get("two_vacuous")) for r in sel)
        if vac:
            lines.append(
                f"{vac}/{len(sel)} two-population certificates are vacuous (a U-statistic <= 0 on "
                f"the finite sample: bound 1)."
            )
        lines += _claims_lines(label, found, n_seeds, sel)
    return lines


def _fmt_claim(c: Mapping[str, Any]) -> str:
    """'holds (slope +0.41 [0.1, 0.7] per log width, p = 0.01, Holm p = 0.04, 3 seeds)'."""
    if c.get("measured") is None or c.get("low") is None:
        return f"{c['verdict']} ({c.get('seeds') or 0} seed(s) with a value: no interval)"
    pa = c.get("p_adjusted")
    return (
        f"{c['verdict']} ({c.get('unit', '')} {c['measured']:+.3g}, 95% interval [{c['low']:.3g}, "
        f"{c['high']:.3g}], p = {c['p']:.2g}"
        + (f", Holm p = {pa:.2g}" if pa is not None else "")
        + f", {c['seeds']} seeds)"
    )


def _claims_lines(
    label: str, found: Sequence[Mapping[str, Any]], n_seeds: int, sel: Sequence[Mapping[str, Any]]
) -> list[str]:
    """The verdict and the advice for one regime, quoted from the claims page (same numbers)."""
    mine = {c["id"]: c for c in found if c.get("group") == label}
    grow, fall = mine.get("d_align_grows"), mine.get("misalignment_falls_width")
    if grow is None or fall is None:
        return []
    lines = []
    bound, order = mine.get("b_exact_bound"), mine.get("b_align_order")
    if bound is not None and order is not None:
        b, o = bound["counts"], order["counts"]
        lines.append(
            f"B_exact vs the empirical misalignment (claims page): {bound['verdict']}"
            + (f" ({bound['support_note']})" if bound.get("support_note") else "")
            + "; the rate is above "
            f"the bound in {b['point_above_bound']}/{b['tested']} tested rows, significantly (Wilson "
            f"lower end above it) in {b['wilson_low_above_bound']}; {b['vacuous']} vacuous, "
            f"{b['missing']} missing. B_align >= B_exact: {order['verdict']} "
            f"({o['tested'] - o['violations']}/{o['tested']} non-vacuous rows, {o['vacuous']} vacuous, "
            f"{o['missing']} missing)."
        )
    v = {grow["verdict"], fall["verdict"]}
    mech = "holds here" if v == {"holds"} else "does not hold here" if "does not" in v else "is not resolved"
    lines.append(
        f"Verdict for {label} (the claims page's test: t interval over seeds, Holm over its "
        f"{grow.get('family_size', 0)} tested claims): d_align grows with width — {_fmt_claim(grow)}; "
        f"{fall['claim'].split(': ', 1)[-1]} — {_fmt_claim(fall)}. The width mechanism {mech}."
    )
    if mech != "holds here":
        need = [
            f"{name}: about {c['seeds_needed']} seeds at the observed spread"
            for name, c in (("d_align", grow), ("misalignment", fall))
            if c["verdict"] != "holds" and c.get("seeds_needed")
        ]
        lines.append(_advice(label, sel, "; ".join(need) + f" ({n_seeds} now)" if need else "more seeds"))
    return lines
