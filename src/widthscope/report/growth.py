"""Report section for the growth benchmark (``kind="growth_bench"``, :mod:`widthscope.growth.bench`):
the practitioner's table, the criteria table, the README sentence and figures of regret, Spearman and
realised gain per point (``benchmarks/growth_summary.py`` checks the docs' copies against them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .._io import atomic_write_text
from ._fmt import interval, num
from ._plot import figure, save_figure, yerr
from .html import table as html_table

SHOWN = tuple("bias block gradmax certified line_search block_d_align random last middle oracle ceiling".split())


def iv(r: Mapping[str, Any], m: str, spec: str) -> str:
    """'0.12 [0.05, 0.19]': ``r[m]`` and its 95% interval (``m_lo``, ``m_hi``)."""
    return f"{num(r.get(m), spec)} {interval(r.get(m + '_lo'), r.get(m + '_hi'), spec)}"


def _hits(r: Mapping[str, Any]) -> str:
    if "hit_count" not in r:
        return "–"
    return f"{r['hit_count']:.0f}/{r['n_seeds']} {interval(r['hit_lo'], r['hit_hi'], '.2f')}"


def _cmp(table: Sequence[Mapping[str, Any]]) -> tuple[dict[tuple, Mapping[str, Any]], list[str]]:
    """The long-budget comparison rows by (model, criterion), and the models (without "overall")."""
    sel = [r for r in table if r.get("kind", "growth_compare") == "growth_compare" and r["budget"] == "long"]
    models = list(dict.fromkeys(r["model"] for r in sel if r["model"] != "overall"))
    return {(r["model"], r["criterion"]): r for r in sel}, models


def _md(head: Sequence[str], lines: Sequence[Sequence[Any]]) -> str:
    """A markdown table: the header row, its rule, one row per line."""
    rows = ["| " + " | ".join(map(str, r)) + " |" for r in (head, *lines)]
    return "\n".join([rows[0], "|" + "---|" * len(head), *rows[1:]]) + "\n"


def _criteria(table: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """(header, lines): per (model, criterion), ``mean [95% interval]`` over model seeds of every metric."""
    head = ["model", "criterion", "Spearman", "top-1 hits [Wilson]", "regret / (best − worst)"]
    head += ["gain at pick (nats)", "continue, same FLOPs", "grow + train all, same FLOPs", "gain − continue"]
    lines = []
    for (m, c), r in _cmp(table)[0].items():
        if c not in SHOWN:
            continue
        sp = "(0)" if c == "random" else ("–" if c in ("last", "middle") else iv(r, "spearman", ".2f"))
        lines.append(
            [m, c + (" (baseline)" if r["baseline"] else ""), sp, _hits(r), iv(r, "norm_regret", ".2f")]
            + [iv(r, k, ".4f") for k in ("gain", "continue", "train_all", "advantage")]
            + [r["n_seeds"], f"{r.get('ties', 0)} / {r.get('nan', 0)}"]
        )
    return head + ["seeds", "ties / NaN"], lines


def compact_table(table: Sequence[Mapping[str, Any]]) -> str:
    """One markdown row per criterion: overall Spearman and normalised regret [95%], whether it beats
    random/last/middle (paired intervals), then per model ``regret/spread (hits)``."""
    by, models = _cmp(table)
    paired = {
        (r["criterion"], r["versus"]): r for r in table if r.get("kind") == "growth_paired" and r["budget"] == "long"
    }
    head = ["criterion", "Spearman (natural models)", "regret/spread (natural)", "beats random / last / middle"]
    lines = []
    for c in SHOWN:
        o = by.get(("overall", c))
        if o is None:
            continue
        sp = "–" if c in ("last", "middle") else "(0)" if c == "random" else iv(o, "spearman", ".2f")
        beats = "–"
        if (c, "random") in paired:
            beats = " / ".join("yes" if paired[(c, b)]["beats"] else "no" for b in ("random", "last", "middle"))
        cells = [f"**{c}**" if not o["baseline"] else f"{c} (baseline)", sp]
        cells += ["–" if c == "ceiling" else iv(o, "norm_regret", ".2f"), beats]
        for m in models:
            r = by[(m, c)]
            if c == "ceiling":
                cells.append(f"ρ {num(r['spearman'], '.2f')}")
            elif c == "random":
                cells.append(f"{num(r['norm_regret'], '.2f')} ({num(r['hit'], '.2f')})")
            else:
                cells.append(f"{num(r['norm_regret'], '.2f')} ({r.get('hit_count', 0):.0f}/{r['n_seeds']})")
        lines.append(cells)
    return _md(head + models, lines)


def practitioner_table(table: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]], default: str) -> str:
    """Per model: gains of growing vs training longer at the same FLOPs (mean over model seeds [95%])."""
    by, models = _cmp(table)
    head = ["model", "base held-out loss", "continue training (same FLOPs)", "grow last block"]
    head += ["grow at oracle point (A→B)", f"grow at `{default}` pick", "grow last + train all"]
    lines = []
    for m in models:
        bench = [r for r in rows if r.get("kind") == "growth_bench" and r["model"] == m]
        base = [r["loss_before"] for r in bench if r["point_index"] == 0]
        last, orc, dfl, ceil = by[(m, "last")], by[(m, "oracle")], by[(m, default)], by[(m, "ceiling")]
        lines.append(
            [m, f"{sum(base) / len(base):.4f}", iv(last, "continue", ".4f"), iv(last, "gain", ".4f")]
            + [iv(orc, "gain", ".4f"), iv(dfl, "gain", ".4f"), iv(last, "train_all", ".4f")]
            + [iv(ceil, "spearman", ".2f"), last["n_seeds"]]
        )
    return _md(head + ["reproducibility ceiling ρ (block seeds)", "seeds"], lines)


def readme_sentence(
    table: Sequence[Mapping[str, Any]],
    default: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
) -> str:
    """The README's growth bullet; every number and every verdict word from ``table``/``rows``
    (a verdict "better"/"worse" only where the 95% interval over model seeds excludes 0)."""
    by, _ = _cmp(table)
    models = [m for (m, c) in by if c == "last" and m != "overall"]
    nat = [m for m in models if not by[(m, "last")]["known_answer"]]
    planted = [m for m in models if by[(m, "last")]["known_answer"]]
    o_last, o_orc, ceil = by[("overall", "last")], by[("overall", "oracle")], by[("overall", "ceiling")]
    adv = {m: by[(m, "oracle")] for m in nat}
    better = [m for m in nat if adv[m]["advantage_lo"] > 0]
    worse = [m for m in nat if adv[m]["advantage_hi"] < 0]
    d = by[("overall", default["criterion"])]
    seeds = sorted({by[(m, "last")]["n_seeds"] for m in models})
    bseeds = sorted({len(r["gain_long_seeds"]) for r in rows if r.get("kind") == "growth_bench"})
    head = (
        f"growing at the best point beats training the original model longer on {len(better)} of {len(nat)} "
        f"trained models, and {'a criterion beats' if default['beats_simple_rules'] else 'no criterion beats'} "
        "the simple rules"
    )
    parts = [
        f"- **Where to grow: {head}.** Grown at every point of {', '.join(nat)} (trained to a plateau; "
        f"{'/'.join(map(str, seeds))} model seeds, {'/'.join(map(str, bseeds))} block seeds, learning rate "
        "chosen per point on a split that does not score), the best point (the oracle: chosen on one evaluation "
        f"split, scored on another) gains {num(min(a['advantage'] for a in adv.values()), '+.4f')} to "
        f"{num(max(a['advantage'] for a in adv.values()), '+.4f')} nats more than training the original "
        f"model for the same FLOPs (better with 95% confidence on {', '.join(better) or 'none'}; worse on "
        f"{', '.join(worse) or 'none'}); growing the last block gains {iv(o_last, 'advantage', '+.4f')} "
        f"more, grow-then-train-all {iv(o_last, 'all_vs_continue', '+.4f')} (mean over models [95%]).",
        f"Regrowing with another block seed reproduces the order of the points to Spearman "
        f"{iv(ceil, 'spearman', '.2f')}; the oracle's choice on the other split has regret/spread "
        f"{iv(o_orc, 'norm_regret', '.2f')}.",
        f"`grow`'s default `{default['grow_name']}`: regret/spread {iv(d, 'norm_regret', '.2f')} vs random "
        f"{num(by[('overall', 'random')]['norm_regret'], '.2f')} and last block {iv(o_last, 'norm_regret', '.2f')}"
        + (
            ""
            if default["beats_simple_rules"]
            else " (no criterion beats random, last and middle, so the default is the cheapest that finds the "
            "most planted blocks)"
        )
        + "; planted blocks found: "
        + ", ".join(
            f"{m} {by[(m, default['criterion'])].get('hit_count', 0):.0f}/{by[(m, default['criterion'])]['n_seeds']}"
            for m in planted
        )
        + ".",
    ]
    return " ".join(parts) + " ([interventions](docs/interventions.md) §5)\n"


def tables(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``[{"title", "html"}]``: the criteria table (HTML, escaped)."""
    from ..growth.compare import compare  # noqa: PLC0415  start-up time: torch

    return [
        {
            "title": "Growth criteria vs realised gain and the equal-compute baselines (mean [95% over model seeds])",
            "html": html_table(*_criteria(compare(rows))),
        }
    ]


