"""One self-contained HTML page (inline CSS, PNGs as data URIs) from result rows: the findings box,
contents, one section per row kind (:data:`SECTIONS`: a module with ``figures(rows, out_dir)`` and
optionally ``tables(rows)`` and ``summary(rows)``), the claims table and what was measured."""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import html
import importlib
import inspect
import json
import platform
import re
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any, Container, Iterable, Mapping, Sequence

from .._io import atomic_write_text
from .._version import __version__
from ._fmt import interval, natural_key, no_nan, num, p_eq
from ._plot import figure, save_figure, slugify

__all__ = ["SECTIONS", "table", "data_uri", "render_page", "build_report", "collect_sections", "figure_seconds"]

# (section title, module, kinds of rows it handles); a module is imported only when its rows exist
SECTIONS: list[tuple[str, str, tuple[str, ...]]] = [
    ("Alignment width sweep", "widthscope.report.alignment", ("alignment",)),
    ("Alignment over training", "widthscope.report.monitor", ("monitor",)),
    ("Interventions and growth", "widthscope.report.interventions", ("intervention", "growth")),
    ("Growth benchmark", "widthscope.report.growth", ("growth_bench",)),
    ("Linearization", "widthscope.report.linearization", ("linearization", "correlation")),
]

CSS = """
*{box-sizing:border-box}
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#1d2327;background:#fff;
overflow-wrap:anywhere}
header{background:#1f3b57;color:#fff;padding:18px 28px}
header h1{margin:0;font-size:24px;overflow-wrap:anywhere} header p{margin:4px 0 0;opacity:.85;font-size:13px}
main{padding:10px 28px 40px;max-width:1150px}
h2{border-bottom:2px solid #1f3b57;padding-bottom:4px;margin-top:34px}
h3{margin:22px 0 6px;font-size:17px}
.findings{background:#f3f7fb;border:1px solid #c9d6e3;border-radius:6px;padding:4px 18px 10px;margin:14px 0}
.findings h2{margin-top:10px}
.findrow{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
.findtext{flex:1 1 420px;min-width:0} .findtext ul{margin-top:6px} .findtext li{margin:5px 0}
.badge{color:#fff;border-radius:3px;padding:0 6px;font-size:12px;font-weight:bold;white-space:nowrap}
.headline{flex:0 1 380px;max-width:100%;text-decoration:none;color:#444;font-size:12px}
.headline img{width:100%;height:auto;border:1px solid #dde;display:block}
.meaning{font-size:13.5px;line-height:1.45;margin:8px 0}
nav.toc{font-size:14px;margin:8px 0 4px} nav.toc ol{margin:4px 0;padding-left:22px;columns:2 260px}
.verdict{background:#eef5ec;border-left:5px solid #3c8d2f;padding:10px 16px;margin:12px 0}
.verdict li{margin:3px 0}
.note{background:#fff6e0;border-left:5px solid #d9a400;padding:8px 14px;margin:10px 0;font-size:14px}
figure{margin:14px 0 26px} figure img{max-width:100%;height:auto;border:1px solid #dde;display:block}
figcaption{font-size:13px;color:#444;margin-top:5px;max-width:900px}
.tscroll{max-width:100%;overflow-x:auto;margin:8px 0 20px}
table{border-collapse:collapse;font-size:12.5px;overflow-wrap:normal}
th,td{border:1px solid #ccd;padding:3px 7px;text-align:right} th{background:#eef1f5}
td.l,th.l{text-align:left}
pre{overflow-x:auto;max-width:100%}
@media (max-width:600px){header{padding:12px 12px} header h1{font-size:19px} main{padding:6px 12px 30px}
.findings{padding:2px 10px 8px} ul{padding-left:20px}}
"""


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
_SHOWN_IN = (  # claim id prefix -> the alignment figure (suffix of its PNG) that shows it, its section
    ("d_", "d_align", "sec-alignment-width-sweep"),
    ("misalignment_falls_MK", "misalignment-vs-MK", "sec-alignment-width-sweep"),
    ("misalignment", "misalignment-vs-width", "sec-alignment-width-sweep"),
    ("b_", "misalignment-vs-width", "sec-alignment-width-sweep"),
    ("retention", None, "sec-interventions-and-growth"),
    ("corr_", None, "sec-linearization"),
    ("dev_", None, "sec-linearization"),
    ("certify_earlier", None, "sec-alignment-over-training"),
)


def anchor(text: str) -> str:
    """An HTML id from any text (letters, digits and '-')."""
    return re.sub(r"-+", "-", "".join(c if c.isalnum() else "-" for c in str(text))).strip("-").lower() or "x"


