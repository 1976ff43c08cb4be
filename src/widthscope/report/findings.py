"""The top of every report page: the findings box (each claim of :func:`widthscope.report.claims.claims`
in one plain sentence with its verdict, interval and a link to its figure), what the numbers mean,
and a table of contents."""

from __future__ import annotations

import html
import re
from typing import Any, Mapping, Sequence

from ._fmt import interval, no_nan, num, p_eq
from ._plot import slugify

__all__ = ["MEANING", "anchor", "claim_sentence", "findings_box", "toc", "seeds_phrase", "SHOWN"]

SHOWN = 8  # sentences shown in the box; the rest fold away (the claims table lists every one)

MEANING = (
    "<b>What these numbers mean.</b> At an insertion point (a layer's output) the model's update "
    "direction estimated from M training examples and the gradient estimated from K held-out examples "
    "are <i>aligned</i> when their inner product is positive. <b>d_align</b> (the effective alignment "
    "dimension) measures how consistently they agree: larger means the held-out gradient is more "
    "predictable from the training examples. <b>Misalignment</b> is the measured chance that they point "
    "apart (the fraction of resampled draws with inner product &le; 0). <b>B_exact</b> (Cantelli) and "
    "<b>B_align</b> = 1/(1 + n_eff&middot;d_align) are certified upper bounds on that chance; a bound of 1 "
    "is <i>vacuous</i> (it says nothing) and is never counted as support. The width mechanism is: wider "
    "models &rArr; larger d_align &rArr; lower misalignment. Verdicts: <i>holds</i> / <i>does not</i> "
    "when the 95% interval over seeds lies inside / outside the claimed region after Holm's correction, "
    "else <i>not resolved</i>."
)

_COLOUR = {"holds": "#2d6e23", "does not": "#b3261e", "not resolved": "#8a6d00"}
_FIGURE_OF = {  # claim id -> the alignment figure (suffix of its PNG) that shows it
    "d_align_grows": "d_align",
    "d_par_grows": "d_align",
    "d_2_grows": "d_align",
    "misalignment_falls_width": "misalignment-vs-width",
    "b_exact_bound": "misalignment-vs-width",
    "b_align_order": "misalignment-vs-width",
    "misalignment_falls_MK": "misalignment-vs-MK",
}


def anchor(text: str) -> str:
    """An HTML id from any text (letters, digits and '-')."""
    return re.sub(r"-+", "-", "".join(c if c.isalnum() else "-" for c in str(text))).strip("-").lower() or "x"


def figure_anchor(c: Mapping[str, Any], figure_ids: Sequence[str]) -> str | None:
    """The id of the figure that shows claim ``c`` (or of its section), when the page has one."""
    suffix = _FIGURE_OF.get(str(c.get("id")))
    if suffix and c.get("group"):
        want = anchor(f"fig-{slugify(str(c['group']))}-{suffix}")
        if want in figure_ids:
            return want
    cid = str(c.get("id"))
    for prefix, sec in (
        ("retention", "sec-interventions-and-growth"),
        ("corr_", "sec-linearization"),
        ("dev_", "sec-linearization"),
        ("certify_earlier", "sec-alignment-over-training"),
        ("d_", "sec-alignment-width-sweep"),
        ("misalignment", "sec-alignment-width-sweep"),
        ("b_", "sec-alignment-width-sweep"),
    ):
        if cid.startswith(prefix) and sec in figure_ids:
            return sec
    return None


