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

The parts live beside this module, their names re-exported here: ``alignment_rows`` (seed
aggregation, :func:`trend`), ``alignment_figures`` (:func:`figures`) and ``alignment_tables``
(:func:`tables`); this module writes the summary.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from ._fmt import interval, num, pval
from ._groups import group_label, groups

# Re-exported: importable from here (the monitor section takes as_number, save_figure, slugify).
from .alignment_figures import MAX_MK_PANELS, MAX_POINTS_PANELS, figures, save_figure, slugify  # noqa: F401
from .alignment_rows import aggregate, as_number, claim_mk, d_align_by_point, mk_pairs, point_keys, trend, width_values  # noqa: F401
from .alignment_tables import tables

__all__ = ["figures", "tables", "summary", "trend", "groups"]


# ----------------------------------------------------------------------------- summary
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
        from .claims import claims  # noqa: PLC0415  start-up time: scipy

        found = claims(rows)
    lines = []
    gs = groups(rows)
    for key, sel in gs.items():
        label = group_label(key, list(gs))
        pts = point_keys(sel)
        widths = width_values(sel)
        if len(widths) < 2:
            lines.append(f"{label}: only one width ({widths[0]:g}); no width trend can be judged.")
            continue
        names = dict(pts)
        trends = {}
        for pi, (ws, vals) in d_align_by_point(sel, "two").items():
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
            agg = aggregate(sel, "two_d_align", by=("point_index", "width"))
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
        one = d_align_by_point(sel, "one")
        one_up = sum(trend(*one[pi]) == "up" for pi, _ in pts)
        one_down = sum(trend(*one[pi]) == "down" for pi, _ in pts)
        lines.append(
            f"One-population d_align (train samples only) grows at {one_up}/{n} points"
            + (f", falls at {one_down}" if one_down else "")
            + "."
        )

        M, K = claim_mk(sel)  # the claims' (M, K): the sentence and the claim quote one pair
        at = [r for r in sel if (int(r["M"]), int(r["K"])) == (M, K)]
        agg = aggregate(at, "misalignment", by=("point_index", "width"))
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
    p = pval(c.get("p"))
    return (
        f"{c['verdict']} ({c.get('unit', '')} {num(c['measured'], '+.3g')}, 95% interval "
        f"{interval(c['low'], c['high'])}, p {p if p.startswith('<') else '= ' + p}"
        + (f", Holm p {_eq(pval(pa))}" if pa is not None else "")
        + f", {c['seeds']} seeds)"
    )


def _eq(p: str) -> str:
    return p if p.startswith("<") else "= " + p


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