def figure_anchor(c: Mapping[str, Any], figure_ids: Sequence[str]) -> str | None:
    """The id of the figure that shows claim ``c`` (or of its section), when the page has one."""
    cid = str(c.get("id"))
    for prefix, suffix, sec in _SHOWN_IN:
        if cid.startswith(prefix):
            fig = anchor(f"fig-{slugify(str(c['group']))}-{suffix}") if suffix and c.get("group") else None
            return fig if fig in figure_ids else sec if sec in figure_ids else None
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
    """The findings box (HTML): a sentence per claim or plain ``lines``, the headline figure
    ``(anchor, data uri, title)`` beside them, then what the numbers mean."""
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


def table(head: Sequence[str], lines: Iterable[Sequence[Any]], *, left: Container[int] = ()) -> str:
    """An HTML table of escaped text, one header row; the columns numbered in ``left`` align left."""

    def row(tag: str, cells: Sequence[Any]) -> str:
        tds = (f"<{tag}{' class=l' if i in left else ''}>{html.escape(str(c))}</{tag}>" for i, c in enumerate(cells))
        return "<tr>" + "".join(tds) + "</tr>"

    return "<table>" + row("th", head) + "".join(row("td", ln) for ln in lines) + "</table>"


def data_uri(png: str | Path) -> str:
    """``data:image/png;base64,...`` of a PNG file (so the page needs no other file)."""
    raw = Path(png).read_bytes()
    if not raw.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError(f"{png} is not a PNG file")
    return "data:image/png;base64," + base64.b64encode(raw).decode("ascii")


def collect_sections(
    rows: Sequence[Mapping[str, Any]], out_dir: str | Path, found: Sequence[Mapping[str, Any]] | None = None
) -> tuple[list[dict], list[str]]:
    """Run every section whose kinds occur in ``rows``; return (sections, notes). A failing or missing
    section module becomes a note; ``found`` goes to a ``summary`` that takes it."""
    out_dir = Path(out_dir)
    kinds = sorted({str(r.get("kind")) for r in rows})
    known = {k for _, _, ks in SECTIONS for k in ks}
    notes = [
        f"{sum(1 for r in rows if str(r.get('kind')) == k)} row(s) of kind {k!r} have no report "
        f"section; they are kept in the results files"
        for k in kinds
        if k not in known
    ]
    sections: list[dict] = []
    for title, modname, ks in SECTIONS:
        sel = [dict(r) for r in rows if r.get("kind") in ks]
        if not sel:
            continue
        try:
            mod = importlib.import_module(modname)
        except ImportError as exc:
            notes.append(
                f"{len(sel)} row(s) of kind {'/'.join(ks)}: report module {modname} is not "
                f"available ({exc}); their numbers are in the results files"
            )
            continue
        sec = {"title": title, "figures": [], "tables": [], "summary": []}
        try:
            if hasattr(mod, "summary"):
                quote = found is not None and "found" in inspect.signature(mod.summary).parameters
                sec["summary"] = list(mod.summary(sel, **({"found": found} if quote else {})))
            sec["figures"] = list(mod.figures(sel, out_dir))
            sec["tables"] = list(mod.tables(sel)) if hasattr(mod, "tables") else []
        except Exception as exc:  # one broken section must not cost the user the whole report
            print(f"widthscope report: section {title!r} failed:\n{traceback.format_exc()}", file=sys.stderr)
            notes.append(f"section {title!r} failed: {type(exc).__name__}: {exc}")
        sections.append(sec)
    return sections, notes


def versions() -> dict[str, str]:
    """widthscope (and its git commit when run from a checkout), Python, torch, transformers."""
    out = {"widthscope": __version__, "python": platform.python_version()}
    here = Path(__file__).resolve().parent
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit, dirty = (
            subprocess.run(["git", *a], cwd=here, capture_output=True, text=True, timeout=5)
            for a in (("rev-parse", "--short", "HEAD"), ("status", "--porcelain", "--untracked-files=no"))
        )
        if commit.returncode == 0 and commit.stdout.strip():
            out["git commit"] = commit.stdout.strip() + (" (with local changes)" if dirty.stdout.strip() else "")
    for mod in ("torch", "transformers", "numpy"):
        with contextlib.suppress(ImportError):
            out[mod] = importlib.import_module(mod).__version__
    return out


def data_descriptions(rows: Sequence[Mapping[str, Any]], source: str = "") -> list[str]:
    """What data one source's rows measured, in words (else their dataset names, or its config's data)."""
    from ..data import describe_name  # noqa: PLC0415  start-up time: torch

    got = list(dict.fromkeys(str(r["data_description"]) for r in rows if r.get("data_description")))
    if not got:  # rows written before the column
        got = [describe_name(n) for n in sorted({str(r["dataset"]) for r in rows if r.get("dataset")})]
    cfg = Path(source) / "linearize_config.json" if source else None
    if not got and cfg is not None and cfg.is_file():
        with contextlib.suppress(OSError, ValueError, AttributeError):
            d = json.loads(cfg.read_text(encoding="utf-8")).get("data", {})
            got.append(
                f"{describe_name(d.get('name'))}: {d.get('n_train', 'all')} train / "
                f"{d.get('n_test', 'all')} held-out examples (split seed {d.get('seed', 0)})"
            )
    return got


