"""The table of the alignment section (:mod:`widthscope.report.alignment`): per group, one line per
(width, point) with the seed means at the ``(M, K)`` at which the claims are tested
(:func:`~widthscope.report.alignment_rows.claim_mk`), every (M, K)-dependent column labelled with its
pair; when the rows hold a larger pair, its misalignment and B_exact follow in columns labelled with
that pair.
"""

from __future__ import annotations

import html
import math
from typing import Any, Mapping, Sequence

from ._groups import group_label, groups
from .alignment_rows import aggregate, claim_mk, mk_pairs, point_keys, width_values


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
    """Per group: one line per (width, point) with seed-mean d_align and the numbers at the claims'
    (M, K), plus the largest pair's misalignment and B_exact when that pair differs."""
    out = []
    gs = groups(rows)
    for key, sel in gs.items():
        label = group_label(key, list(gs))
        M, K = claim_mk(sel)
        at = [r for r in sel if (int(r["M"]), int(r["K"])) == (M, K)]
        largest = mk_pairs(sel)[-1]
        big = None if largest == (M, K) else largest
        by = ("width", "point_index")
        at_big = [r for r in sel if (int(r["M"]), int(r["K"])) == big]
        more = {c: aggregate(at_big, c, by=by) for c in ("misalignment", "two_b_exact")} if big else {}
        mk = f"M={M},K={K}"
        cols = {
            c: aggregate(at, c, by=by)
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
            f"misalign {mk}",
            "95% Wilson",
            f"B_exact {mk}",
            f"B_align {mk}",
        ]
        if big:
            head += [f"misalign M={big[0]},K={big[1]}", f"B_exact M={big[0]},K={big[1]}"]
        h = [
            "<table><thead><tr>"
            + "".join(
                f'<th class="l">{html.escape(x)}</th>' if x == "point" else f"<th>{html.escape(x)}</th>" for x in head
            )
            + "</tr></thead><tbody>"
        ]
        for w in width_values(at):
            for pi, pname in point_keys(at):
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
                            *(f"<td>{_fmt(v.get(k, (math.nan,))[0])}</td>" for v in more.values()),
                        ]
                    )
                    + "</tr>"
                )
        h.append("</tbody></table>")
        out.append(
            {
                "title": f"{label}: numbers at M={M}, K={K}, the (M, K) at which the claims are tested "
                f"(mean over seeds; d_align range over seeds in brackets; vacuous seeds, whose d_align is "
                f"undefined, left out)"
                + (f"; the largest pair, M={big[0]}, K={big[1]}, in the last two columns" if big else ""),
                "html": "".join(h),
            }
        )
    return out
