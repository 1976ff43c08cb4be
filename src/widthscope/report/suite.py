"""The pages of a model-suite sweep (:mod:`widthscope.sweeps.suite`): a width series and an
over-training series, beside the main ``report.html``.

The rows of a suite are certify rows (:mod:`widthscope.report.certify_series`, checked there to be
comparable: the same (M, K) pairs, estimator and pooling within a suite) carrying ``suite``,
``revision``, ``step`` and ``commit``. Models of one suite differ in depth as well as width (Pythia
70m has 6 layers, 2.8b has 32), so points are not matched by name across widths: each (width,
revision) is summarised by the **median over its insertion points** at the suite's largest (M, K)
— two-population ``d_align`` (over the non-vacuous points; vacuous ones are counted), empirical
misalignment and ``B_exact``.

- ``width-series.html``: those medians against width (log x), one line per revision;
- ``over-training.html``: the same against the revision's training step (parsed from names such
  as ``step1000``; revisions without one are listed and left out of the figures), one line per
  model (labelled with its width; two models of one width, such as Pythia 1b and 1.4b, are two lines).

Both pages end with one table row per (width, revision): width, revision, step, commit, model id,
points, vacuous points, d_align, misalignment, B_exact.
"""

from __future__ import annotations

import html
import math
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

from .._io import atomic_write_text
from .certify_series import check_suite
from .html import render_page, save_figure

__all__ = ["is_suite", "summarize", "write_pages", "PAGES"]

PAGES = ("width-series.html", "over-training.html")


def is_suite(row: Mapping[str, Any]) -> bool:
    return row.get("kind") == "alignment" and row.get("suite") is not None and "revision" in row


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _median(vals: Sequence[Any]) -> float | None:
    xs = [x for x in (_num(v) for v in vals) if x is not None]
    return statistics.median(xs) if xs else None


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
        first = at[0]
        out.append(
            {
                "suite": suite,
                "width": width,
                "revision": rev,
                "step": first.get("step"),
                "commit": first.get("commit"),
                "model_id": model,
                "model": f"{model} (width {_fmt(width)})",
                "points": len({r["point"] for r in at}),
                "vacuous": sum(bool(r.get("two_vacuous")) for r in at),
                "M": mk[0],
                "K": mk[1],
                "d_align": _median([r.get("two_d_align") for r in at]),
                "misalignment": _median([r.get("misalignment") for r in at]),
                "b_exact": _median([r.get("two_b_exact") for r in at]),
            }
        )
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
    esc = html.escape
    head = (
        "<table><tr><th>width</th><th class=l>revision</th><th>step</th><th class=l>commit</th>"
        "<th class=l>model</th><th>points</th><th>vacuous</th><th>M,K</th><th>d_align (median)</th>"
        "<th>misalignment (median)</th><th>B_exact (median)</th></tr>"
    )
    body = [
        f"<tr><td>{_fmt(s['width'])}</td><td class=l>{esc(s['revision'])}</td><td>{_fmt(s['step'])}</td>"
        f"<td class=l>{esc((s['commit'] or '–')[:12])}</td><td class=l>{esc(str(s['model_id']))}</td>"
        f"<td>{s['points']}</td><td>{s['vacuous']}</td><td>{s['M']},{s['K']}</td><td>{_fmt(s['d_align'])}</td>"
        f"<td>{_fmt(s['misalignment'])}</td><td>{_fmt(s['b_exact'])}</td></tr>"
        for s in summary
    ]
    return head + "".join(body) + "</table>"


_QUANTITIES = (
    ("d_align", "d_align (two-population, median over points)", True),
    ("misalignment", "empirical misalignment (median over points)", True),
    ("b_exact", "B_exact (median over points)", True),
)


def _figure(
    summary: Sequence[Mapping[str, Any]], x: str, line: str, out: Path, title: str, caption: str
) -> dict[str, str]:
    from matplotlib.figure import Figure  # Agg canvas, no pyplot global state

    fig = Figure(figsize=(4.2 * len(_QUANTITIES), 3.6))
    lines = list(dict.fromkeys(s[line] for s in summary))
    for i, (col, label, logy) in enumerate(_QUANTITIES):
        ax = fig.add_subplot(1, len(_QUANTITIES), i + 1)
        for name in lines:
            pts = sorted(
                (float(s[x]), s[col]) for s in summary if s[line] == name and s[x] is not None and s[col] is not None
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=_fmt(name))
        xs = [float(s[x]) for s in summary if s[x] is not None]
        if xs and min(xs) <= 0:  # step 0 (initialisation): linear near zero
            ax.set_xscale("symlog", linthresh=1.0)
        else:
            ax.set_xscale("log")
        if logy and any(s[col] is not None and s[col] > 0 for s in summary):
            ax.set_yscale("log")
        ax.set_xlabel(x)
        ax.set_title(label)
        if i == 0 and lines:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    return save_figure(fig, out, title, caption)


def _page(title: str, sections: list[dict[str, Any]], notes: Sequence[str]) -> str:
    return render_page(title, sections, notes=notes, subtitle="model suite: certify runs of existing checkpoints")


def write_pages(rows: Sequence[Mapping[str, Any]], out_dir: str | Path) -> list[Path]:
    """Write ``width-series.html`` and ``over-training.html`` (and their PNGs) into ``out_dir``;
    return their paths ([] when there are no suite rows)."""
    sel = [dict(r) for r in rows if is_suite(r)]
    if not sel:
        return []
    check_suite(sel)
    out_dir = Path(out_dir)
    summary = summarize(sel)
    width_secs, step_secs, notes = [], [], []
    for suite in dict.fromkeys(s["suite"] for s in summary):
        mine = [s for s in summary if s["suite"] == suite]
        slug = "".join(c if c.isalnum() else "-" for c in suite)
        cap = (
            f"Each marker: one checkpoint, the median over its insertion points at (M, K) = "
            f"({mine[0]['M']}, {mine[0]['K']}); d_align over the non-vacuous points."
        )
        fig = _figure(mine, "width", "revision", out_dir / f"suite-{slug}-width.png", f"{suite}: against width", cap)
        width_secs.append(
            {"title": suite, "figures": [fig], "tables": [{"title": "checkpoints", "html": _table(mine)}]}
        )
        stepped = [s for s in mine if s["step"] is not None]
        unstepped = sorted({s["revision"] for s in mine if s["step"] is None})
        if unstepped:
            notes.append(
                f"{suite}: revision(s) {', '.join(unstepped)} name no training step (e.g. step1000): "
                "in the table, not in the figures"
            )
        figs = (
            [_figure(stepped, "step", "model", out_dir / f"suite-{slug}-steps.png", f"{suite}: over training", cap)]
            if stepped
            else []
        )
        step_secs.append({"title": suite, "figures": figs, "tables": [{"title": "checkpoints", "html": _table(mine)}]})
    pages = [out_dir / PAGES[0], out_dir / PAGES[1]]
    atomic_write_text(pages[0], _page("widthscope: width series of the model suite", width_secs, []))
    atomic_write_text(pages[1], _page("widthscope: over training, per width", step_secs, notes))
    return pages
