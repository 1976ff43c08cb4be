"""Report section for ``kind="alignment"`` rows (the alignment width sweep): per probe regime, d_align
vs width per insertion point, misalignment vs width beside B_exact and B_align, misalignment vs
``M = K``, a table of seed means, and counts followed by the claims page's verdict and advice."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ._fmt import as_number, finite, interval, num, p_eq
from ._plot import auto_y, colors, figure, legend_outside, log_x, plot_bound, save_figure, slugify, thin, yerr
from .claims import claim_mk, claims, groups, labelled
from .html import table

__all__ = ["figures", "tables", "summary", "trend", "groups"]

MAX_PANELS = 4  # insertion points (rows) and (M, K) pairs (columns) of the misalignment figures


def trend(widths: Sequence[float], values: Sequence[float]) -> str:
    """'up' when the Spearman correlation of (width, value) is >= 0.5 and the last value exceeds the
    first, 'down' for the mirror case, else 'flat' (NaNs dropped)."""
    from scipy.stats import spearmanr  # noqa: PLC0415  start-up time: scipy.stats

    pairs = [(w, float(v)) for w, v in zip(widths, values) if not math.isnan(as_number(v))]
    if len({w for w, _ in pairs}) < 2 or len({v for _, v in pairs}) < 2:
        return "flat"
    rho = float(spearmanr(*zip(*pairs)).statistic)
    first, last = pairs[0][1], pairs[-1][1]
    if rho >= 0.5 and last > first:
        return "up"
    if rho <= -0.5 and last < first:
        return "down"
    return "flat"


def point_keys(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
    return sorted({(int(r.get("point_index", 0)), str(r.get("point"))) for r in rows})


def _mk(r: Mapping[str, Any]) -> tuple[int, int]:
    return int(r["M"]), int(r["K"])


def _mk_pairs(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    return sorted({_mk(r) for r in rows}, key=lambda t: (t[0] * t[1], t))


def _widths(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    return sorted({r["width"] for r in rows})


def aggregate(
    rows: Sequence[Mapping[str, Any]], col: str, *, by: tuple[str, ...]
) -> dict[tuple, tuple[float, float, float, int]]:
    """(mean, min, max, n) over seeds of ``col`` for each value of ``by`` (one value per seed)."""
    per: dict[tuple, dict[Any, float]] = defaultdict(dict)
    for r in rows:
        per[tuple(r.get(b) for b in by)].setdefault(r.get("seed"), as_number(r.get(col)))
    out = {}
    for k, d in per.items():
        v = np.array([v for v in d.values() if not math.isnan(v)])
        out[k] = (
            (float(v.mean()), float(v.min()), float(v.max()), len(v)) if len(v) else (math.nan, math.nan, math.nan, 0)
        )
    return out


def d_align_by_point(rows: Sequence[Mapping[str, Any]], form: str) -> dict[int, tuple[list[float], list[float]]]:
    """point_index -> (widths, seed-mean d_align); d_align does not depend on (M, K)."""
    agg = aggregate(rows, f"{form}_d_align", by=("point_index", "width"))
    at = {pi: [w for w in _widths(rows) if (pi, w) in agg] for pi, _ in point_keys(rows)}
    return {pi: (ws, [agg[(pi, w)][0] for w in ws]) for pi, ws in at.items()}


def figures(rows: list[dict], out_dir: Path) -> list[dict]:
    """Per group: d_align vs width, misalignment vs width, misalignment vs M = K (PNGs in ``out_dir``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = []
    for label, sel in labelled(rows):
        base = out_dir / slugify(label)
        draws = int(max((r["misalignment_draws"] for r in sel if finite(r.get("misalignment_draws"))), default=1))
        floor = 0.5 / max(draws, 1)  # where a probability of 0 is drawn on the log axes
        figs.append(_fig_d_align(sel, label, Path(f"{base}-d_align.png")))
        figs.append(_fig_misalignment_vs_width(sel, label, Path(f"{base}-misalignment-vs-width.png"), draws, floor))
        figs += _fig_misalignment_vs_mk(sel, label, Path(f"{base}-misalignment-vs-MK.png"), floor)
    return figs


def _fig_d_align(sel: Sequence[Mapping[str, Any]], label: str, p: Path) -> dict:
    """d_align vs width, one line per point, both population forms."""
    pts, widths = point_keys(sel), _widths(sel)
    n_seeds = len({r.get("seed") for r in sel})
    fig, axes = figure(1, 2)
    forms = (("two", "two-population (train vs held-out)"), ("one", "one-population (train)"))
    for ax, (form, name) in zip(axes[0], forms):
        agg = aggregate(sel, f"{form}_d_align", by=("point_index", "width"))
        for (pi, pname), c in zip(pts, colors(len(pts))):
            ws = [w for w in widths if (pi, w) in agg and not math.isnan(agg[(pi, w)][0])]
            if ws:
                ax.plot(ws, [agg[(pi, w)][0] for w in ws], "o-", color=c, label=pname, ms=4)
            if ws and n_seeds > 1:
                lo, hi = [agg[(pi, w)][1] for w in ws], [agg[(pi, w)][2] for w in ws]
                ax.fill_between(ws, lo, hi, color=c, alpha=0.18, lw=0)
        log_x(ax, widths)
        ax.set_xlim(min(widths) / 1.2, max(widths) * 1.2)  # every swept width, drawn or vacuous
        auto_y(ax, [y for line in ax.lines for y in line.get_ydata()])
        if not ax.lines:  # say why the panel is empty rather than show bare axes
            empty = "no d_align to draw: every certificate\nis vacuous (an estimate <= 0)"
            ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="#555")
        ax.set(xlabel="width N", ylabel="d_align")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    legend_outside(axes[0, 1], title="insertion point", title_fontsize=7)
    return save_figure(
        fig,
        p,
        f"{label}: d_align vs width",
        f"Effective alignment dimension d_align = min(d_par, d_2) at each insertion point "
        f"(colour: depth), mean over {n_seeds} seed(s); band = min..max over seeds. "
        f"The mechanism predicts lines that rise with width. A vacuous certificate "
        f"(an estimate <= 0) has no d_align: it is left out of the mean and band, and a "
        f"width where every seed is vacuous has no marker.",
        suptitle=True,
    )


