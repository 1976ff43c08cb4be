"""The pages of a model-suite sweep (:mod:`widthscope.sweeps.suite`) beside ``report.html``:
``width-series.html`` (against width, one series per depth) and ``over-training.html`` (against the
revision's training step). Each (width, revision) is summarised by medians over its points at the
largest (M, K) of d_align, misalignment and B_exact; both pages end with a table of them."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

from .._io import atomic_write_text
from ._fmt import finite
from ._plot import VACUOUS, auto_y, figure, legend_outside, log_x, plot_bound, save_figure, slugify
from .certify_series import check_suite
from .html import render_page, table

__all__ = ["is_suite", "summarize", "write_pages", "PAGES"]

PAGES = ("width-series.html", "over-training.html")


def is_suite(row: Mapping[str, Any]) -> bool:
    return row.get("kind") == "alignment" and row.get("suite") is not None and "revision" in row


def _median(vals: Sequence[Any]) -> float | None:
    xs = [float(v) for v in vals if finite(v)]
    return statistics.median(xs) if xs else None


_MEDIANS = (("d_align", "two_d_align"), ("misalignment", "misalignment"), ("b_exact", "two_b_exact"))


def summarize(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One dict per (suite, width, revision): the medians over points at the largest (M, K)."""
    sel = [r for r in rows if is_suite(r)]

    def key(r: Mapping[str, Any]) -> tuple[str, float, str, str]:
        return str(r["suite"]), float(r["width"]), str(r.get("model_id") or r.get("model")), str(r["revision"])

    keys = sorted({key(r) for r in sel}, key=lambda k: (k[0], k[1], k[2], _step_key(sel, k[3])))
    out = []
    for suite, width, model, rev in keys:
        g = [r for r in sel if key(r) == (suite, width, model, rev)]
        mk = max({(int(r["M"]), int(r["K"])) for r in g}, key=lambda t: (t[0] * t[1], t))
        at = [r for r in g if (int(r["M"]), int(r["K"])) == mk]
        row = {"suite": suite, "width": width, "revision": rev, "model_id": model, "M": mk[0], "K": mk[1]}
        row.update({k: at[0].get(k) for k in ("step", "commit", "depth")}, model=f"{model} (width {_fmt(width)})")
        row.update(points=len({r["point"] for r in at}), vacuous=sum(bool(r.get("two_vacuous")) for r in at))
        out.append({**row, **{k: _median([r.get(c) for r in at]) for k, c in _MEDIANS}})
    return out


def _step_key(rows: Sequence[Mapping[str, Any]], revision: str) -> tuple[float, str]:
    step = next((r.get("step") for r in rows if str(r["revision"]) == revision), None)
    return (float(step) if isinstance(step, (int, float)) else math.inf, revision)


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:g}" if v.is_integer() else f"{v:.4g}"
    return str(v)


def _table(summary: Sequence[Mapping[str, Any]]) -> str:
    head = ["width", "revision", "step", "commit", "model", "depth", "points", "vacuous", "M,K"]
    head += ["d_align (median)", "misalignment (median)", "B_exact (median)"]
    lines = []
    for s in summary:
        cells = [s["width"], s["revision"], s["step"], (s["commit"] or "–")[:12], s["model_id"], s.get("depth")]
        cells += [s["points"], s["vacuous"], f"{s['M']},{s['K']}", s["d_align"], s["misalignment"], s["b_exact"]]
        lines.append([_fmt(c) for c in cells])
    return table(head, lines, left={1, 3, 4})


_QUANTITIES = (
    ("d_align", "d_align (two-population, median over points)"),
    ("misalignment", "empirical misalignment (median over points)"),
    ("b_exact", "B_exact (median over points)"),
)


def _figure(
    summary: Sequence[Mapping[str, Any]], x: str, line: str, out: Path, title: str, caption: str
) -> dict[str, str]:
    """One panel per quantity, one line per ``line`` value against ``x``; a vacuous B_exact is a
    hollow marker, counted in the caption."""
    fig, axes = figure(1, len(_QUANTITIES), w=4.7, h=3.6)
    xs = sorted({float(s[x]) for s in summary if s[x] is not None})
    vacuous = 0
    for ax, (col, label) in zip(axes[0], _QUANTITIES):
        for k, name in enumerate(dict.fromkeys(s[line] for s in summary)):
            got = sorted((float(s[x]), s[col]) for s in summary if s[line] == name and None not in (s[x], s[col]))
            if not got:
                continue
            px, py = zip(*got)
            if col == "b_exact":
                vacuous += plot_bound(ax, px, py, "o-", f"C{k % 10}", ms=5, label=_fmt(name))
            else:
                ax.plot(px, py, "o-", color=f"C{k % 10}", ms=5, label=_fmt(name))
        log_x(ax, xs, labelled=len(xs) <= 8)
        auto_y(ax, [float(s[col]) for s in summary if s[col] is not None])
        ax.set_xlabel(x)
        ax.set_title(label)
        ax.grid(alpha=0.3)
    legend_outside(axes[0, -1], title=line, title_fontsize=7)
    fig.suptitle(title)
    if vacuous:
        caption += f" Hollow markers: {vacuous} vacuous B_exact median(s) (bound 1, no information), not data."
    return save_figure(fig, out, title, caption)