def _mean(rows: Sequence[Mapping[str, Any]], key: str) -> str:
    vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return f"{sum(vals) / len(vals):.4g}" if vals else "–"


def provenance(rows: Sequence[Mapping[str, Any]], sources: Sequence[str]) -> str:
    """HTML: what each source measured — its data, config, training steps and final losses."""
    esc = html.escape
    parts = ['<section id="measured"><h2>What was measured</h2>']
    parts.append("<p>" + " · ".join(f"{esc(k)} {esc(v)}" for k, v in versions().items()) + "</p>")
    by_source: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by_source[str(r.get("source", ""))].append(r)
    for src in sources:
        rs = by_source.get(src, [])
        kinds = sorted({str(r.get("kind")) for r in rs})
        data = "; ".join(data_descriptions(rs, src)) or "not recorded in the rows"
        parts.append(f"<h3>{esc(src)}</h3><p>{len(rs)} rows ({esc(', '.join(kinds))}); data: {esc(data)}</p>")
        probes = dict.fromkeys(
            f"{r['probe_set']}"
            + (f" (length {r['probe_seq_len']})" if r.get("probe_seq_len") is not None else "")
            + f": {r.get('probe_description') or r.get('probe_data')}"
            for r in rs
            if r.get("probe_set") is not None
        )
        if probes:
            items = "".join(f"<li>{esc(p)}</li>" for p in probes)
            parts.append(
                f"<p>probe conditions (each reported separately, never averaged together):</p><ul>{items}</ul>"
            )
        groups: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
        for r in rs:
            if r.get("kind") == "alignment" and r.get("width") is not None:
                groups[(r.get("family") or r.get("model"), r.get("width"))].append(r)
        if groups:
            head = ("family", "width", "seeds", "training steps", "final train loss", "final held-out loss")
            lines = []
            for (fam, width), g in sorted(groups.items(), key=lambda kv: (natural_key(kv[0][0]), float(kv[0][1]))):
                steps = ", ".join(map(str, sorted({r["steps"] for r in g if r.get("steps") is not None}))) or "–"
                seeds = len({r["seed"] for r in g if r.get("seed") is not None})
                lines.append((fam, width, seeds, steps, _mean(g, "train_loss"), _mean(g, "test_loss")))
            parts.append(table(head, lines, left={0}))
        cfg = Path(src) / "sweep.json"
        if cfg.is_file():
            try:
                text = json.dumps(json.loads(cfg.read_text(encoding="utf-8")).get("config", {}), indent=1)
            except (OSError, ValueError):
                text = "(unreadable sweep.json)"
            parts.append(f"<details><summary>config ({esc(str(cfg))})</summary><pre>{esc(text)}</pre></details>")
    parts.append("</section>")
    return "\n".join(parts)


def _figure_id(fig: Mapping[str, Any]) -> str:
    return anchor("fig-" + Path(str(fig.get("png", fig.get("title", "")))).stem)


def render_page(
    title: str,
    sections: Sequence[Mapping[str, Any]],
    *,
    notes: Sequence[str] = (),
    subtitle: str = "",
    found: Sequence[Mapping[str, Any]] | None = None,
    findings: Sequence[str] = (),
    after: str = "",
    headline: bool = True,
) -> str:
    """The HTML text: header, findings box (claims ``found`` or plain ``findings``), contents, notes,
    then each section's verdict, figures and tables; ``after`` (HTML) follows."""
    esc = html.escape
    fig_ids = [_figure_id(f) for sec in sections for f in sec.get("figures", [])]
    sec_ids = ["sec-" + anchor(sec["title"]) for sec in sections]
    first = next((f for sec in sections for f in sec.get("figures", [])), None) if headline else None
    top = None if first is None else (_figure_id(first), data_uri(first["png"]), str(first["title"]))
    box = findings_box(list(found or []), fig_ids + sec_ids, lines=findings, headline=top)
    entries = [("findings", "Findings")] + [(i, str(sec["title"])) for i, sec in zip(sec_ids, sections)]
    entries += [(m.group(1), html.unescape(m.group(2))) for m in _SECTION_HEAD.finditer(after)]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f"<header><h1>{esc(title)}</h1><p>{esc(subtitle)}</p></header><main>",
        box,
        '<nav class="toc"><b>Contents</b><ol>'
        + "".join(f'<li><a href="#{esc(a)}">{esc(t)}</a></li>' for a, t in entries)
        + "</ol></nav>",
    ]
    for n in notes:
        parts.append(f'<div class="note">{esc(no_nan(n))}</div>')
    if not sections:
        parts.append('<div class="note">No rows with a report section were found.</div>')
    for sec, sid in zip(sections, sec_ids):
        parts.append(f'<section id="{sid}"><h2>{esc(sec["title"])}</h2>')
        if sec.get("summary"):
            parts.append('<div class="verdict"><b>Verdict</b><ul>')
            parts += [f"<li>{esc(no_nan(s))}</li>" for s in sec["summary"]]
            parts.append("</ul></div>")
        for fig in sec.get("figures", []):
            parts.append(
                f'<figure id="{_figure_id(fig)}"><h3>{esc(fig["title"])}</h3>'
                f'<img src="{data_uri(fig["png"])}" alt="{esc(fig["title"])}">'
                f"<figcaption>{esc(no_nan(fig.get('caption', '')))}</figcaption></figure>"
            )
        for tab in sec.get("tables", []):
            parts.append(f"<h3>{esc(tab['title'])}</h3>{scrolling(no_nan(tab['html'], markup=True))}")
        parts.append("</section>")
    if after:
        parts.append(scrolling(no_nan(after, markup=True)))
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