def claim_sentence(c: Mapping[str, Any]) -> str:
    """One plain sentence (text, not HTML): the claim, its verdict and the numbers behind it."""
    head = str(c["claim"])  # the verdict is the badge beside the sentence
    if c.get("counts") is not None:  # a bound over rows
        k = c["counts"]
        if "point_above_bound" in k:
            return (
                f"{head}: the measured rate is above B_exact in {k['point_above_bound']} of {k['tested']} "
                f"non-vacuous rows ({k['vacuous']} vacuous rows, bound 1, not counted; p {p_eq(c.get('p_adjusted'))})."
            )
        return (
            f"{head}: B_align is below B_exact in {k['violations']} of {k['tested']} non-vacuous rows "
            f"({k['vacuous']} vacuous, not counted)."
        )
    if c.get("low") is None:
        return f"{head}: {c.get('seeds') or 0} seed(s) with a value, too few for an interval."
    p_adj = c.get("p_adjusted") if c.get("family") else c.get("p")
    return (
        f"{head}: measured {num(c.get('measured'), '+.3g')} ({c.get('unit', '')}), 95% interval "
        f"{interval(c.get('low'), c.get('high'))} over {c.get('seeds')} seeds; "
        f"{'Holm ' if c.get('family') else ''}p {p_eq(p_adj)}."
    )


def _order(found: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The headline claims first (d_align grows, misalignment falls), decided before unresolved."""
    rank = {"d_align_grows": 0, "misalignment_falls_width": 1, "b_exact_bound": 2}
    return sorted(found, key=lambda c: (rank.get(str(c.get("id")), 3), c.get("verdict") == "not resolved"))


def findings_box(
    found: Sequence[Mapping[str, Any]],
    figure_ids: Sequence[str] = (),
    *,
    lines: Sequence[str] = (),
    headline: tuple[str, str, str] | None = None,
) -> str:
    """The findings box (HTML): a sentence per claim (``found``) or the given plain ``lines``, the
    headline figure beside them (``(anchor, data uri, title)``), then what the numbers mean."""
    esc = html.escape
    items = []
    for c in _order(found):
        v = str(c.get("verdict", "not resolved"))
        target = figure_anchor(c, figure_ids)
        link = f' <a href="#{target}">figure&nbsp;&darr;</a>' if target else ""
        items.append(
            f'<li><span class="badge" style="background:{_COLOUR.get(v, "#555")}">{esc(v)}</span> '
            f"{esc(no_nan(claim_sentence(c)))}{link}</li>"
        )
    items += [f"<li>{esc(no_nan(s))}</li>" for s in lines]  # plain lines (suite pages)
    if not items:
        items = ["<li>No claim could be tested from these rows; the sections below show what was measured.</li>"]
    shown, rest = items[:SHOWN], items[SHOWN:]
    body = "<ul>" + "".join(shown) + "</ul>"
    if rest:
        body += f"<details><summary>{len(rest)} more finding(s)</summary><ul>{''.join(rest)}</ul></details>"
    fig = ""
    if headline is not None:
        target, uri, title = headline
        fig = (
            f'<a class="headline" href="#{esc(target)}"><img src="{uri}" alt="{esc(title)}">'
            f"<span>{esc(title)}</span></a>"
        )
    return (
        '<section id="findings" class="findings"><h2>Findings</h2>'
        f'<div class="findrow"><div class="findtext">{body}</div>{fig}</div>'
        f'<p class="meaning">{MEANING}</p></section>'
    )


def toc(entries: Sequence[tuple[str, str]]) -> str:
    """A table of contents: ``(anchor, title)`` per entry."""
    esc = html.escape
    return (
        '<nav class="toc"><b>Contents</b><ol>'
        + "".join(f'<li><a href="#{esc(a)}">{esc(t)}</a></li>' for a, t in entries)
        + "</ol></nav>"
    )


def seeds_phrase(found: Sequence[Mapping[str, Any]]) -> str:
    """'with 2 seeds t = 12.7, so the interval is wide' from the seed counts the claims actually had."""
    from scipy import stats  # noqa: PLC0415  start-up time

    ns = sorted({int(c["seeds"]) for c in found if isinstance(c.get("seeds"), int) and c["seeds"] >= 2})
    if not ns:
        return "with fewer than 2 seeds no interval exists, so no claim is decided"
    ts = [float(stats.t.ppf(0.975, n - 1)) for n in ns]
    if len(ns) == 1:
        wide = ", so the interval is wide" if ts[0] > 4 else ""
        return f"with {ns[0]} seeds t = {ts[0]:.3g}{wide}"
    return f"with {ns[0]}–{ns[-1]} seeds t = {ts[0]:.3g}–{ts[-1]:.3g}"