def _fig_misalignment_vs_width(sel: Sequence[Mapping[str, Any]], label: str, p: Path, draws: int, floor: float) -> dict:
    """Empirical misalignment vs width with B_exact and B_align, one panel per (point, (M, K))."""
    pts, widths = point_keys(sel), _widths(sel)
    ppts, mks = thin(pts, MAX_PANELS), thin(_mk_pairs(sel), MAX_PANELS)
    fig, axes = figure(len(ppts), len(mks), w=3.4, h=2.7)
    by = ("point_index", "M", "K", "width")
    cols = ("misalignment", "misalignment_low", "misalignment_high", "two_b_exact", "two_b_align")
    agg = {c: aggregate(sel, c, by=by) for c in cols}
    vacuous = {"B_exact": 0, "B_align": 0}
    for i, (pi, pname) in enumerate(ppts):
        for j, (M, K) in enumerate(mks):
            ax = axes[i, j]
            ws = [w for w in widths if (pi, M, K, w) in agg["misalignment"]]
            e, lo, hi, be, ba = ([agg[c].get((pi, M, K, w), (math.nan,))[0] for w in ws] for c in cols)
            empirical = dict(fmt="o-", color="#1f3b57", ms=4, capsize=2, label="empirical Pr(A<=0)")
            ax.errorbar(ws, np.maximum(e, floor), yerr(e, lo, hi), **empirical)
            vacuous["B_exact"] += plot_bound(ax, ws, be, "s--", "#d9822b", floor=floor, label="B_exact")
            vacuous["B_align"] += plot_bound(ax, ws, ba, "^:", "#b03a2e", floor=floor, label="B_align")
            log_x(ax, widths)
            ax.set(yscale="log", ylim=(floor * 0.7, 1.3), xlabel="width N" if i == len(ppts) - 1 else "")
            ax.set(ylabel="probability" if j == 0 else "")
            ax.set_title(f"{pname}, M={M}, K={K}", fontsize=9)
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    hollow = (
        f" Hollow markers at 1: vacuous bounds (B_exact {vacuous['B_exact']}, B_align {vacuous['B_align']} "
        "panel points), which say nothing and are not drawn as data."
    )
    return save_figure(
        fig,
        p,
        f"{label}: misalignment vs width, with B_exact and B_align",
        f"Empirical misalignment probability (fraction of {draws} resamples with "
        f"mu_M.g_K <= 0; bars: mean 95% Wilson interval) beside the two-population "
        f"bounds B_exact (Cantelli) and B_align = 1/(1 + n_eff d_align), mean over seeds. "
        f"Log scale; values below {floor:.1g} (including 0) are drawn at {floor:.1g}. "
        f"Bounds should lie above the empirical values; the mechanism predicts all three "
        f"fall with width."
        + (hollow if any(vacuous.values()) else "")
        + (f" Showing {len(ppts)} of {len(pts)} points." if len(ppts) < len(pts) else ""),
        suptitle=True,
    )