_SECTION_HEAD = re.compile(r'<section id="([^"]+)"><h2>([^<]+)</h2>')


def scrolling(markup: str) -> str:
    """Every ``<table>`` in ``markup`` inside a box that scrolls sideways."""
    return re.sub(r"<table\b", '<div class="tscroll"><table', markup).replace("</table>", "</table></div>")


def build_report(
    rows: Sequence[Mapping[str, Any]],
    out_dir: str | Path,
    *,
    title: str = "widthscope report",
    sources: Sequence[str] = (),
    notes: Sequence[str] = (),
) -> Path:
    """Write the PNGs and ``report.html`` (``notes`` at its head) into ``out_dir``; return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from .claims import ALPHA, claims, html_table  # noqa: PLC0415  start-up time: scipy

    try:
        found = claims(rows)
    except Exception as exc:  # like a section: a failed claims page must not cost the user the report
        print(f"widthscope report: claims page failed:\n{traceback.format_exc()}", file=sys.stderr)
        found, notes = [], list(notes) + [f"claims page failed: {type(exc).__name__}: {exc}"]
    sections, more = collect_sections(rows, out_dir, found or None)
    measured = provenance(rows, sorted({str(r.get("source", "")) for r in rows}, key=natural_key))
    notes = list(notes) + more
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    subtitle = f"{len(rows)} rows from {', '.join(sources) or 'memory'} · generated {stamp}"
    page = out_dir / "report.html"
    claims_html = ""
    if found:
        m = found[0].get("family_size", 0)
        claims_html = (
            '<section id="claims"><h2>Claims</h2>'
            "<p>One row per published claim, computed from the rows (never typed in). Measured: the "
            "seed mean of a per-seed value; interval: 95% Student t "
            f"over seeds ({seeds_phrase(found)}); p: the test that the "
            "interval lies inside (holds) or outside (does not) the claimed region. Verdicts are "
            f"corrected by Holm over the page's {m} tested claims (family-wise error &le; {ALPHA:g} "
            "under any dependence between claims, which share models; Benjamini&ndash;Hochberg would "
            "control only the expected share of false verdicts). Bounds are tested per row against "
            "the binomial count of the resampled draws; vacuous rows (bound &ge; 1) and missing values "
            "are counted apart, never as support. Seeds for 80% power: how many seeds would give "
            "80% power to resolve the claim at the observed seed spread and effect (level 0.05/m). Without a "
            "width trend the rule decides in the nominal 5% of simulated pages (2&ndash;10 seeds, "
            "normal and heavy-tailed noise; benchmarks/claims_calibration.py).</p>" + html_table(found) + "</section>"
        )
    atomic_write_text(
        page,
        render_page(title, sections, notes=notes, subtitle=subtitle, found=found, after=claims_html + "\n" + measured),
    )
    return page


def figure_seconds(out_dir: str | Path, repeats: int = 3) -> tuple[float, float]:
    """(the first, the median of the next ``repeats``) seconds to draw, save and embed one figure of the
    report's size (five curves with error bars on a log axis); the first pays matplotlib's import."""
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        fig, ax = figure(1, 2)
        for k in range(5):
            for a in ax[0]:
                a.errorbar([8, 16, 32, 64, 128], [k + j * 0.1 for j in range(5)], yerr=0.1, marker="o", label=f"{k}")
                a.set_xscale("log")
                a.legend()
        path = Path(out_dir) / f"timed-{i}.png"
        save_figure(fig, path, "a timed figure", suptitle=True)
        data_uri(path)
        times.append(time.perf_counter() - t0)
    rest = sorted(times[1:])
    return times[0], rest[len(rest) // 2]
