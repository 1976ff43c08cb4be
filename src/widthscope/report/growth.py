"""Report section for the growth benchmark (rows ``kind="growth_bench"``, :mod:`widthscope.grow_bench`).

* a table per budget: Spearman correlation of each criterion with the realised held-out gain,
  top-1 hit rate and regret (best realised gain − gain at the chosen point), with seed-bootstrap
  95% intervals, per model and overall, beside the baselines (random, last, middle, grow everywhere);
* a figure: regret and Spearman per model and criterion (long budget), intervals as bars;
* a figure: realised gain against each point's position, one line per (model, seed).

Example::

    from widthscope.report.growth import write_report
    write_report(rows, table, "/tmp/gb")    # -> [comparison.md, growth_regret.png, growth_gains.png]
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from .._io import atomic_write_text
from .html import save_figure

__all__ = ["figures", "tables", "summary", "markdown_table", "compact_table", "write_report"]

SHOWN = ("bias", "block", "gradmax", "certified", "line_search", "block_d_align", "random", "last", "middle", "oracle")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _f(v: Any, spec: str = ".3f") -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    from ..grow_bench import compare

    return compare(rows)


def markdown_table(table: Sequence[Mapping[str, Any]], budget: str = "long", *, models: Sequence[str] | None = None,
                   shown: Sequence[str] = SHOWN) -> str:
    """A markdown table: one row per (model, criterion), ``mean [lo, hi]`` per metric."""
    sel = [r for r in table if r["budget"] == budget and r["criterion"] in shown
           and (models is None or r["model"] in models)]
    lines = ["| model | criterion | Spearman | top-1 hit | regret (loss units) | regret / (best − worst) | cost (block steps) | seeds |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sel:
        iv = {m: f"{_f(r[m], spec)} [{_f(r[m + '_lo'], spec)}, {_f(r[m + '_hi'], spec)}]"
              for m, spec in (("spearman", ".2f"), ("hit", ".2f"), ("regret", ".4f"), ("norm_regret", ".2f"))}
        if r["criterion"] in ("random", "last", "middle", "oracle"):
            iv["spearman"] = "(0)" if r["criterion"] == "random" else ("(1)" if r["criterion"] == "oracle" else "–")
        if r["model"] == "overall":
            iv["regret"] = "(mixed units)"
        lines.append(f"| {r['model']} | {r['criterion']}{' (baseline)' if r['baseline'] else ''} | {iv['spearman']} | "
                     f"{iv['hit']} | {iv['regret']} | {iv['norm_regret']} | {r['cost_steps']:.0f} | {r['n_seeds']} |")
    return "\n".join(lines) + "\n"


def compact_table(table: Sequence[Mapping[str, Any]], budget: str = "long", *, shown: Sequence[str] = SHOWN) -> str:
    """One markdown row per criterion: overall Spearman, hit and regret/spread [95%], then per model
    ``regret/spread (hits)``: the page-sized view used in docs/interventions.md."""
    sel = [r for r in table if r["budget"] == budget]
    models = list(dict.fromkeys(r["model"] for r in sel if r["model"] != "overall"))
    by = {(r["model"], r["criterion"]): r for r in sel}
    head = ["criterion", "Spearman (overall)", "top-1 hit (overall)", "regret/spread (overall)", *models]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in shown:
        o = by.get(("overall", c))
        if o is None:
            continue
        sp = ("–" if c in ("last", "middle") else "(0)" if c == "random" else "(1)" if c == "oracle" else
              f"{_f(o['spearman'], '.2f')} [{_f(o['spearman_lo'], '.2f')}, {_f(o['spearman_hi'], '.2f')}]")
        cells = [f"**{c}**" if not o["baseline"] else f"{c} (baseline)", sp, f"{_f(o['hit'], '.2f')}",
                 f"{_f(o['norm_regret'], '.2f')} [{_f(o['norm_regret_lo'], '.2f')}, {_f(o['norm_regret_hi'], '.2f')}]"]
        for m in models:
            r = by[(m, c)]
            cells.append(f"{_f(r['norm_regret'], '.2f')} ({r['hit'] * r['n_seeds']:.0f}/{r['n_seeds']})"
                         if c != "random" else f"{_f(r['norm_regret'], '.2f')} ({r['hit']:.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def tables(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``[{"title", "html"}]``: the comparison table per budget (HTML, escaped)."""
    import html

    table = _table(rows)
    out = []
    for budget in ("long", "short"):
        md = markdown_table(table, budget).strip().splitlines()
        head = [c.strip() for c in md[0].strip("|").split("|")]
        body = [[c.strip() for c in ln.strip("|").split("|")] for ln in md[2:]]
        h = ["<table><thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr></thead><tbody>"]
        h += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body]
        h.append("</tbody></table>")
        out.append({"title": f"Growth criteria vs realised gain ({budget} budget; mean [95% seed-bootstrap])",
                    "html": "".join(h)})
    return out