def _latest(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows of the latest revision (largest step) present at every width, else of the latest one."""
    revs = sorted({s["revision"] for s in rows}, key=lambda r: _step_key(list(rows), r))
    widths = {s["width"] for s in rows}
    full = [r for r in revs if {s["width"] for s in rows if s["revision"] == r} == widths]
    rev = (full or revs)[-1]
    return [s for s in rows if s["revision"] == rev]


def _width_finding(name: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """One descriptive sentence per width series: d_align from the narrowest to the widest model."""
    last = sorted(_latest(rows), key=lambda s: s["width"])
    got = [s for s in last if s["d_align"] is not None]
    vac = sum(s["b_exact"] is not None and s["b_exact"] >= VACUOUS for s in rows)
    tail = f"; {vac} of {len(rows)} checkpoints have a vacuous B_exact (bound 1)" if vac else ""
    if len(got) < 2:
        return (
            f"{name}: fewer than two widths with a d_align at revision {last[0]['revision']}, "
            f"so no width trend can be read{tail}."
        )
    a, b = got[0], got[-1]
    way = "grows" if b["d_align"] > a["d_align"] else "falls" if b["d_align"] < a["d_align"] else "is flat"
    return (
        f"{name}: median d_align {way} with width at revision {a['revision']}, from {_fmt(a['d_align'])} at "
        f"width {_fmt(a['width'])} to {_fmt(b['d_align'])} at width {_fmt(b['width'])} "
        f"({len(got)} widths; descriptive, one model per width, no test){tail}."
    )


def _training_findings(summary: Sequence[Mapping[str, Any]]) -> list[str]:
    out = []
    for model in dict.fromkeys(s["model"] for s in summary):
        pts = sorted((s for s in summary if s["model"] == model and s["step"] is not None), key=lambda s: s["step"])
        pts = [s for s in pts if s["d_align"] is not None]
        if len(pts) >= 2:
            a, b = pts[0], pts[-1]
            out.append(
                f"{model}: median d_align from {_fmt(a['d_align'])} at step {_fmt(a['step'])} to "
                f"{_fmt(b['d_align'])} at step {_fmt(b['step'])} (descriptive)."
            )
    return out


def write_pages(rows: Sequence[Mapping[str, Any]], out_dir: str | Path) -> list[Path]:
    """Write the two pages (and their PNGs) into ``out_dir``; return their paths ([] without suite rows)."""
    sel = [dict(r) for r in rows if is_suite(r)]
    if not sel:
        return []
    check_suite(sel)
    out_dir = Path(out_dir)
    summary = summarize(sel)
    width_secs, step_secs, notes = [], [], []
    width_lines: list[str] = []
    for suite in dict.fromkeys(s["suite"] for s in summary):
        mine = [s for s in summary if s["suite"] == suite]
        slug = slugify(suite)
        cap = (
            f"Each marker: one checkpoint, the median over its insertion points at (M, K) = "
            f"({mine[0]['M']}, {mine[0]['K']}); d_align over the non-vacuous points."
        )
        depths = sorted({s.get("depth") for s in mine}, key=lambda d: (d is None, d if d is not None else 0))
        for depth in depths:  # the paper compares widths within one depth: one series per depth
            same = [s for s in mine if s.get("depth") == depth]
            name = suite if len(depths) == 1 else f"{suite}, depth {_fmt(depth)}"
            tag = slug if len(depths) == 1 else f"{slug}-depth{_fmt(depth)}"
            fig = _figure(same, "width", "revision", out_dir / f"suite-{tag}-width.png", f"{name}: against width", cap)
            width_secs.append(
                {"title": name, "figures": [fig], "tables": [{"title": "checkpoints", "html": _table(same)}]}
            )
            width_lines.append(_width_finding(name, same))
        if len(depths) > 1:
            notes.append(
                f"{suite}: models of {len(depths)} depths ({', '.join(_fmt(d) for d in depths)}): one width "
                "series per depth, since widths are compared within a depth"
            )
        stepped = [s for s in mine if s["step"] is not None]
        unstepped = sorted({s["revision"] for s in mine if s["step"] is None})
        if unstepped:
            notes.append(
                f"{suite}: revision(s) {', '.join(unstepped)} name no training step (e.g. step1000): "
                "in the table, not in the figures"
            )
        png = out_dir / f"suite-{slug}-steps.png"
        figs = [_figure(stepped, "step", "model", png, f"{suite}: over training", cap)] if stepped else []
        step_secs.append({"title": suite, "figures": figs, "tables": [{"title": "checkpoints", "html": _table(mine)}]})
    pages = [out_dir / p for p in PAGES]
    for page, title, secs, page_notes, findings in (
        (pages[0], "width series of the model suite", width_secs, [n for n in notes if "depths" in n], width_lines),
        (pages[1], "over training, per width", step_secs, notes, _training_findings(summary)),
    ):
        subtitle = "model suite: certify runs of existing checkpoints"
        html = render_page(
            f"widthscope: {title}", secs, notes=page_notes, subtitle=subtitle, findings=findings, headline=False
        )
        atomic_write_text(page, html)
    return pages