def summary(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from ..growth.compare import compare, winner  # noqa: PLC0415  start-up time: torch

    table = compare(rows)
    return [readme_sentence(table, winner(table), rows).strip().removeprefix("- ")]


def figures(
    rows: Sequence[Mapping[str, Any]], out_dir: str | Path, table: Sequence[Mapping[str, Any]] | None = None
) -> list[dict[str, str]]:
    """Regret and Spearman per model and criterion, and realised gain per point (PNGs in ``out_dir``)."""
    from ..growth.compare import compare  # noqa: PLC0415  start-up time: torch

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    by, models = _cmp(list(table) if table is not None else compare(rows))
    models += ["overall"]
    crits = [c for c in SHOWN if c not in ("oracle", "ceiling")]
    fig, ((ax0, ax1),) = figure(1, 2, w=6, h=4.2)
    width = 0.8 / len(crits)
    ylabels = ("regret / (best − worst) (lower is better)", "Spearman with realised gain")
    for metric, ax, ylabel in zip(("norm_regret", "spearman"), (ax0, ax1), ylabels):
        for j, c in enumerate(crits):
            if metric == "spearman" and c in ("random", "last", "middle"):
                continue
            x = np.arange(len(models)) + (j - len(crits) / 2) * width
            y, lo, hi = ([by[(m, c)][metric + end] for m in models] for end in ("", "_lo", "_hi"))
            ax.bar(x, y, width, color=f"C{j % 10}", label=c, yerr=yerr(y, lo, hi), error_kw={"elinewidth": 0.7})
        ax.set_xticks(np.arange(len(models)))
        ax.set_xticklabels(models, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.axhline(0, color="k", lw=0.6)
    ax0.legend(fontsize=7, ncol=2)
    regret = save_figure(
        fig,
        out_dir / "growth_regret.png",
        "Growth criteria: regret and rank correlation",
        "Regret = best realised held-out gain minus the gain at the point the criterion picks, "
        "divided by best minus worst gain (0 = best point, 1 = worst); bars: mean over model "
        "seeds (overall: mean over the models without a planted answer), whiskers: 95% t "
        "interval over model seeds.",
    )
    units: dict[str, dict[int, list[Mapping[str, Any]]]] = {}
    for r in rows:
        if r.get("kind") == "growth_bench":
            units.setdefault(r["model"], {}).setdefault(int(r["seed"]), []).append(r)
    fig, axes = figure(1, len(units), w=2.6, h=3)
    for ax, (m, seeds) in zip(axes[0], units.items()):
        for s, unit in seeds.items():
            seq = sorted(unit, key=lambda r: r["point_index"])
            (line,) = ax.plot(*zip(*((r["point_index"], r["gain_long"]) for r in seq)), "o-", ms=3, lw=1, label=f"s{s}")
            ax.axhline(seq[-1]["gain_continue_long"], color=line.get_color(), ls=":", lw=0.8)
        ax.set_title(m, fontsize=9)
        ax.set_xlabel("point index (last = last block)", fontsize=8)
    axes[0][0].set_ylabel("realised gain (nats)")
    axes[0][0].legend(fontsize=7)
    gains = save_figure(
        fig,
        out_dir / "growth_gains.png",
        "Realised gain per point",
        "Held-out loss decrease after the block-training budget, per point and model seed (mean "
        "over 3 block seeds); dotted: training the original model for the FLOPs of growing at the "
        "last block.",
    )
    return [regret, gains]


def write_report(
    rows: Sequence[Mapping[str, Any]], table: Sequence[Mapping[str, Any]], out_dir: str | Path
) -> list[Path]:
    """``comparison.md`` and the two PNG figures in ``out_dir``."""
    from ..growth.compare import winner  # noqa: PLC0415  start-up time: torch

    out_dir = Path(out_dir)
    w = winner(table)
    text = (
        f"# Growth benchmark\n\n{readme_sentence(table, w, rows)}\n## Growing vs training longer\n\n"
        f"{practitioner_table(table, rows, w['criterion'])}\n## Criteria\n\n{compact_table(table)}\n"
        f"{_md(*_criteria(table))}"
    )
    paths = [atomic_write_text(out_dir / "comparison.md", text)]
    paths += [Path(f["png"]) for f in figures(rows, out_dir, table)]
    return paths