def summary(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from ..grow_bench import winner

    table = _table(rows)
    out = []
    for budget in ("long", "short"):
        w = winner(table, budget)
        ov = {r["criterion"]: r for r in table if r["model"] == "overall" and r["budget"] == budget}
        out.append(f"{budget} budget: lowest overall regret/spread gain {w} ({ov[w]['norm_regret']:.2f}; last block "
                   f"{ov['last']['norm_regret']:.2f}, random {ov['random']['norm_regret']:.2f}, bias "
                   f"{ov['bias']['norm_regret']:.2f})")
    return out


def figures(rows: Sequence[Mapping[str, Any]], out_dir: str | Path, table: Sequence[Mapping[str, Any]] | None = None
            ) -> list[dict[str, str]]:
    import numpy as np

    plt = _plt()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = list(table) if table is not None else _table(rows)
    models = list(dict.fromkeys(r["model"] for r in table if r["model"] != "overall")) + ["overall"]
    crits = [c for c in SHOWN if c != "oracle"]
    figs = []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = plt.get_cmap("tab10")
    width = 0.8 / len(crits)
    for k, (metric, ax) in enumerate(zip(("norm_regret", "spearman"), axes)):
        for j, c in enumerate(crits):
            if metric == "spearman" and c in ("random", "last", "middle"):
                continue
            rs = {r["model"]: r for r in table if r["budget"] == "long" and r["criterion"] == c}
            x = np.arange(len(models)) + (j - len(crits) / 2) * width
            y = np.array([rs[m][metric] for m in models], dtype=float)
            lo = np.array([rs[m][f"{metric}_lo"] for m in models], dtype=float)
            hi = np.array([rs[m][f"{metric}_hi"] for m in models], dtype=float)
            ax.bar(x, y, width, color=colors(j), label=c, yerr=np.vstack([np.clip(y - lo, 0, None), np.clip(hi - y, 0, None)]),
                   error_kw={"elinewidth": 0.7})
        ax.set_xticks(np.arange(len(models)))
        ax.set_xticklabels(models, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("regret / (best − worst) (lower is better)" if metric == "norm_regret" else "Spearman with realised gain")
        ax.axhline(0, color="k", lw=0.6)
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    figs.append(save_figure(fig, out_dir / "growth_regret.png", "Growth criteria: regret and rank correlation",
                            "Long budget. Regret = best realised held-out gain minus the gain at the point the "
                            "criterion picks, divided by best minus worst gain (0 = best point, 1 = worst); bars: mean over seeds (overall: mean over "
                            "the models without a known answer), whiskers: 95% seed-bootstrap interval."))
    plt.close(fig)
    units: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("kind") == "growth_bench":
            units.setdefault((r["model"], int(r["seed"])), []).append(r)
    names = list(dict.fromkeys(m for m, _ in units))
    fig, axes = plt.subplots(1, len(names), figsize=(2.6 * len(names), 3), squeeze=False)
    for ax, m in zip(axes[0], names):
        for (m2, s), rs in units.items():
            if m2 != m:
                continue
            rs = sorted(rs, key=lambda r: r["point_index"])
            ax.plot([r["point_index"] for r in rs], [r["gain_long"] for r in rs], "o-", ms=3, lw=1, label=f"s{s}")
        ax.set_title(m, fontsize=9)
        ax.set_xlabel("point index (last = last block)", fontsize=8)
    axes[0][0].set_ylabel("realised gain (nats)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    figs.append(save_figure(fig, out_dir / "growth_gains.png", "Realised gain per point",
                            "Held-out loss decrease after the long block-training budget, per point and seed."))
    plt.close(fig)
    return figs


def write_report(rows: Sequence[Mapping[str, Any]], table: Sequence[Mapping[str, Any]], out_dir: str | Path
                 ) -> list[Path]:
    """``comparison.md`` (both budgets) and the two PNG figures in ``out_dir``."""
    out_dir = Path(out_dir)
    text = "".join(f"## {b} budget\n\n{compact_table(table, b)}\n{markdown_table(table, b)}\n"
                   for b in ("long", "short"))
    paths = [atomic_write_text(out_dir / "comparison.md", text)]
    paths += [Path(f["png"]) for f in figures(rows, out_dir, table)]
    return paths