def _fig_misalignment_vs_mk(sel: Sequence[Mapping[str, Any]], label: str, p: Path, floor: float) -> list[dict]:
    """Misalignment vs M = K for each width; ``[]`` with fewer than two paired sizes."""
    paired = sorted({M for (M, K) in _mk_pairs(sel) if M == K})
    if len(paired) < 2:
        return []
    widths, ppts = _widths(sel), thin(point_keys(sel), MAX_PANELS)
    by = ("point_index", "M", "K", "width")
    agg_e, agg_be = aggregate(sel, "misalignment", by=by), aggregate(sel, "two_b_exact", by=by)
    fig, axes = figure(1, len(ppts), w=3.6, h=3.0)
    for ax, (pi, pname) in zip(axes[0], ppts):
        for w, c in zip(widths, colors(len(widths))):
            ms = [m for m in paired if (pi, m, m, w) in agg_e]
            ax.plot(ms, [max(agg_e[(pi, m, m, w)][0], floor) for m in ms], "o-", color=c, ms=4, label=f"N={w:g}")
            ax.plot(ms, [max(agg_be.get((pi, m, m, w), (math.nan,))[0], floor) for m in ms], "--", color=c, lw=0.8)
        log_x(ax, paired)
        ax.set(yscale="log", ylim=(floor * 0.7, 1.3), xlabel="M = K")
        ax.set_title(pname, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("misalignment probability")
    axes[0, 0].legend(fontsize=7)
    caption = (
        "Empirical misalignment (solid, circles) and B_exact (dashed, same colour) as the sample sizes "
        "M = K grow, one line per width (darker = narrower). Both should fall with M = K at every width."
    )
    return [save_figure(fig, p, f"{label}: misalignment vs M = K", caption, suptitle=True)]


_HEAD = ("width", "point", "seeds", "vacuous", "params", "test loss", "d_align (2-pop)", "d_par", "d_2", "limit")
_SEED_MEANS = tuple(
    "n_params test_loss two_d_align two_d_par two_d_2 one_d_align misalignment misalignment_low misalignment_high "
    "two_b_exact two_b_align".split()
)


def _limit(rows: Sequence[Mapping[str, Any]]) -> str:
    """Which effective dimension is d_align's minimum, per seed: 'd_par', 'd_2', 'd_par/d_2' when
    seeds differ, '–' when every certificate is vacuous."""
    ok = [r for r in rows if all(r.get(k) is not None for k in ("two_d_align", "two_d_par", "two_d_2"))]
    return "/".join(sorted({"d_par" if r["two_d_par"] <= r["two_d_2"] else "d_2" for r in ok})) or "–"


def tables(rows: list[dict]) -> list[dict]:
    """Per group: the seed means of each (width, point) at the claims' (M, K) and the largest pair."""
    out = []
    by = ("width", "point_index")
    for label, sel in labelled(rows):
        M, K = claim_mk(sel)
        at = [r for r in sel if _mk(r) == (M, K)]
        big = _mk_pairs(sel)[-1]
        big_rows = [r for r in sel if _mk(r) == big] if big != (M, K) else []
        cols = {c: aggregate(at, c, by=by) for c in _SEED_MEANS}
        more = [aggregate(big_rows, c, by=by) for c in ("misalignment", "two_b_exact")] if big_rows else []
        mk = f"M={M},K={K}"
        head = [*_HEAD, "d_align (1-pop)", f"misalign {mk}", "95% Wilson", f"B_exact {mk}", f"B_align {mk}"]
        head += [f"misalign M={big[0]},K={big[1]}", f"B_exact M={big[0]},K={big[1]}"] if big_rows else []
        lines = []
        for w in _widths(at):
            for pi, pname in point_keys(at):
                k = (w, pi)
                if k not in cols["two_d_align"]:
                    continue
                g = {c: v.get(k, (math.nan,))[0] for c, v in cols.items()}  # this line's seed means
                _, lo, hi, n = cols["two_d_align"][k]
                cell = [r for r in at if (r["width"], r["point_index"]) == k]
                seeds = len({r.get("seed") for r in cell})
                n_vac = len({r.get("seed") for r in cell if r.get("two_vacuous") or r.get("two_d_align") is None})
                d = num(g["two_d_align"]) + (f" ({num(lo)}–{num(hi)})" if n > 1 else "")
                line = [f"{w:g}", pname, seeds, f"{n_vac}/{seeds}", num(g["n_params"], ",.0f")]
                line += [num(g["test_loss"], ".4g"), d, num(g["two_d_par"]), num(g["two_d_2"]), _limit(cell)]
                line += [num(g["one_d_align"]), num(g["misalignment"])]
                line += [interval(g["misalignment_low"], g["misalignment_high"]), num(g["two_b_exact"])]
                lines.append(line + [num(g["two_b_align"]), *(num(v.get(k, (math.nan,))[0]) for v in more)])
        out.append(
            {
                "title": f"{label}: numbers at M={M}, K={K}, the (M, K) at which the claims are tested "
                "(mean over seeds; d_align range over seeds in brackets; vacuous seeds, whose d_align is "
                "undefined, left out)"
                + (f"; the largest pair, M={big[0]}, K={big[1]}, in the last two columns" if big_rows else ""),
                "html": table(head, lines, left={1}),
            }
        )
    return out


def _shifted(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the probe pools are out of domain (older rows: a probe set not described in-domain)."""
    for r in rows:
        if r.get("probe_in_domain") is not None:
            return not r["probe_in_domain"]
    return any(r.get("probe_set") is not None and "in-domain" not in str(r.get("probe_data") or "") for r in rows)


def _advice(label: str, rows: Sequence[Mapping[str, Any]], seeds: str) -> str:
    """What to try next, fitting the probe condition; ``seeds``: the claims page's seeds-needed phrase."""
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


def _named(names: Sequence[str]) -> str:
    return f" ({', '.join(names)})"


def summary(rows: list[dict], found: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """Per group: descriptive per-point counts, then the verdict and advice of the claims ``found``."""
    if found is None:
        found = claims(rows)
    lines = []
    for label, sel in labelled(rows):
        pts, widths = point_keys(sel), _widths(sel)
        if len(widths) < 2:
            lines.append(f"{label}: only one width ({widths[0]:g}); no width trend can be judged.")
            continue
        names, n = dict(pts), len(pts)
        trends = {}
        for pi, (ws, vals) in d_align_by_point(sel, "two").items():
            # A point whose certificate is vacuous (d_align missing) at most widths has no trend to judge.
            unusable = sum(1 for v in vals if math.isnan(v) or v <= 0)
            trends[pi] = "vacuous" if unusable * 2 > len(vals) else trend(ws, vals)
        up, down, vac_pts = ([names[p] for p, t in trends.items() if t == want] for want in ("up", "down", "vacuous"))
        s = f"{label}: d_align (two-population) grows with width at {len(up)}/{n} insertion points"
        s += _named(up) if up and len(up) < n else ""
        s += f", falls at {len(down)}{_named(down)}" if down else ""
        s += f", is vacuous (d_align missing) at most widths at {len(vac_pts)}{_named(vac_pts)}" if vac_pts else ""
        lines.append(
            s + f" over widths {', '.join(f'{w:g}' for w in widths)} (per point, by the seed means: descriptive, "
            "not a test; the verdict below is the tested one)."
        )
        # Is the width trend resolved? Compare the seed range with the change across widths.
        n_seeds = len({r.get("seed") for r in sel})
        if n_seeds > 1:
            agg = aggregate(sel, "two_d_align", by=("point_index", "width"))
            unresolved = 0
            for pi, _ in pts:
                ws = [w for w in widths if (pi, w) in agg]
                change = abs(agg[(pi, ws[-1])][0] - agg[(pi, ws[0])][0])
                unresolved += max(agg[(pi, w)][2] - agg[(pi, w)][1] for w in ws) > change
            lines.append(
                f"Seed-to-seed range of d_align exceeds its change from the narrowest to the widest "
                f"width at {unresolved}/{n} points ({n_seeds} seeds)"
                + (": more seeds are needed before trusting the trend." if unresolved else ".")
            )
        else:
            lines.append("One seed: the seed-to-seed spread is unknown, so no trend here is resolved; run more seeds.")
        one = [trend(*v) for v in d_align_by_point(sel, "one").values()]
        lines.append(
            f"One-population d_align (train samples only) grows at {one.count('up')}/{n} points"
            + (f", falls at {one.count('down')}" if "down" in one else "")
            + "."
        )
        M, K = claim_mk(sel)  # the claims' (M, K): the sentence and the claim quote one pair
        agg = aggregate([r for r in sel if _mk(r) == (M, K)], "misalignment", by=("point_index", "width"))
        mt = []
        for pi, _ in pts:
            ws = [w for w in widths if (pi, w) in agg]
            vals = [agg[(pi, w)][0] for w in ws]
            mt.append("zero" if vals and max(vals) == 0 else trend(ws, vals))
        s = f"Empirical misalignment at M={M}, K={K} falls with width at {mt.count('down')}/{n} points"
        s += f", rises at {mt.count('up')}" if "up" in mt else ""
        s += f"; it is 0 at every width at {mt.count('zero')} (nothing left to fall)" if "zero" in mt else ""
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
    """'holds (slope +0.41, 95% interval [0.1, 0.7], p = 0.01, Holm p = 0.04, 3 seeds)'."""
    if c.get("measured") is None or c.get("low") is None:
        return f"{c['verdict']} ({c.get('seeds') or 0} seed(s) with a value: no interval)"
    pa = c.get("p_adjusted")
    return (
        f"{c['verdict']} ({c.get('unit', '')} {num(c['measured'], '+.3g')}, 95% interval "
        f"{interval(c['low'], c['high'])}, p {p_eq(c.get('p'))}"
        + (f", Holm p {p_eq(pa)}" if pa is not None else "")
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
